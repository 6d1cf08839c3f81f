"""mmBERT's recipe in one run (configs/mmbert_{base,small,tiny}.py, issue 59): the phases'
steps and shapes follow from the authors' token counts; the languages join, the tau,
masking, both thetas and the learning rate change at the phase knots; the full-size
parameter counts equal Hugging Face's ModernBertForMaskedLM with mmBERT's config; a
tokenizer built as Gemma 2's is (byte-fallback BPE, spaces as U+2581, no
pre-tokenizer, <pad> <eos> <bos> <unk> <mask> at ids 0-4) gives AutoTokenizer's ids;
and the tiny recipe trains on the shipped multilingual corpus, each language held out
and scored from the start (a published mmBERT continued: test_mmbert_continued.py)."""

import json
import os

import jax
import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models, normalizers, processors, trainers

from bertjax.data import phases, tokenizer as tok_lib
from bertjax.train import optimizer, pretrain, state as state_lib
from configs import mmbert_base, mmbert_small, mmbert_tiny
from tests.test_tokenizer import CORPUS
from tests.test_tokenizer_template import assert_same_inputs

transformers = pytest.importorskip("transformers")

DOC = "docs/multilingual.md"
LATE = ("yor", "fao")  # Sources only the decay phase reads (the authors' decay-all).
# (module, the lr warm-up's tokens, the batch warm-up's, the lr after phase 1, its
# weight decay, the decay's final fraction and shape): the authors' yamls.
YAMLS = [(mmbert_base, 3e9, 60e9, 8e-4, 8e-5, 0.02, "1-sqrt"),
         (mmbert_small, 4e9, 100e9, 4e-4, 4e-5, 0.04, "linear")]


def _with_languages(config):
  names = mmbert_base.PRETRAIN_LANGUAGES + mmbert_base.EXT_LANGUAGES + list(LATE)
  config.data.languages = ",".join(f"{n}=/data/{n}" for n in names)
  return config


@pytest.mark.parametrize("recipe,warmup_tokens,ramp_tokens,low,low_wd,end,shape", YAMLS,
                         ids=["base", "small"])
def test_phases_follow_from_the_authors_tokens(recipe, warmup_tokens, ramp_tokens, low,
                                               low_wd, end, shape):
  config = _with_languages(recipe.get_config())
  stages = pretrain.check_config(config).stages
  at = lambda step: [s for s in stages if s.first_step <= step][-1]
  # The batch warm-up: 11 sizes of 384 .. 4,224 rows of 1,024, the same steps each.
  ramp, each = stages[:11], stages[0].steps
  assert [s.rows for s in ramp] == [384 * k for k in range(1, 12)]
  assert all(s.steps == each and s.length == 1024 for s in ramp)
  done = sum(s.rows for s in ramp) * each * 1024
  assert abs(done - ramp_tokens) < sum(s.rows for s in ramp) * 1024
  p1 = 11 * each + round((2.3e12 - done) / (4608 * 1024))
  p2 = p1 + round(600e9 / (4608 * 8192))
  assert [(s.first_step, s.length, s.rows) for s in stages[11:]] == [
      (11 * each, 1024, 4608), (p1, 8192, 4608), (p2, 8192, 4608)]
  assert config.train.num_steps == p2 + round(100e9 / (4608 * 8192))
  tokens, step = 0, 0  # The lr warm-up's tokens, through the warm-up's batch sizes.
  while tokens < warmup_tokens:
    tokens, step = tokens + at(step).rows * 1024, step + 1
  assert config.train.warmup_steps == step
  # Languages, tau, masking and both thetas by phase.
  names = [s.name for s in pretrain.mixture.sources_of(config.data)]
  by_phase = phases.source_phases(config.data, config.train.num_steps, names)
  assert [(p.first_step, len(p.names), p.alpha) for p in by_phase] == [
      (0, 61, 0.7), (p1, 110, 0.5), (p2, 112, 0.3)]
  assert not set(LATE) & set(by_phase[1].names) and "code" in by_phase[0].names
  rates = phases.masked_lm_prob_phases(config.data, config.train.num_steps)
  assert rates == [(0, 0.3), (p1, 0.15), (p2, 0.05)]
  assert pretrain.phase_inputs(config) == [
      {"global_rope_theta": t, "local_rope_theta": t} for t in (1e4, 1.6e5, 1.6e5)]
  # The learning rate and decoupled decay at the knots.
  t = config.train
  lr, rate = optimizer.learning_rate_schedule(t), optimizer.weight_decay_schedule(t)
  wd = rate if callable(rate) else lambda step: rate  # (a constant without restarts)
  decay_start = t.num_steps - optimizer.decay_steps(t)
  assert decay_start == p2
  mid = (decay_start + t.num_steps) // 2
  x = (mid - decay_start) / (t.num_steps - decay_start)
  fall = np.sqrt(x) if shape == "1-sqrt" else x
  for step, want, decay in [
      (0, 0.0, 8e-5), (t.warmup_steps, 8e-4, 8e-5), (p1 - 1, 8e-4, 8e-5), (p1, low, low_wd),
      (mid, low * end + (low - low * end) * (1 - fall), low_wd), (t.num_steps, 1.6e-5, low_wd)]:
    np.testing.assert_allclose(float(lr(step)), want, rtol=1e-5, err_msg=str(step))
    np.testing.assert_allclose(float(wd(step)), decay / 8e-4, rtol=1e-6, err_msg=str(step))
  assert (t.b1, t.b2, t.eps, t.optimizer, t.decouple_lr) == (0.9, 0.95, 1e-8, "stable_adamw",
                                                             True)


