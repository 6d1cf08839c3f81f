"""ModernBERT through the tools: its tokenizer.json read and written back, `python -m
bertjax.convert` both ways (transformers' ModernBertForMaskedLM with equal logits, a
workdir that goes on pretraining), Ettin / mmBERT config.json variants, `python -m
bertjax.embed` (layers, word pooling, WSD) and `fill_mask`, against transformers on
the same weights; the convert errors of a family."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from bertjax import api, convert as convert_cli, model as model_lib  # pylint: disable=wrong-import-position
from bertjax.data.tokenizer import load_tokenizer, train_tokenizer  # pylint: disable=wrong-import-position
from bertjax.embeddings import extract  # pylint: disable=wrong-import-position
from bertjax.hf import files  # pylint: disable=wrong-import-position
from bertjax.errors import CheckpointError  # pylint: disable=wrong-import-position
from bertjax.train import pretrain  # pylint: disable=wrong-import-position
from tests import faults  # pylint: disable=wrong-import-position
from tests.helpers import hf_outputs, load_hf  # pylint: disable=wrong-import-position
from tests.modernbert_helpers import (CLS, MASK, PAD, SEP, TEXTS, UNK, hf_modernbert,  # pylint: disable=wrong-import-position
                                      pretrain_config)
from tests.tasks_helpers import fixture, fixture_tokenizer  # pylint: disable=wrong-import-position

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAIRS = (["the cat sat on the mat", "a dog"], ["while the dog ran", "in the old garden"])


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  return hf_modernbert(str(tmp_path_factory.mktemp("hf")))


@pytest.fixture(scope="module")
def workdir(hf_dir, tmp_path_factory):
  """`python -m bertjax.convert --to=bertjax` of the Hugging Face directory."""
  out = str(tmp_path_factory.mktemp("converted") / "wd")
  convert_cli.main(["--to=bertjax", f"--src={hf_dir}", f"--dst={out}"])
  return out


@pytest.fixture(scope="module")
def reference(hf_dir):
  return load_hf(hf_dir)


def _max_diff(ours, theirs, mask):
  return float(np.abs(np.asarray(ours) - np.asarray(theirs))[mask.astype(bool)].max())


# ---- Tokenizer -------------------------------------------------------------------

def test_modernbert_tokenizer_json_is_read_as_transformers_reads_it(hf_dir):
  """bertjax reads ModernBERT's kind of tokenizer.json with BERT's special-token layout
  ([CLS] a [SEP] b [SEP]), its special ids, its BPE word starts ('Ġ'), and the ids of
  transformers' AutoTokenizer for texts, pairs and a [MASK]."""
  ours = load_tokenizer(hf_dir)
  theirs = transformers.AutoTokenizer.from_pretrained(hf_dir)
  assert ours.style == "bert"
  assert (ours.unk_id, ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id) == (
      UNK, CLS, SEP, PAD, MASK) == (theirs.unk_token_id, theirs.cls_token_id,
                                    theirs.sep_token_id, theirs.pad_token_id,
                                    theirs.mask_token_id)
  texts = TEXTS + ["please turn [MASK] homework in ."]
  np.testing.assert_array_equal(ours(texts)["input_ids"],
                                theirs(texts, padding=True)["input_ids"])
  np.testing.assert_array_equal(ours(*PAIRS)["input_ids"],
                                theirs(*PAIRS, padding=True)["input_ids"])
  starts = ours.word_starts()
  assert starts[ours.tokenize(" garden")[0]] and not starts[ours.tokenize("garden")[-1]]


@pytest.mark.parametrize("kind", ["modernbert", "byte_level_bpe", "wordpiece"])
def test_exported_tokenizer_reads_back_in_transformers(kind, hf_dir, tmp_path):
  """A ModernBERT model's tokenizer as exported (tokenizer.json, which transformers 5's
  AutoTokenizer reads for model_type 'modernbert', with a post-processor adding the
  special tokens when the file had none): ModernBERT's own, a byte-level BPE trained
  by bertjax (<s> a </s></s> b </s>) or a WordPiece vocabulary give transformers the
  ids bertjax builds."""
  if kind == "modernbert":
    tok = load_tokenizer(hf_dir)
  elif kind == "byte_level_bpe":
    tok = train_tokenizer([t for t in TEXTS * 3], kind, vocab_size=300, lowercase=False)
  else:
    tok = load_tokenizer(fixture_tokenizer(str(tmp_path / "wordpiece")))
  out = str(tmp_path / "out")
  assert files.save_hf_tokenizer(out, tok, 128, tokenizer_json=True) == "json"
  with open(os.path.join(out, "config.json"), "w") as f:
    json.dump({"model_type": "modernbert"}, f)
  with open(os.path.join(out, "tokenizer_config.json")) as f:
    settings = json.load(f)
  assert settings["model_max_length"] == 128
  assert settings["cls_token"] == tok.id_to_token(tok.cls_id)
  assert sorted(os.listdir(out)) == ["config.json", "tokenizer.json",
                                     "tokenizer_config.json"]
  theirs = transformers.AutoTokenizer.from_pretrained(out)
  assert theirs.mask_token_id == tok.mask_id and theirs.pad_token_id == tok.pad_id
  np.testing.assert_array_equal(tok(TEXTS)["input_ids"],
                                theirs(TEXTS, padding=True)["input_ids"])
  np.testing.assert_array_equal(tok(*PAIRS)["input_ids"],
                                theirs(*PAIRS, padding=True)["input_ids"])


