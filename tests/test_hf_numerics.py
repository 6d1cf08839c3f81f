"""Checkpoints converted from Hugging Face compute what Hugging Face computes (fp32)."""

import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bertjax import api  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax.hf import files  # pylint: disable=wrong-import-position
from bertjax.data import tokenizer as tokenizer_lib  # pylint: disable=wrong-import-position
from bertjax.errors import CheckpointError  # pylint: disable=wrong-import-position
from tests.helpers import perturb, tiny_config  # pylint: disable=wrong-import-position

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Please turn your homework in on Monday, or else!",
    "BERT pretrains bidirectional encoders with masked language modelling.",
    "RoBERTa drops next sentence prediction and trains longer on more data.",
    "XLM-R covers one hundred languages with a SentencePiece vocabulary.",
    "Héllo wörld: naïve café and 中文字符 text.",
] * 20
TEXTS = ["The quick brown fox.", "Please turn your homework in on Monday, or else!",
         "a", "BERT pretrains bidirectional encoders with masked language modelling."]
PAIRS = ["jumps over the dog", "no", "RoBERTa drops next sentence prediction.", "x y z"]
ATOL = 1e-4


def _small(vocab_size, **kw):
  return dict(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2,
              num_attention_heads=4, intermediate_size=128, hidden_act="gelu",
              attention_probs_dropout_prob=0.1, hidden_dropout_prob=0.1, **kw)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("hf_bert")
  tok = tokenizer_lib.train_tokenizer(CORPUS, "wordpiece", vocab_size=300)
  vocab = [tok.id_to_token(i) for i in range(tok.vocab_size)]
  config = transformers.BertConfig(**_small(tok.vocab_size,
                                            max_position_embeddings=64))
  torch.manual_seed(0)
  model = perturb(transformers.BertForPreTraining(config))
  model.save_pretrained(str(d))
  (d / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
  return str(d), model


@pytest.fixture(scope="module")
def xlmr_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("hf_xlmr")
  tok = tokenizer_lib.train_tokenizer(CORPUS, "sentencepiece", vocab_size=120,
                                      lowercase=False)
  tok.save(str(d))
  return str(d), _fairseq_style_mlm(d, "XLMRoberta", tok.vocab_size)


def _fairseq_style_mlm(directory, stem: str, vocab_size: int):
  """A perturbed {stem}ForMaskedLM with fairseq's special ids and positions past the
  padding index (RoBERTa, XLM-R), saved to `directory`."""
  config = getattr(transformers, f"{stem}Config")(**_small(
      vocab_size, max_position_embeddings=66, type_vocab_size=1,
      pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5))
  torch.manual_seed(0)
  model = perturb(getattr(transformers, f"{stem}ForMaskedLM")(config))
  model.save_pretrained(str(directory))
  return model


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory):
  """A RobertaForMaskedLM on a byte-level BPE trained here, with RoBERTa's files
  (vocab.json + merges.txt); also the trained tokenizer itself."""
  d = tmp_path_factory.mktemp("hf_roberta")
  tok = tokenizer_lib.train_tokenizer(CORPUS, "byte_level_bpe", vocab_size=400,
                                      lowercase=False)
  assert files.save_hf_tokenizer(str(d), tok) == "byte_level_bpe"
  return str(d), _fairseq_style_mlm(d, "Roberta", tok.vocab_size), tok


def test_byte_level_bpe_ids_equal_robertas(roberta_dir):
  path, _, trained = roberta_dir
  assert (trained.cls_id, trained.pad_id, trained.sep_id, trained.unk_id) == (0, 1, 2, 3)
  assert trained.mask_id == trained.vocab_size - 1 == 399
  hf = transformers.RobertaTokenizerFast.from_pretrained(path)  # vocab.json + merges.txt
  texts = TEXTS + ["hello <mask> world", " a leading space", "Héllo wörld 中文 🤗"]
  pairs = PAIRS + ["x <mask>", "y", "z"]
  loaded = api.load_pretrained(path).tokenizer
  for tok in (trained, loaded):
    for second in (None, pairs):
      ours = tok(texts, second)
      theirs = hf(texts, second, padding=True, return_tensors="np")
      for k in ("input_ids", "attention_mask"):
        np.testing.assert_array_equal(ours[k], theirs[k])


def test_roberta_matches_hf(roberta_dir):
  path, model, _ = roberta_dir
  pretrained = api.load_pretrained(path)
  cfg = pretrained.config
  assert (cfg.position_offset, cfg.type_vocab_size, cfg.pad_token_id) == (2, 1, 1)
  assert not cfg.nsp and pretrained.has_mlm and pretrained.tokenizer.style == "roberta"
  for pairs in (None, PAIRS):
    batch = pretrained.tokenizer(TEXTS, pairs)
    assert 0 in batch["attention_mask"]  # the batch is padded
    hf = _hf_outputs(model, {k: batch[k] for k in ("input_ids", "attention_mask")})
    theirs = np.stack([h.numpy() for h in hf.hidden_states])
    _assert_close_masked(pretrained.encode(TEXTS, pairs)["hidden_states"], theirs,
                         batch["attention_mask"])
    _assert_close_masked(pretrained.logits(TEXTS, pairs)["mlm_logits"], hf.logits.numpy(),
                         batch["attention_mask"])


def _hf_outputs(model, batch):
  inputs = {k: torch.from_numpy(v.astype(np.int64)) for k, v in batch.items()}
  with torch.no_grad():
    out = model(**inputs, output_hidden_states=True)
  return out


