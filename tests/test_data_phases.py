"""Sequence-length phases (one stream, shapes switch at the phase boundary, exact
resume in either phase) and multilingual sampling (q_i ~ p_i^alpha) in the pipeline,
the tokenizer corpus and the pretrain."""

import os
import shutil

import numpy as np
import pytest

from bertjax.data import multilingual, pipeline
from bertjax.data.tokenizer import train_tokenizer
from bertjax.errors import ConfigError
from bertjax.train import pretrain
from configs import bert_tiny
from tests.helpers import tiny_config
from tests.test_loop import train_losses


pytestmark = pytest.mark.usefixtures("shared_trainers")  # reruns share one step


def _cfg(**kw):
  cfg = bert_tiny.get_config().data
  cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.dupe_factor = 64, 10, 1
  cfg.eval_fraction = 0.1
  for k, v in kw.items():
    setattr(cfg, k, v)
  return cfg


def test_length_phases_parse():
  cfg = _cfg(length_phases=((0.9, 32), (0.1, 64)))
  assert pipeline.length_phases(cfg, 100) == [(90, 32, 5), (None, 64, 10)]
  cfg = _cfg(length_phases=((0.25, 16, 3), (0.25, 32), (0.5, 64)))
  assert pipeline.length_phases(cfg, 10) == [(2, 16, 3), (3, 32, 5), (None, 64, 10)]
  assert pipeline.length_phases(_cfg(), None) == [(None, 64, 10)]
  for bad, match in ((((0.5, 32), (0.4, 64)), "sum to"), (((1.0, 128),), "length"),
                     (((0.5,), (0.5, 64)), "fraction")):
    with pytest.raises(ConfigError, match=match):
      pipeline.length_phases(_cfg(length_phases=bad), 100)


@pytest.fixture(scope="module")
def tokenizer():
  from bertjax.data import sources
  docs = sources.load_documents("embedded")
  return train_tokenizer([s for d in docs for s in d], kind="wordpiece", vocab_size=2048)


@pytest.mark.parametrize("nsp", [True, False])
def test_phases_switch_shapes_and_resume_exactly(tokenizer, nsp):
  cfg = _cfg(length_phases=((0.5, 32), (0.5, 64)))
  data = pipeline.build_pretraining_data(cfg, tokenizer, batch_size=4, seed=0, nsp=nsp,
                                         num_steps=6)
  assert data.stats["phases"] == [(3, 32, 5), (None, 64, 10)]
  it = iter(data.train)
  batches = [next(it) for _ in range(8)]
  assert [b["input_ids"].shape for b in batches] == [(4, 32)] * 3 + [(4, 64)] * 5
  assert [b["masked_lm_positions"].shape[1] for b in batches] == [5] * 3 + [10] * 5
  assert data.eval_batches[0]["input_ids"].shape == (4, 64)
  for stop in (2, 4):  # inside the first phase, inside the second
    it = iter(data.train)
    for _ in range(stop):
      next(it)
    state = it.get_state()
    fresh = iter(pipeline.build_pretraining_data(
        cfg, tokenizer, batch_size=4, seed=0, nsp=nsp, num_steps=6).train)
    fresh.set_state(state)
    for want in batches[stop:stop + 3]:
      got = next(fresh)
      for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_sampling_probabilities():
  q = multilingual.sampling_probabilities([900, 100], 0.3)
  expected = np.array([0.9, 0.1]) ** 0.3
  np.testing.assert_allclose(q, expected / expected.sum())
  assert 0.1 < q[1] < 0.5  # low-resource language up-sampled, but not to uniform
  np.testing.assert_allclose(multilingual.sampling_probabilities([900, 100], 1.0), [0.9, 0.1])
  np.testing.assert_allclose(multilingual.sampling_probabilities([900, 100], 0.0), [0.5, 0.5])
  assert multilingual.parse_languages("en=/a/*.txt, sw=tfds:x/y") == [
      ("en", "/a/*.txt"), ("sw", "tfds:x/y")]
  for bad in ("en", "en=/a,en=/b", "=x"):
    with pytest.raises(ConfigError):
      multilingual.parse_languages(bad)


