"""Sequence-length phases (one stream, shapes switch at the phase boundary, exact
resume in either phase, held-out evaluation at each phase's length and theta and per
source) and multilingual sampling (q_i ~ p_i^alpha) in the pipeline, the tokenizer
corpus and the pretrain."""

import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertjax.data import held_out, mixture, multilingual, pipeline, tokenizer as tok_lib
from bertjax.data.tokenizer import train_tokenizer
from bertjax.errors import ConfigError
from bertjax.train import pretrain
from configs import bert_tiny, modernbert_tiny
from tests.helpers import tiny_config
from tests.test_loop import train_losses

BPE = os.path.join(os.path.dirname(__file__), "fixtures", "bpe")  # 600 tokens


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


@pytest.mark.parametrize("nsp, masking", [(True, "token"), (False, "token"),
                                          (False, "span")])
def test_phases_switch_shapes_and_resume_exactly(tokenizer, nsp, masking):
  """Each batch is the shape of its phase, every field as `pipeline.batch_spec` (what a
  plan compiles) says, and a restore in either phase replays."""
  cfg = _cfg(length_phases=((0.5, 32), (0.5, 64)), masking=masking)
  data = pipeline.build_pretraining_data(cfg, tokenizer, batch_size=4, seed=0, nsp=nsp,
                                         num_steps=6)
  assert data.stats["phases"] == [(3, 32, 5), (None, 64, 10)]
  it = iter(data.train)
  batches = [next(it) for _ in range(8)]
  assert [b["input_ids"].shape for b in batches] == [(4, 32)] * 3 + [(4, 64)] * 5
  assert [b["masked_lm_positions"].shape[1] for b in batches] == [5] * 3 + [10] * 5
  for b, (T, P) in zip(batches, [(32, 5)] * 3 + [(64, 10)] * 5):
    assert {k: (v.shape, v.dtype) for k, v in b.items()} == pipeline.batch_spec(
        cfg, nsp, 4, T, P)
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
  assert mixture.parse("en=/a/*.txt, sw=tfds:x/y", "languages", False) == [
      mixture.Source("en", "/a/*.txt"), mixture.Source("sw", "tfds:x/y")]
  for bad in ("en", "en=/a,en=/b", "=x", "en:0.5=/a,sw=/b"):
    with pytest.raises(ConfigError):
      mixture.parse(bad, "languages", False)


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
    q = multilingual.sampling_probabilities(
        [multilingual.text_size(s, counts) for s in per_language], 0.3)
    np.testing.assert_allclose(q, multilingual.sampling_probabilities(sizes, 0.3))
    texts = multilingual.sample_sentences(per_language, q, 1000, np.random.default_rng(0))
    assert abs(texts.count("zulu") - q[1] * 1000) <= 1 and len(texts) == 1000
  tok = train_tokenizer(["alpha zulu " * 3] * 50, kind="wordpiece", vocab_size=64)
  alpha_id, zulu_id = tok.tokenize("alpha")[0], tok.tokenize("zulu")[0]
  cfg = _cfg(corpus="", languages=f"big={big},small={small}", max_seq_length=32)
  data = pipeline.build_pretraining_data(cfg, tok, batch_size=16, seed=0, nsp=False)
  weights = data.stats["source_weights"]
  q = multilingual.sampling_probabilities([300 * 4, 20 * 4], 0.3)  # sentences
  assert weights["small"] == round(q[1], 4) and q[1] > 0.2 > 20 / 320
  it = iter(data.train)
  ids = np.concatenate([next(it)["input_ids"] for _ in range(60)])  # [960, 32]
  alphas, zulus = (ids == alpha_id).sum(1), (ids == zulu_id).sum(1)
  # A row holds one language (the other's id only as a random replacement).
  assert (np.minimum(alphas, zulus) <= 3).all()
  assert abs(np.mean(zulus > alphas) - weights["small"]) < 0.05


@pytest.fixture(scope="module")
def phase_corpus(tmp_path_factory, documents):
  """The embedded corpus as a mixture: half a Parquet file, half JSON lines."""
  root = tmp_path_factory.mktemp("phase_corpus")
  documents = [" ".join(d) for d in documents]
  half = len(documents) // 2
  pq.write_table(pa.table({"text": documents[:half]}), root / "general.parquet")
  with open(root / "domain.jsonl", "w") as f:
    f.writelines(json.dumps({"text": d}) + "\n" for d in documents[half:])
  return f"general:0.4={root / 'general.parquet'},domain:0.6={root / 'domain.jsonl'}"