@pytest.mark.parametrize("recipe,count", [(mmbert_base, 307_786_240),
                                          (mmbert_small, 140_897_536)])
def test_full_size_parameter_counts_equal_hugging_faces(recipe, count):
  """bertjax's model of the recipe, and Hugging Face's ModernBertForMaskedLM of mmBERT's
  config (the yamls' sizes; the decoder tied: counted once), have the same parameters."""
  torch = pytest.importorskip("torch")
  config = recipe.get_config()
  params = jax.eval_shape(state_lib.build_model(config).init_params, jax.random.key(0))
  assert sum(x.size for x in jax.tree.leaves(params)) == count
  m = config.model
  hf = transformers.ModernBertConfig(
      vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=1152,
      num_hidden_layers=22, num_attention_heads=m.num_heads, max_position_embeddings=8192,
      norm_eps=1e-5, norm_bias=False, global_rope_theta=160_000.0,
      local_rope_theta=160_000.0, local_attention=128, global_attn_every_n_layers=3,
      pad_token_id=0, eos_token_id=1, bos_token_id=2, cls_token_id=2, sep_token_id=1)
  with torch.device("meta"):
    theirs = transformers.ModernBertForMaskedLM(hf)
  assert sum(p.numel() for p in theirs.parameters()) == count


SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")  # Gemma 2's ids 0-4


def gemma_like(texts) -> tokenizers.Tokenizer:
  """A tokenizer built as Gemma 2's tokenizer.json is (BPE with byte fallback and its
  256 <0xNN> pieces, spaces replaced by U+2581 and no pre-tokenizer, the decoder's
  Replace / ByteFallback / Fuse, Gemma's special tokens at ids 0-4) over a small BPE of
  `texts`, with mmBERT's template: <bos> A <eos> (pairs: <bos> A <eos> B <eos>). The
  real 256,000-piece file is gated and not here: its pipeline is what is checked."""
  trained = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
  trained.normalizer = normalizers.Replace(" ", "\u2581")
  trained.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=600, special_tokens=list(SPECIALS), show_progress=False))
  model = json.loads(trained.to_str())["model"]
  vocab = dict(model["vocab"])
  for b in range(256):
    vocab.setdefault(f"<0x{b:02X}>", len(vocab))
  merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
  tok = tokenizers.Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True,
                                        fuse_unk=True))
  tok.normalizer = normalizers.Replace(" ", "\u2581")
  tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                   decoders.Fuse()])
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                          for t in SPECIALS])
  tok.post_processor = processors.TemplateProcessing(
      single="<bos> $A <eos>", pair="<bos> $A <eos> $B:1 <eos>:1",
      special_tokens=[("<bos>", 2), ("<eos>", 1)])
  return tok