# ---- Convert ---------------------------------------------------------------------

def test_convert_both_ways_keeps_the_logits(hf_dir, workdir, reference, tmp_path):
  """HF dir -> bertjax workdir: its MLM logits equal transformers' on rows with padding
  and longer than the window; -> HF dir again: AutoModelForMaskedLM reads it with the
  same logits, the config.json names the tokenizer's special ids."""
  ours = api.load_pretrained(workdir).logits(TEXTS)
  ids, mask = ours["input_ids"], ours["attention_mask"]
  assert ids.shape[1] > 9 and mask.min() == 0
  ref = hf_outputs(reference, ids, mask).logits.numpy()
  assert _max_diff(ours["mlm_logits"], ref, mask) < 1e-5
  exported = str(tmp_path / "hf")
  convert_cli.main(["--to=hf", f"--src={workdir}", f"--dst={exported}"])
  with open(os.path.join(exported, "config.json")) as f:
    written = json.load(f)
  assert written["architectures"] == ["ModernBertForMaskedLM"]
  assert (written["cls_token_id"], written["sep_token_id"], written["pad_token_id"]) == (
      CLS, SEP, PAD)
  back = hf_outputs(load_hf(exported), ids, mask).logits.numpy()
  assert _max_diff(back, ref, mask) < 1e-5


@pytest.mark.parametrize("variant", ["ettin", "mmbert"])
def test_ettin_and_mmbert_directories_load(variant, hf_dir, tmp_path):
  """A directory whose config.json has the transformers 4.x keys Ettin and mmBERT ship
  (global_attn_every_n_layers, global_rope_theta, local_rope_theta, local_attention;
  mmBERT: local theta 160k and a vocabulary beyond the tokenizer's) loads into bertjax
  with transformers' logits on the same directory."""
  d = tmp_path / variant
  shutil.copytree(hf_dir, d)
  with open(d / "config.json") as f:
    hf = json.load(f)
  for key in ("layer_types", "rope_parameters", "sliding_window"):
    hf.pop(key, None)
  hf.update(global_attn_every_n_layers=3, global_rope_theta=160_000.0,
            local_attention=8, local_rope_theta=10_000.0 if variant == "ettin" else 160_000.0,
            transformers_version="4.48.0")
  with open(d / "config.json", "w") as f:
    json.dump(hf, f)
  ours = api.load_pretrained(str(d))
  assert ours.config.local_rope_theta == hf["local_rope_theta"]
  out = ours.logits(TEXTS)
  ref = hf_outputs(load_hf(str(d)), out["input_ids"], out["attention_mask"]).logits
  assert _max_diff(out["mlm_logits"], ref.numpy(), out["attention_mask"]) < 1e-5


@pytest.mark.slow
def test_converted_workdir_is_continued_never_trained_in(workdir, tmp_path):
  """Continued pretraining starts from the converted workdir (config.init_from) and
  three steps move its weights a little, not to a random initialisation's; the workdir
  itself, a conversion's, is refused as a pretraining run's, before anything is written."""
  config = pretrain_config(os.path.join(workdir, "tokenizer"), num_steps=3, warmup_steps=1,
                           log_every=1, checkpoint_every=3, learning_rate=1e-4)
  with open(os.path.join(workdir, "config.json")) as f:
    config.model.update(json.load(f)["model"])
  before = faults.tree(workdir)
  with pytest.raises(CheckpointError, match="holds a checkpoint converted by"):
    pretrain.run(config, workdir)
  assert faults.tree(workdir) == before
  run = str(tmp_path / "run")
  config.init_from = workdir
  pretrain.run(config, run)
  assert sorted(faults.losses(run)) == [1, 2, 3]
  start, end = api.load_pretrained(workdir).params, faults.saved_state(run, 3)["params"]
  moved = max(float(np.abs(a - b).max()) for a, b in zip(
      *(jax.tree.leaves(p["encoder"]) for p in (start, end))))
  assert 0 < moved < 0.01