def _assert_close_masked(ours, theirs, mask):
  """ours/theirs [..., B, T, X]; compared where mask [B, T] is 1."""
  keep = mask.astype(bool)
  np.testing.assert_allclose(ours[..., keep, :], theirs[..., keep, :], atol=ATOL, rtol=ATOL)


def test_bert_matches_hf(bert_dir):
  path, model = bert_dir
  pretrained = api.load_pretrained(path)
  assert pretrained.config.nsp and pretrained.config.pooler and pretrained.has_mlm
  for pairs in (None, PAIRS):
    enc = pretrained.encode(TEXTS, pairs)
    batch = pretrained.tokenizer(TEXTS, pairs)
    assert 0 in batch["attention_mask"]  # the batch is padded
    np.testing.assert_array_equal(enc["input_ids"], batch["input_ids"])
    hf = _hf_outputs(model, batch)
    theirs = np.stack([h.numpy() for h in hf.hidden_states])
    assert enc["hidden_states"].shape == theirs.shape == (3, 4, batch["input_ids"].shape[1], 64)
    _assert_close_masked(enc["hidden_states"], theirs, batch["attention_mask"])
    logits = pretrained.logits(TEXTS, pairs)
    _assert_close_masked(logits["mlm_logits"], hf.prediction_logits.numpy(),
                         batch["attention_mask"])
    np.testing.assert_allclose(logits["nsp_logits"], hf.seq_relationship_logits.numpy(),
                               atol=ATOL, rtol=ATOL)


def test_xlmr_matches_hf(xlmr_dir):
  path, model = xlmr_dir
  pretrained = api.load_pretrained(path)
  cfg = pretrained.config
  assert (cfg.position_offset, cfg.type_vocab_size, cfg.nsp, cfg.pooler) == (2, 1, False, False)
  assert pretrained.tokenizer.style == "roberta"
  texts = TEXTS + ["hello <mask> world"]
  enc = pretrained.encode(texts)
  logits = pretrained.logits(texts)
  batch = pretrained.tokenizer(texts)
  hf = _hf_outputs(model, {k: batch[k] for k in ("input_ids", "attention_mask")})
  theirs = np.stack([h.numpy() for h in hf.hidden_states])
  _assert_close_masked(enc["hidden_states"], theirs, batch["attention_mask"])
  _assert_close_masked(logits["mlm_logits"], hf.logits.numpy(), batch["attention_mask"])
  assert "nsp_logits" not in logits


def test_fill_mask(bert_dir, xlmr_dir):
  for path, _ in (bert_dir, xlmr_dir):
    pretrained = api.load_pretrained(path)
    result = pretrained.fill_mask("the quick [MASK] fox [MASK] .", top_k=3)
    assert len(result) == 2 and all(len(r) == 3 for r in result)
    probs = [p for r in result for _, p in r]
    assert all(0 <= p <= 1 for p in probs) and result[0][0][1] >= result[0][1][1]


def test_errors(bert_dir, tmp_path):
  with pytest.raises(CheckpointError) as e:
    api.load_pretrained(str(tmp_path / "missing"))
  assert "\n" not in str(e.value)
  (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
  with pytest.raises(CheckpointError, match="gpt2"):
    api.load_pretrained(str(tmp_path))
  small = tmp_path / "small_vocab"
  shutil.copytree(bert_dir[0], small)
  vocab = (small / "vocab.txt").read_text(encoding="utf-8").splitlines()
  (small / "vocab.txt").write_text("\n".join(vocab + ["extra1", "extra2"]) + "\n",
                                   encoding="utf-8")
  with pytest.raises(CheckpointError, match="tokenizer has"):
    api.load_pretrained(str(small))


def test_real_minilm_matches_hf(minilm, minilm_hf):
  pretrained = minilm
  assert pretrained.config.num_layers == 6 and not pretrained.has_mlm
  hf_tok, model = minilm_hf
  texts = ["Hello world!", "A man is playing a guitar on the stage, loudly.",
           "Café naïve résumé 中文 [MASK] test."]
  enc = pretrained.encode(texts)
  batch = hf_tok(texts, padding=True, return_tensors="np")
  np.testing.assert_array_equal(enc["input_ids"], batch["input_ids"])
  hf = _hf_outputs(model, dict(batch))
  _assert_close_masked(enc["hidden_states"][-1], hf.last_hidden_state.numpy(),
                       batch["attention_mask"])
  with pytest.raises(CheckpointError, match="no MLM head"):
    pretrained.fill_mask("hello [MASK] .")


@pytest.mark.slow
def test_bertjax_workdir(tmp_path):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from bertjax.checkpoint import files, manager as checkpoint, workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  tok = tokenizer_lib.train_tokenizer(CORPUS, "wordpiece", vocab_size=300)
  config = tiny_config()
  config.model.vocab_size = tok.vocab_size
  workdir = str(tmp_path)
  workdir_lib.save_config(workdir, config)
  tok.save(os.path.join(workdir, files.TOKENIZER_DIR))
  params = jax.jit(lambda: nn.unbox(state_lib.build_model(config).init_params(
      jax.random.key(0))))()
  ckpt = checkpoint.Checkpointer(workdir)
  ckpt.save(0, {"step": np.zeros((), np.int32), "params": params}, None, force=True)
  ckpt.wait()
  ckpt.close()
  pretrained = api.load_pretrained(workdir)
  jax.tree.map(np.testing.assert_array_equal, pretrained.params, params)
  out = pretrained.encode(TEXTS, PAIRS, max_length=16)
  assert out["hidden_states"].shape[:2] == (config.model.num_layers + 1, len(TEXTS))
  assert pretrained.fill_mask("the [MASK] fox", top_k=2)[0][0][1] > 0
