"""Export to Hugging Face and import back: `python -m bertjax.convert --to=hf|bertjax`.
transformers loads the exported dirs and computes what bertjax computes."""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bertjax import api, convert as convert_cli  # pylint: disable=wrong-import-position
from bertjax.hf import convert, files
from bertjax.data import tokenizer as tokenizer_lib  # pylint: disable=wrong-import-position
from tests.helpers import perturb  # pylint: disable=wrong-import-position

CORPUS = ["The quick brown fox jumps over the lazy dog.",
          "Please turn your homework in on Monday, or else!",
          "BERT pretrains bidirectional encoders with masked language modelling.",
          "XLM-R covers one hundred languages with a SentencePiece vocabulary."] * 20
TEXTS = ["The quick brown fox.", "Please turn your homework in on Monday!", "a"]
PAIRS = ["jumps over the dog", "no", "BERT pretrains encoders."]


def _small(vocab_size, **kw):
  return dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
              num_attention_heads=4, intermediate_size=64, hidden_act="gelu", **kw)


def _run_hf(model, batch):
  with torch.no_grad():
    return model(**{k: torch.from_numpy(v.astype(np.int64)) for k, v in batch.items()},
                 output_hidden_states=True)


def _masked_close(ours, theirs, mask, atol=1e-4):
  m = mask.astype(bool)
  np.testing.assert_allclose(ours[m], theirs[m], atol=atol, rtol=1e-4)


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory):
  d = tmp_path_factory.mktemp("hf_bert")
  tok = tokenizer_lib.train_tokenizer(CORPUS, "wordpiece", vocab_size=200)
  config = transformers.BertConfig(**_small(tok.vocab_size, max_position_embeddings=64))
  torch.manual_seed(0)
  model = perturb(transformers.BertForPreTraining(config))
  model.save_pretrained(str(d))
  (d / "vocab.txt").write_text(
      "".join(tok.id_to_token(i) + "\n" for i in range(tok.vocab_size)), encoding="utf-8")
  return str(d), model


@pytest.mark.slow
def test_bert_roundtrip_through_bertjax_and_back(hf_bert, tmp_path):
  src, model = hf_bert
  workdir, exported = str(tmp_path / "workdir"), str(tmp_path / "exported")
  convert_cli.main(["--to=bertjax", f"--src={src}", f"--dst={workdir}"])
  convert_cli.main(["--to=hf", f"--src={workdir}", f"--dst={exported}"])
  assert json.load(open(os.path.join(exported, "config.json")))["architectures"] == [
      "BertForPreTraining"]
  # The tokenizer: transformers' reading of the export == bertjax's == the original's.
  hf_tok = transformers.AutoTokenizer.from_pretrained(exported)
  ours = api.load_pretrained(workdir)
  batch = hf_tok(TEXTS, PAIRS, padding=True, return_tensors="np")
  ids = ours.tokenizer(TEXTS, PAIRS)
  for k in ("input_ids", "token_type_ids", "attention_mask"):
    np.testing.assert_array_equal(batch[k], ids[k])
  # The weights: the re-exported model computes what the original computes.
  reloaded = transformers.BertForPreTraining.from_pretrained(exported).eval()
  a, b = _run_hf(model, ids), _run_hf(reloaded, ids)
  for x, y in ((a.prediction_logits, b.prediction_logits),
               (a.seq_relationship_logits, b.seq_relationship_logits),
               (a.hidden_states[-1], b.hidden_states[-1])):
    np.testing.assert_allclose(x.numpy(), y.numpy(), atol=1e-5)
  # And bertjax's own logits on the workdir equal transformers' on the export.
  logits = ours.logits(TEXTS, PAIRS)
  _masked_close(logits["mlm_logits"], b.prediction_logits.numpy(), ids["attention_mask"])
  np.testing.assert_allclose(logits["nsp_logits"], b.seq_relationship_logits.numpy(),
                             atol=1e-4)


def test_xlmr_export_runs_in_transformers(tmp_path):
  d = tmp_path / "hf_xlmr"
  tok = tokenizer_lib.train_tokenizer(CORPUS, "sentencepiece", vocab_size=120,
                                      lowercase=False)
  tok.save(str(d))
  config = transformers.XLMRobertaConfig(**_small(
      tok.vocab_size, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1,
      bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5))
  torch.manual_seed(0)
  perturb(transformers.XLMRobertaForMaskedLM(config)).save_pretrained(str(d))
  ours = api.load_pretrained(str(d))
  exported = str(tmp_path / "exported")
  assert convert.save_hf(exported, ours.params, ours.config, ours.tokenizer) == "xlm-roberta"
  hf_tok = transformers.AutoTokenizer.from_pretrained(exported)
  batch = hf_tok(TEXTS, padding=True, return_tensors="np")
  logits = ours.logits(TEXTS)
  np.testing.assert_array_equal(batch["input_ids"], logits["input_ids"])
  model = transformers.AutoModelForMaskedLM.from_pretrained(exported).eval()
  hf = _run_hf(model, {"input_ids": batch["input_ids"],
                       "attention_mask": batch["attention_mask"]})
  _masked_close(logits["mlm_logits"], hf.logits.numpy(), batch["attention_mask"])


@pytest.mark.slow
def test_roberta_roundtrip_through_bertjax_and_back(tmp_path):
  """A model_type=roberta dir with a byte-level BPE -> bertjax workdir -> Hugging Face:
  RoBERTa's files and class, the same ids and the same logits."""
  src = tmp_path / "hf_roberta"
  tok = tokenizer_lib.train_tokenizer(CORPUS, "byte_level_bpe", vocab_size=300,
                                      lowercase=False)
  files.save_hf_tokenizer(str(src), tok)
  config = transformers.RobertaConfig(**_small(
      tok.vocab_size, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1,
      bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5))
  torch.manual_seed(0)
  model = perturb(transformers.RobertaForMaskedLM(config))
  model.save_pretrained(str(src))
  workdir, exported = str(tmp_path / "workdir"), str(tmp_path / "exported")
  convert_cli.main(["--to=bertjax", f"--src={src}", f"--dst={workdir}"])
  convert_cli.main(["--to=hf", f"--src={workdir}", f"--dst={exported}"])
  saved = json.load(open(os.path.join(exported, "config.json")))
  assert (saved["model_type"], saved["architectures"]) == ("roberta", ["RobertaForMaskedLM"])
  assert {"vocab.json", "merges.txt"} <= set(os.listdir(exported))
  ours = api.load_pretrained(workdir)
  batch = transformers.AutoTokenizer.from_pretrained(exported)(
      TEXTS, PAIRS, padding=True, return_tensors="np")
  ids = ours.tokenizer(TEXTS, PAIRS)
  for k in ("input_ids", "attention_mask"):
    np.testing.assert_array_equal(batch[k], ids[k])
  inputs = {k: ids[k] for k in ("input_ids", "attention_mask")}
  reloaded = transformers.AutoModelForMaskedLM.from_pretrained(exported).eval()
  np.testing.assert_allclose(_run_hf(reloaded, inputs).logits.numpy(),
                             _run_hf(model, inputs).logits.numpy(), atol=1e-5)
  _masked_close(ours.logits(TEXTS, PAIRS)["mlm_logits"], _run_hf(model, inputs).logits.numpy(),
                ids["attention_mask"])