def test_convert_errors_name_the_family(workdir, tmp_path, monkeypatch, capsys):
  """A workdir of a family this bertjax lacks, or of one without a Hugging Face table:
  `convert` stops on one line naming it, before any weights are read."""
  unknown = tmp_path / "unknown"
  unknown.mkdir()
  with open(os.path.join(workdir, "config.json")) as f:
    saved = json.load(f)
  with open(unknown / "config.json", "w") as f:
    json.dump(dict(saved, model=dict(saved["model"], family="neobert")), f)
  with pytest.raises(SystemExit):
    convert_cli.main(["--to=hf", f"--src={unknown}", f"--dst={tmp_path / 'out'}"])
  err = capsys.readouterr().err.strip()
  assert err == (f"error: {unknown} holds a model of family 'neobert', which this "
                 f"bertjax does not have ({', '.join(sorted(model_lib.FAMILIES))}): use "
                 "the bertjax version that wrote it.")
  # A third family in bertjax.model without its conversion table in bertjax/hf/.
  monkeypatch.setitem(model_lib.FAMILIES, "neobert", dataclasses.replace(
      model_lib.FAMILIES["modernbert"], name="neobert"))
  monkeypatch.setattr(model_lib, "config_from", lambda _: types.SimpleNamespace(
      family="neobert"))
  with pytest.raises(SystemExit):
    convert_cli.main(["--to=hf", f"--src={unknown}", f"--dst={tmp_path / 'out'}"])
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: a 'neobert' model has no Hugging Face conversion table")
  assert "\n" not in err and not os.path.exists(tmp_path / "out")


# ---- Embed, fill_mask ------------------------------------------------------------

def _cli(*args) -> str:
  env = dict(os.environ, PYTHONPATH=REPO)
  proc = subprocess.run([sys.executable, "-m", *args], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("source", ["workdir", "hf_dir"])
def test_embed_layers_and_word_pooling_equal_transformers(source, request, hf_dir,
                                                          reference, tmp_path):
  """`python -m bertjax.embed --level=token` with an integer layer, mean4 and concat4
  (the workdir, the HF dir) gives transformers' hidden states at each text's tokens;
  word vectors pool those tokens ('first', 'mean')."""
  checkpoint = request.getfixturevalue(source)
  texts = tmp_path / "texts.txt"
  texts.write_text("\n".join(TEXTS) + "\n")
  layers = {"workdir": ("2", "mean4"), "hf_dir": ("concat4", "-1")}[source]
  tok = load_tokenizer(hf_dir)  # the workdir's too
  batch = tok(TEXTS)
  hidden = np.stack([h.numpy() for h in hf_outputs(
      reference.model, batch["input_ids"], batch["attention_mask"],
      output_hidden_states=True).hidden_states])  # [L+1, B, T, E]
  for layer in layers:
    out = tmp_path / f"{layer}.npz"
    printed = _cli("bertjax.embed", f"--checkpoint={checkpoint}", f"--input={texts}",
                   f"--out={out}", f"--layers={layer}", "--level=token")
    assert "token vectors" in printed
    want = extract.combine_layers(hidden, extract.parse_layers(layer, 4))
    with np.load(out) as f:
      for i in range(len(TEXTS)):
        rows = f["vectors"][f["text_index"] == i]
        n = int(batch["attention_mask"][i].sum()) - 2  # without [CLS], [SEP]
        assert rows.shape[0] == n
        np.testing.assert_allclose(rows, want[i, 1:n + 1], atol=2e-5)
  embedder = extract.Embedder(api.load_pretrained(checkpoint), layers="mean4")
  (tokens, _), = embedder.tokens(TEXTS[:1])
  for pool in ("first", "mean"):
    (words, items, _), = embedder.words(TEXTS[:1], pool=pool)
    assert items == TEXTS[0].split()
    starts = np.cumsum([0] + [len(tok.tokenize((" " if k else "") + w))
                              for k, w in enumerate(items)])
    for w in range(len(items)):
      piece = tokens[starts[w]:starts[w + 1]]
      np.testing.assert_allclose(words[w], piece[0] if pool == "first" else piece.mean(0),
                                 atol=1e-6)


@pytest.mark.slow
def test_embed_wsd_and_fill_mask_programs(workdir, hf_dir, reference):
  """`python -m bertjax.embed wsd` runs 1-NN WSD on the workdir; `python -m
  bertjax.fill_mask` prints, and `Pretrained.fill_mask` gives, transformers' top
  tokens and probabilities at the mask (workdir and HF dir)."""
  printed = _cli("bertjax.embed", "wsd", f"--checkpoint={workdir}",
                 f"--train={fixture('wsd_train.jsonl')}", f"--test={fixture('wsd_test.jsonl')}")
  assert "1-NN accuracy" in printed and "most-frequent-sense" in printed
  text = "the cat sat on the [MASK] while the dog ran in the garden"
  tok = load_tokenizer(hf_dir)
  batch = tok([text])
  position = int(np.flatnonzero(batch["input_ids"][0] == MASK)[0])
  logits = hf_outputs(reference, batch["input_ids"], batch["attention_mask"]
                      ).logits.numpy()[0, position]
  probs = np.exp(logits - logits.max())
  probs /= probs.sum()
  top = np.argsort(-probs)[:3]
  for checkpoint in (workdir, hf_dir):
    (fillers,) = api.load_pretrained(checkpoint).fill_mask(text, top_k=3)
    assert [t for t, _ in fillers] == [tok.id_to_token(int(i)) for i in top]
    np.testing.assert_allclose([p for _, p in fillers], probs[top], atol=1e-6)
  printed = _cli("bertjax.fill_mask", f"--checkpoint={workdir}", "--top_k=3", text)
  assert printed.splitlines()[0] == text
  assert printed.splitlines()[1].startswith(f"  mask 1: {tok.id_to_token(int(top[0]))} ")
