"""`benchmarks pretrain_fidelity` at a tiny size, in this process: the docstrings of
Python's `json` package, a 2-layer ModernBERT, 6 steps of each side; the corpus reaches
bertjax (its text reader, sentence split, tokenizer, 'stream' packing) and the PyTorch
loop (transformers' tokenizer of the same text) as the same tokens; both models are
scored by the same code on the same masked rows."""

import os
import sysconfig

import flax.linen as nn
import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("optimi")

from benchmarks import docstrings, pretrain_fidelity as pf  # pylint: disable=wrong-import-position
from bertjax import model as model_lib  # pylint: disable=wrong-import-position
from bertjax.data import builders, pipeline, sources  # pylint: disable=wrong-import-position
from bertjax.data import tokenizer as tok_lib  # pylint: disable=wrong-import-position
from bertjax import objectives  # pylint: disable=wrong-import-position
from configs import bert_tiny, modernbert_tiny  # pylint: disable=wrong-import-position

T = 32


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """The corpus, the shared tokenizer and a tiny recipe."""
  directory = str(tmp_path_factory.mktemp("pretrain_fidelity"))
  documents = docstrings.documents([os.path.join(sysconfig.get_paths()["stdlib"], "json")])
  corpus = pf.write_corpus(directory, documents, 0.2)
  c = modernbert_tiny.get_config()
  c.data.tokenizer.vocab_size = 400
  corpus["tokenizer"] = pf.train_tokenizer(c, corpus["train"], directory)
  c.model.vocab_size = tok_lib.load_tokenizer(corpus["tokenizer"]["bertjax"]).vocab_size
  c.model.hidden_size, c.model.num_layers, c.model.num_heads = 32, 2, 2
  c.model.intermediate_size, c.model.local_attention = 48, 8
  c.data.max_seq_length = T
  c.data.max_predictions_per_seq = 5
  c.train.batch_size = 8
  return directory, corpus, c


@pytest.fixture(scope="module")
def lines_corpus(setup, tmp_path_factory):
  """The same docstrings as documents of several lines (--layout=lines)."""
  directory = str(tmp_path_factory.mktemp("pretrain_fidelity_lines"))
  documents = docstrings.documents([os.path.join(sysconfig.get_paths()["stdlib"], "json")],
                                   "lines")
  return pf.write_corpus(directory, documents, 0.2)


def _rows(path, tokenizer, line_breaks):
  """bertjax's 'stream' rows of the text file `path`."""
  docs = builders.tokenize_documents(sources.load_documents(path, line_breaks=line_breaks),
                                     tokenizer, line_breaks)
  return builders.create_packed_examples(docs, tokenizer, max_seq_length=T,
                                         packing="stream").input_ids