def _write_language(path, word, docs, sentences=4):
  """A corpus whose every sentence repeats one made-up word (so ids tell languages)."""
  rng = np.random.default_rng(len(word))
  text = "\n\n".join("\n".join(" ".join([word] * int(rng.integers(5, 15)))
                               for _ in range(sentences)) for _ in range(docs))
  path.write_text(text + "\n")
  return str(path)


def test_multilingual_mixing(tmp_path):
  big = _write_language(tmp_path / "big.txt", "alpha", 300)
  small = _write_language(tmp_path / "small.txt", "zulu", 20)
  # Eq. 11.7 over sentences: 900 long and 100 short ones -> q from 900 : 100, not
  # from their characters (5 : 4 a sentence); characters and tokens on request.
  per_language = [["alpha"] * 900, ["zulu"] * 100]
  for counts, sizes in (("sentences", [900, 100]), ("characters", [900 * 5, 100 * 4]),
                        ("tokens", [900, 100])):
    texts = multilingual.sample_sentences(per_language, 0.3, 1000,
                                          np.random.default_rng(0), counts)
    q = multilingual.sampling_probabilities(sizes, 0.3)
    assert abs(texts.count("zulu") - q[1] * 1000) <= 1 and len(texts) == 1000
  tok = train_tokenizer(["alpha zulu " * 3] * 50, kind="wordpiece", vocab_size=64)
  alpha_id, zulu_id = tok.tokenize("alpha")[0], tok.tokenize("zulu")[0]
  cfg = _cfg(corpus="", languages=f"big={big},small={small}", max_seq_length=32)
  data = pipeline.build_pretraining_data(cfg, tok, batch_size=16, seed=0, nsp=False)
  weights = data.stats["language_weights"]
  q = multilingual.sampling_probabilities([300 * 4, 20 * 4], 0.3)  # sentences
  assert weights["small"] == round(q[1], 4) and q[1] > 0.2 > 20 / 320
  it = iter(data.train)
  ids = np.concatenate([next(it)["input_ids"] for _ in range(60)])  # [960, 32]
  alphas, zulus = (ids == alpha_id).sum(1), (ids == zulu_id).sum(1)
  # A row holds one language (the other's id only as a random replacement).
  assert (np.minimum(alphas, zulus) <= 3).all()
  assert abs(np.mean(zulus > alphas) - weights["small"]) < 0.05


def _phase_loop_config():
  c = tiny_config(num_steps=6, log_every=1, eval_every=6, checkpoint_every=4,
                  eval_batches=1)
  c.model.vocab_size = c.data.tokenizer.vocab_size = 512
  c.data.max_seq_length = 32
  c.data.max_predictions_per_seq = 4
  c.data.dupe_factor = 1
  c.data.length_phases = ((0.5, 16), (0.5, 32))
  return c


@pytest.fixture(scope="module")
def phase_run(tmp_path_factory):
  """6 steps straight: 3 at length 16, 3 at 32, a checkpoint at step 4 (phase two)."""
  workdir = str(tmp_path_factory.mktemp("phases"))
  return workdir, pretrain.run(_phase_loop_config(), workdir)


@pytest.mark.slow
def test_loop_switches_phases(phase_run):
  workdir, metrics = phase_run
  assert np.isfinite(metrics["mlm_loss"])
  assert sorted(train_losses(workdir)) == list(range(1, 7))


@pytest.mark.slow
def test_loop_resume_inside_second_phase_is_bit_exact(phase_run, tmp_path):
  """A restart from the step-4 checkpoint (second phase) gives steps 5-6 bit for bit."""
  straight, _ = phase_run
  workdir = str(tmp_path / "resumed")
  shutil.copytree(straight, workdir)
  for step in os.listdir(os.path.join(workdir, "checkpoints")):
    if step != "4":
      shutil.rmtree(os.path.join(workdir, "checkpoints", step))
  os.remove(os.path.join(workdir, "metrics.jsonl"))
  pretrain.run(_phase_loop_config(), workdir)
  resumed, expected = train_losses(workdir), train_losses(straight)
  assert sorted(resumed) == [5, 6]
  assert all(resumed[s] == expected[s] for s in resumed), (resumed, expected)