def test_a_gemma_style_tokenizer_gives_autotokenizers_ids(tmp_path):
  """Saved by transformers as mmBERT's folder holds it, the tokenizer loads in bertjax
  with Gemma's ids for [CLS] (<bos>), [SEP] (<eos>), padding, mask and unknown, and
  gives AutoTokenizer's ids on single texts and pairs; characters outside its pieces
  fall back to their UTF-8 bytes in both."""
  lines = open(os.path.join(mmbert_tiny.CORPUS, "deu.txt"), encoding="utf-8").read().split("\n")
  hf = transformers.PreTrainedTokenizerFast(
      tokenizer_object=gemma_like([x for x in lines if x][:300] + list(CORPUS)),
      bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
      mask_token="<mask>", cls_token="<bos>", sep_token="<eos>")
  hf.save_pretrained(str(tmp_path))
  hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  ours = tok_lib.load_tokenizer(str(tmp_path))
  assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id, ours.unk_id) == (2, 1, 0, 4, 3)
  assert ours.vocab_size == len(hf)
  assert_same_inputs(ours, hf)
  text = "Größe der Datei \U0001F642 \u014b \u6f22\u5b57"
  ids = ours.tokenize(text)
  assert ids == hf(text, add_special_tokens=False)["input_ids"]
  assert ours.token_to_id("<0xF0>") in ids  # the emoji's first byte
  assert ours.decode(ours.build_inputs(ids)[0]) == text


def test_tiny_recipe_passes_its_checks():
  c = mmbert_tiny.get_config()
  schedule = pretrain.check_config(c)
  assert [(s.first_step, s.length, s.rows) for s in schedule.stages] == [
      (0, 64, 8), (10, 64, 16), (20, 64, 24), (30, 64, 32), (240, 128, 32), (320, 128, 32)]
  names = [s.name for s in pretrain.mixture.sources_of(c.data)]
  assert [p.names for p in phases.source_phases(c.data, 400, names)] == [
      mmbert_tiny.FIRST, mmbert_tiny.FIRST + mmbert_tiny.SECOND, tuple(names)]


@pytest.mark.slow
def test_tiny_recipe_trains_each_language_held_out_from_the_start(tmp_path):
  """docs/multilingual.md's command, cut to 40 steps (phases of 24, 8 and 8; no batch
  warm-up): the log says which sources each phase samples, every evaluation scores
  every language (the late ones before they join too), and the last languages' losses
  fall once they are trained on."""
  import subprocess  # pylint: disable=g-import-not-at-top
  from tests.test_readme import REPO, documented  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / "run")
  done = subprocess.run(documented(
      DOC, "configs/mmbert_tiny.py", f"--workdir={workdir}", "--config.train.num_steps=40",
      "--config.train.batch_warmup_tokens=0", "--config.train.warmup_steps=4",
      "--config.train.eval_every=8", "--config.train.log_every=8",
      "--config.train.checkpoint_every=40", "--config.compilation_cache_dir="),
                        cwd=REPO, capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "'source_phases': [(0, {'deu'" in done.stderr
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  evals = {r["step"]: r for r in rows if r.get("split") == "eval"}
  assert sorted(evals) == [8, 16, 24, 32, 40]
  languages = mmbert_tiny.FIRST + mmbert_tiny.SECOND + mmbert_tiny.LATE
  for r in evals.values():
    assert all(f"{n}/mlm_loss" in r for n in languages), sorted(r)
  for n in mmbert_tiny.LATE:  # Decay-only languages learn in the decay phase (32-40).
    assert evals[40][f"{n}/mlm_loss"] < evals[32][f"{n}/mlm_loss"], n