def test_both_sides_get_the_same_tokens(setup, lines_corpus):
  """bertjax's 'stream' rows of the training documents are the loop's rows: of
  one-line documents with either line_breaks; of documents of several lines with
  line_breaks='apart' (each line tokenized alone, as the loop does), while 'space'
  gives the rows of their running text (--held_out_text 'running') and differs from
  the loop's at the lines' first words: what a model is scored on decides which wins."""
  _, corpus, _ = setup
  tok = tok_lib.load_tokenizer(corpus["tokenizer"]["bertjax"])
  hf_tok = transformers.AutoTokenizer.from_pretrained(corpus["tokenizer"]["hf"])
  theirs = pf.stream_rows(pf.read_documents(corpus["train"]), hf_tok, T)
  assert len(theirs) > 20
  for line_breaks in sources.LINE_BREAKS:
    ours = _rows(corpus["train"], tok, line_breaks)
    np.testing.assert_array_equal(ours[:len(theirs)], theirs)
  documents = pf.read_documents(lines_corpus["train"])
  assert np.mean([d.count("\n") for d in documents]) > 2
  theirs = pf.stream_rows(documents, hf_tok, T)
  ours = _rows(lines_corpus["train"], tok, "apart")
  np.testing.assert_array_equal(ours[:len(theirs)], theirs)
  running = [t for ids in pf.running_text(documents, hf_tok) for t in ids]
  ours = _rows(lines_corpus["train"], tok, "space")
  np.testing.assert_array_equal(ours[:, 1:-1].reshape(-1)[:len(running) // 8],
                                running[:len(running) // 8])
  assert (ours[:len(theirs)] != theirs).any()


def test_held_out_rows(setup, lines_corpus):
  """--held_out_rows: each document alone, or all back to back in the loop's rows;
  the texts of HELD_OUT_TEXTS differ on documents of several lines."""
  _, corpus, c = setup
  hf_tok = transformers.AutoTokenizer.from_pretrained(corpus["tokenizer"]["hf"])
  documents = pf.read_documents(lines_corpus["held_out"])
  rows = {(r, t): pf.eval_rows(documents, hf_tok, T, hf_tok.mask_token_id,
                               c.model.vocab_size, r, t)
          for r in ("documents", "packed") for t in pf.HELD_OUT_TEXTS}
  for text in pf.HELD_OUT_TEXTS:
    ids = pf.HELD_OUT_TEXTS[text](documents, hf_tok)
    packed = rows["packed", text]
    assert sum(len(b["input_ids"]) for b in packed) == -(-sum(map(len, ids)) // (T - 2))
    assert all(b["attention_mask"][:-1].all() for b in packed[:-1])  # Full rows.
    alone = rows["documents", text]
    assert sum(len(b["input_ids"]) for b in alone) == sum(-(-len(x) // (T - 2)) for x in ids)
  first = {t: rows["documents", t][0]["input_ids"] for t in pf.HELD_OUT_TEXTS}
  assert first["lines"].shape != first["running"].shape or (
      first["lines"] != first["running"]).any()


def test_every_arm_is_a_valid_config_that_changes_what_it_names(setup):
  """Each bertjax_<variant> arm sets fields the recipe has, to other values, and the
  result passes bertjax's checks."""
  _, corpus, c = setup
  base = pf.arm_config(c, 6, "bertjax", corpus["train"], corpus["tokenizer"]["bertjax"], 0)
  for arm in pf.ARMS:
    config = pf.arm_config(c, 6, arm, corpus["train"], corpus["tokenizer"]["bertjax"], 0)
    changed = pf.VARIANTS.get(arm.removeprefix("bertjax_"), {})
    for k, v in changed.items():
      section, field = k.split(".")
      assert base[section][field] != v == config[section][field], (arm, k)
    pipeline.check_config(config.data, model_lib.config_from(config.model), 6)


def test_the_bert_recipe_is_mlm_alone_on_packed_rows():
  """BERT's arm trains without NSP (the loop has none): its objectives and heads."""
  c = pf.recipe(bert_tiny.get_config(), 6)
  assert objectives.names_of(c) == ("mlm",) and not c.model.pooler
  assert c.train.num_steps == 6 and c.model.dtype == "float32"
  # The loop's model is the run's: BertForMaskedLM, no pooler or NSP head (built from
  # config.model alone it took the dataclass's nsp=True and refused to start).
  model = pf.hf_model(c)
  assert type(model).__name__ == "BertForMaskedLM"
  ours = jax.eval_shape(objectives.from_config(c).networks.init, jax.random.key(0))
  assert sum(p.numel() for p in model.parameters()) == sum(  # the decoder tied in both
      x.size for x in jax.tree.leaves(nn.unbox(ours)))


def test_the_hf_init_arm_starts_from_the_loops_initial_weights(setup, tmp_path):
  """`save_hf_init` writes the model `hf_loop` starts from (the loop run 0 steps), and
  bertjax reads it as the run's initial weights (MLM logits equal transformers')."""
  _, corpus, c = setup
  config = pf.arm_config(c, 6, "bertjax_hf_init", corpus["train"],
                         corpus["tokenizer"]["bertjax"], 3)
  config.train.num_steps = 0
  pf.hf_loop(config, corpus["train"], corpus["tokenizer"]["hf"], 3, str(tmp_path / "loop"))
  pf.save_hf_init(config, 3, str(tmp_path / "init"))
  loop = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "loop")
  init = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "init")
  for (name, a), b in zip(loop.state_dict().items(), init.state_dict().values()):
    assert torch.equal(a, b), name
  from bertjax.checkpoint import pretrained  # pylint: disable=g-import-not-at-top
  p = pretrained.load_pretrained(str(tmp_path / "init"), tokenizer=tok_lib.load_tokenizer(
      corpus["tokenizer"]["bertjax"]))
  ours = p.logits(pf.read_documents(corpus["held_out"])[:2], max_length=T)
  with torch.no_grad():
    theirs = init(input_ids=torch.from_numpy(ours["input_ids"]).long(),
                  attention_mask=torch.from_numpy(ours["attention_mask"]).long()).logits
  real = ours["attention_mask"].astype(bool)
  np.testing.assert_allclose(ours["mlm_logits"][real][:, :theirs.shape[-1]],
                             theirs.numpy()[real], atol=2e-5)


@pytest.mark.slow
def test_tiny_comparison(setup):
  """Each side trains 6 steps and is scored; the timings add up."""
  directory, corpus, c = setup
  hf_tok = transformers.AutoTokenizer.from_pretrained(corpus["tokenizer"]["hf"])
  batches = pf.eval_rows(pf.read_documents(corpus["held_out"]), hf_tok, T,
                         hf_tok.mask_token_id, c.model.vocab_size)
  masked = sum(int((b["labels"] != -100).sum()) for b in batches)
  tokens = np.concatenate([b["attention_mask"].sum(1) - 2 for b in batches])  # [CLS] [SEP]
  assert masked == np.maximum(1, np.round(0.15 * tokens)).sum()  # 15% of each row.
  results = {}
  for arm in ("hf", "bertjax"):
    config = pf.arm_config(c, 6, arm, corpus["train"], corpus["tokenizer"]["bertjax"], 0)
    out = os.path.join(directory, arm)
    if arm == "hf":
      timing = pf.hf_loop(config, corpus["train"], corpus["tokenizer"]["hf"], 0, out)
      assert timing["rows"] > 20 and np.isfinite(timing["final_loss"])
    else:
      timing = pf.bertjax_run(config, os.path.join(directory, "workdir"), out)
      assert timing["compile_s"] > 0 and timing["data_s"] > 0
    results[arm] = pf.score(out, batches)
    assert 0 <= results[arm]["accuracy"] <= 1 and results[arm]["masked"] == masked
    assert 0 < results[arm]["loss"] < 2 * np.log(c.model.vocab_size)