def _phase_loop_config(corpus):
  c = tiny_config(num_steps=6, log_every=1, eval_every=3, checkpoint_every=4,
                  eval_batches=1)
  c.evals.eval.final_length = True
  c.model.vocab_size = c.data.tokenizer.vocab_size = 512
  c.data.corpus = corpus
  c.data.max_seq_length = 32
  c.data.max_predictions_per_seq = 4
  c.data.dupe_factor = 1
  c.data.length_phases = ((0.5, 16), (0.5, 32))
  return c


@pytest.fixture(scope="module")
def phase_run(tmp_path_factory, phase_corpus):
  """6 steps straight on a mixture of two sources: 3 at length 16, 3 at 32, evaluated
  every 3 steps, a checkpoint at step 4 (phase two)."""
  workdir = str(tmp_path_factory.mktemp("phases"))
  return workdir, pretrain.run(_phase_loop_config(phase_corpus), workdir)


def test_each_phase_holds_out_rows_of_its_length_and_theta():
  """ModernBERT's phases: the held-out batches of each length phase have its length,
  its predictions and its global rope theta; a step maps to the phase that trained it."""
  c = modernbert_tiny.get_config()
  c.model.update(vocab_size=600, hidden_size=32, num_layers=3, num_heads=2,
                 intermediate_size=48, max_position_embeddings=32, local_attention=8,
                 global_rope_theta_phases=(10_000.0, 160_000.0))
  c.data.update(max_seq_length=32, max_predictions_per_seq=4, eval_fraction=0.1,
                length_phases=((0.5, 16), (0.5, 32)))
  c.train.update(batch_size=8, num_steps=8)
  data = pipeline.build_pretraining_data(
      c.data, tok_lib.load_tokenizer(BPE), batch_size=8, seed=0, nsp=False,
      num_steps=8, phase_inputs=pretrain.phase_inputs(c))
  assert [(h.phase, h.first_step, h.length) for h in data.held_out] == [(0, 0, 16),
                                                                         (1, 4, 32)]
  for h, theta, predictions in zip(data.held_out, (1e4, 1.6e5), (2, 4)):
    batch = h.sources[""][0]
    assert batch["input_ids"].shape == (8, h.length)
    assert batch["masked_lm_positions"].shape == (8, predictions)
    np.testing.assert_array_equal(batch["global_rope_theta"], np.full(8, theta))
    assert h.describe() == {"seq_length": h.length, "global_rope_theta": theta}
  assert [held_out.phase_of(data.held_out, s).phase for s in range(1, 9)] == [0] * 4 + [1] * 4


@pytest.mark.slow
def test_loop_evaluates_each_phase_and_source_and_the_final_length(phase_run):
  """At step 3 'eval' runs at the first phase's 16 tokens and 'eval_final' at the
  final 32; at step 6 both at 32, the same figures. Each source has its own figures;
  the whole set's are their sums'."""
  workdir, _ = phase_run
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = {(r["split"], r["step"]): r for r in map(json.loads, f)}
  assert rows["eval", 3]["seq_length"] == 16 and rows["eval_final", 3]["seq_length"] == 32
  assert rows["eval", 6]["seq_length"] == 32
  assert rows["eval_final", 6] == {**rows["eval", 6], "split": "eval_final"}
  assert rows["eval", 3]["mlm_loss"] != rows["eval_final", 3]["mlm_loss"]
  for key in [("eval", 3), ("eval_final", 3), ("eval", 6)]:
    r = rows[key]
    for metric in ("mlm_accuracy", "mlm_loss", "nsp_accuracy"):
      values = [r[f"{name}/{metric}"] for name in ("general", "domain")]
      assert min(values) <= r[metric] <= max(values), (key, metric)


@pytest.mark.slow
def test_loop_switches_phases(phase_run):
  workdir, metrics = phase_run
  assert np.isfinite(metrics["mlm_loss"])
  assert sorted(train_losses(workdir)) == list(range(1, 7))


@pytest.mark.slow
def test_loop_resume_inside_second_phase_is_bit_exact(phase_run, phase_corpus, tmp_path):
  """A restart from the step-4 checkpoint (second phase) gives steps 5-6 bit for bit."""
  straight, _ = phase_run
  workdir = str(tmp_path / "resumed")
  shutil.copytree(straight, workdir)
  for step in os.listdir(os.path.join(workdir, "checkpoints")):
    if step != "4":
      shutil.rmtree(os.path.join(workdir, "checkpoints", step))
  os.remove(os.path.join(workdir, "metrics.jsonl"))
  pretrain.run(_phase_loop_config(phase_corpus), workdir)
  resumed, expected = train_losses(workdir), train_losses(straight)
  assert sorted(resumed) == [5, 6]
  assert all(resumed[s] == expected[s] for s in resumed), (resumed, expected)
