"""Weighted mixtures of corpora (`bertjax.data.mixture`): the syntax and its one-line
errors, an interleaving that holds its weights at every scale, a mixed stream that is
exact on restore and on any process count, read the same from raw and prepared
sources, and held out and evaluated per source (and per length phase); sources that
join or leave by phase (`config.data.source_phases`), exact within every phase."""

import json
import os
import signal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from bertjax import model as model_lib
from bertjax.data import mixture, pipeline, prepare
from bertjax.data.tokenizer import train_tokenizer
from bertjax.errors import ConfigError
from bertjax.train import pretrain
from configs import bert_tiny
from tests import faults
from tests.helpers import tiny_config

WORDS = {"general": "alpha", "domain": "zulu"}


def _cfg(**kw):
  cfg = bert_tiny.get_config().data
  cfg.update(max_seq_length=32, max_predictions_per_seq=5, eval_fraction=0.1,
             packing="full_sentences")
  cfg.update(kw)
  return cfg


def _one_line(error, call, match):
  with pytest.raises(error, match=match) as e:
    call()
  assert "\n" not in str(e.value)


def test_syntax_and_its_errors():
  spec = "general:0.3=gs://b/lang=en/*.parquet,domain:7e-1=/data/notes/x.jsonl.zst"
  assert mixture.is_mixture(spec)
  assert mixture.sources_of(_cfg(corpus=spec)) == [
      mixture.Source("general", "gs://b/lang=en/*.parquet", 0.3),
      mixture.Source("domain", "/data/notes/x.jsonl.zst", 0.7)]
  for plain in ("gs://b/lang=en/*.parquet", "/data/a:1=b", "tfds:c4/en:train", "embedded"):
    assert not mixture.is_mixture(plain)
    assert mixture.sources_of(_cfg(corpus=plain)) == [mixture.Source("", plain)]
  assert mixture.spec_of(mixture.sources_of(_cfg(corpus=spec))) == spec.replace("7e-1", "0.7")
  np.testing.assert_allclose(mixture.weights(mixture.parse("a:3=x,b:1=y", "corpus", True),
                                             [1, 1], 0.3), [0.75, 0.25])
  for bad, match in [("general:0=/a,domain:1=/b", "weight 0; weights must be positive"),
                     ("general:-0.3=/a,domain:1=/b", "weight -0.3"),
                     ("general:0.3=/a,domain=/b", "is not NAME:WEIGHT=CORPUS"),
                     ("general:0.3=/a,general:0.7=/b", "repeat a name"),
                     ("general:0.3=", "names no corpus")]:
    _one_line(ConfigError, lambda: mixture.sources_of(_cfg(corpus=bad)), match)
  _one_line(ConfigError, lambda: mixture.sources_of(_cfg(corpus="x", languages="en=/a")),
            "both name corpora")
  _one_line(ConfigError, lambda: mixture.sources_of(_cfg(corpus="", languages="en:1=/a,sw=/b")),
            "a weight to every source or to none")


@pytest.mark.parametrize("weights", [(0.3, 0.7), (0.5, 0.3, 0.2), (0.01, 0.99)])
def test_interleave_holds_the_weights_at_every_scale(weights):
  """Each source's count among the first n elements is within K of n * w_i for every
  n, and an element's index in its source is that source's count before it; far out
  in the stream too."""
  w = np.array(weights)
  select = mixture.Interleave(weights)
  picks = np.array([select[k] for k in range(20_000)])
  counts = np.zeros(len(w), int)
  for n, (i, j) in enumerate(picks):
    assert j == counts[i]
    counts[i] += 1
    assert (np.abs(counts - (n + 1) * w) < len(w)).all(), (n, counts)
  for k in (10**9 + 7, 3 * 10**15):  # a restore deep into a long run: the same rule
    i, j = select[k]
    assert abs(j - k * w[i]) < len(w)


def test_phased_interleave_reads_every_source_element_once_exact_in_each_phase():
  """Sources joining and leaving at segment boundaries: each source's elements come in
  order 0, 1, 2, ... across the whole stream (none read twice, none skipped), and within
  each segment the counts hold its weights as `Interleave` does from its start."""
  segments = [(0, (1.0, 0.0, 0.0)), (100, (0.5, 0.5, 0.0)), (250, (0.2, 0.3, 0.5)),
              (400, (0.0, 0.4, 0.6))]
  select = mixture.PhasedInterleave(segments)
  picks = [select[k] for k in range(600)]
  seen = [0, 0, 0]
  for i, j in picks:
    assert j == seen[i]
    seen[i] += 1
  ends = [e for e, _ in segments[1:]] + [600]
  for (start, w), end in zip(segments, ends):
    counts = np.zeros(3, int)
    for n, (i, _) in enumerate(picks[start:end]):
      counts[i] += 1
      assert (np.abs(counts - (n + 1) * np.array(w)) < 3).all(), (start, n, counts)
  far = 10**12
  i, j = select[far]
  assert i in (1, 2) and abs(j - (seen[i] + (far - 600) * segments[-1][1][i])) < 3
  for bad, match in [([(5, (1.0, 1.0))], "start at element 0"),
                     ([(0, (1.0, 1.0)), (0, (1.0, 0.0))], "ascend"),
                     ([(0, (0.0, 0.0))], "no source with weight")]:
    _one_line(ConfigError, lambda bad=bad: mixture.PhasedInterleave(bad), match)


def test_source_phases_syntax_and_its_errors(corpora):
  _, spec, tok = corpora
  phases = pipeline.phases_lib.source_phases(_cfg(corpus=spec, source_phases=(
      (0.4, "general"), (0.35, "domain:1,general:3"), (0.25, "", 0.5))), 20,
      ["general", "domain"])
  assert [(p.first_step, p.names, p.weights, p.alpha) for p in phases] == [
      (0, ("general",), None, 0.3), (8, ("general", "domain"), (3.0, 1.0), 0.3),
      (15, ("general", "domain"), None, 0.5)]
  model = model_lib.config_from(tiny_config().model)
  for bad, match in [
      (((0.5, "general"), (0.4, "")), "fractions sum to 0.9"),
      (((0.5, "general"), (0.5, "fr")), r"sources \['fr'\] are not the run's sources"),
      (((0.5, "general,general"), (0.5, "")), "a source repeats"),
      (((0.5, "general:1,domain"), (0.5, "")), "positive weight, or none"),
      (((0.5, "general:1,domain:2", 0.3), (0.5, "")), "positive weight, or none"),
      (((0.5, "general:-1"), (0.5, "")), "positive weight"),
      (((1.5, "general"),), "write \\(fraction"),
      (((1.0, "", 2.0),), "alpha in \\[0, 1\\]")]:
    _one_line(ConfigError, lambda bad=bad: pipeline.check_config(
        _cfg(corpus=spec, source_phases=bad), model, 20), match)
  _one_line(ConfigError, lambda: pipeline.check_config(
      _cfg(source_phases=((1.0, ""),)), model, 20), "needs several sources")


def test_sources_join_by_phase_exact_on_restore_and_process_count(corpora):
  """'domain' absent for the first 40% of the steps, then both 1 : 3, then by size at
  alpha 0.5, across a length phase boundary: every row's source is the phased
  interleaving of each length phase's stream, a restore inside any phase replays it, and
  two processes read the same global batches."""
  _, spec, tok = corpora
  cfg = _cfg(corpus=spec, length_phases=((0.5, 16), (0.5, 32)), max_predictions_per_seq=5,
             source_phases=((0.4, "general"), (0.3, "domain:1,general:3"), (0.3, "", 0.5)))
  data = _build(cfg, tok, num_steps=10)
  (_, first), (_, second), (_, third) = data.stats["source_phases"]
  assert first == {"general": 1.0} and second == {"general": 0.75, "domain": 0.25}
  assert set(third) == {"general", "domain"} and abs(sum(third.values()) - 1) < 1e-3
  it = iter(data.train)
  batches = [next(it) for _ in range(12)]
  rows = [_source_of_rows(b, tok) for b in batches]
  third_w = (third["general"], third["domain"])
  # Length phase 0 (steps 0-4, 8 rows): general for 4 steps, then 3 : 1 from row 32;
  # length phase 1 (steps 5-): 3 : 1 until step 7, then the third phase's weights.
  streams = [mixture.PhasedInterleave([(0, (1.0, 0.0)), (32, (0.75, 0.25))]),
             mixture.PhasedInterleave([(0, (0.75, 0.25)), (16, third_w)])]
  want = [[streams[0][k][0] for k in range(8 * s, 8 * s + 8)] for s in range(5)] + [
      [streams[1][k][0] for k in range(8 * s, 8 * s + 8)] for s in range(7)]
  for step, (got, w) in enumerate(zip(rows, want)):
    np.testing.assert_array_equal(got, w, err_msg=f"step {step}")
  assert not any(rows[s].any() for s in range(4)) and all(rows[s].any() for s in (4, 7))
  for restore_at in (2, 4, 6, 8):
    it = iter(data.train)
    for _ in range(restore_at):
      next(it)
    state = it.get_state()
    halves = [iter(_build(cfg, tok, num_steps=10, batch_size=4, process_index=p,
                          process_count=2).train) for p in (0, 1)]
    again = iter(_build(cfg, tok, num_steps=10).train)
    for x in [again, *halves]:
      x.set_state(state)
    for want_batch in batches[restore_at:restore_at + 2]:
      got, parts = next(again), [next(h) for h in halves]
      for k in want_batch:
        np.testing.assert_array_equal(got[k], want_batch[k], err_msg=k)
        np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), want_batch[k])
  # Held out per source in every length phase, 'domain' too (it joins at step 4).
  assert all(list(h.sources) == ["general", "domain"] for h in data.held_out)


def _sentences(word, n, rng):
  return [" ".join([word] * int(rng.integers(3, 8))) + " ." for _ in range(n)]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
  """'general' as Parquet (40 documents), 'domain' as Dolma-style .jsonl.zst (25), each
  document 3 sentences of its source's one word; a tokenizer of both words."""
  root = tmp_path_factory.mktemp("mixture")
  rng = np.random.default_rng(0)
  docs = {name: [" ".join(_sentences(word, 3, rng)) for _ in range(n)]
          for (name, word), n in zip(WORDS.items(), (40, 25))}
  pq.write_table(pa.table({"text": docs["general"]}), root / "general.parquet",
                 row_group_size=8)
  lines = "".join(json.dumps({"text": t}) + "\n" for t in docs["domain"]).encode()
  (root / "domain.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
  tok = train_tokenizer(["alpha zulu ."] * 50, kind="wordpiece", vocab_size=64)
  tok.save(str(root / "tok"))
  spec = f"general:0.3={root / 'general.parquet'},domain:0.7={root / 'domain.jsonl.zst'}"
  return root, spec, tok


def _source_of_rows(batch, tok):
  """Per row: 0 if it holds 'alpha' tokens, 1 if 'zulu' ones (rows hold one source)."""
  ids = batch["input_ids"]
  alpha, zulu = ((ids == tok.tokenize(w)[0]).sum(1) for w in WORDS.values())
  assert (np.minimum(alpha, zulu) <= 2).all()  # (the other word only as a random swap)
  return (zulu > alpha).astype(int)


def _build(cfg, tok, **kw):
  args = dict(batch_size=8, seed=0, nsp=False, num_steps=10)
  return pipeline.build_pretraining_data(cfg, tok, **{**args, **kw})


def test_mixed_stream_is_the_interleaving_exact_on_restore_and_process_count(corpora):
  _, spec, tok = corpora
  cfg = _cfg(corpus=spec)
  data = _build(cfg, tok)
  assert data.stats["source_weights"] == {"general": 0.3, "domain": 0.7}
  it = iter(data.train)
  batches = [next(it) for _ in range(12)]
  rows = np.concatenate([_source_of_rows(b, tok) for b in batches])
  select = mixture.Interleave((0.3, 0.7))
  np.testing.assert_array_equal(rows, [select[k][0] for k in range(len(rows))])
  it = iter(data.train)
  for _ in range(5):
    next(it)
  state = it.get_state()
  again = iter(_build(cfg, tok).train)
  again.set_state(state)
  halves = [iter(_build(cfg, tok, batch_size=4, process_index=p, process_count=2).train)
            for p in (0, 1)]
  for half in halves:
    half.set_state(state)
  for want in batches[5:9]:
    got, parts = next(again), [next(h) for h in halves]
    for k in want:
      np.testing.assert_array_equal(got[k], want[k], err_msg=k)
      np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), want[k])


def test_each_source_is_held_out_and_evaluated_on_its_own(corpora):
  _, spec, tok = corpora
  data = _build(_cfg(corpus=spec), tok)
  (held,) = data.held_out
  sets = held.sources
  assert list(sets) == ["general", "domain"]
  for k, (name, batches) in enumerate(sets.items()):
    for batch in batches:
      real = batch["example_weights"] > 0
      assert (_source_of_rows(batch, tok)[real] == k).all(), name
  # Together they are the whole held-out set, masks included.
  whole = data.eval_batches
  assert all(len(rows) for rows in held.rows.values())
  assert data.stats["eval_examples"] == len(held)
  got = np.concatenate([b["masked_lm_ids"][b["example_weights"] > 0]
                        for s in sets.values() for b in s])
  want = np.concatenate([b["masked_lm_ids"][b["example_weights"] > 0] for b in whole])
  np.testing.assert_array_equal(got, want)


def test_prepared_mixture_reads_as_the_raw_one(corpora, tmp_path):
  """`prepare --config` with the mixture prepares each source into OUTPUT/NAME and
  prints the mixture to train with; the batches and held-out sets are the raw ones."""
  root, spec, tok = corpora
  config = bert_tiny.get_config()
  config.objectives = ("mlm",)
  config.data = _cfg(corpus=spec)
  config.data.tokenizer.path = str(root / "tok")
  out = str(tmp_path / "prepared")
  lines = list(prepare.prepare_config(config, input_spec=None, tokenizer_path=None,
                                      output=out, workers=0))
  prepared_spec = f"general:0.3={out}/general,domain:0.7={out}/domain"
  assert lines[-1] == (f"train with --config.data.corpus='{prepared_spec}' "
                       f"--config.data.tokenizer.path={out}/general/tokenizer")
  ours, raw = _build(_cfg(corpus=prepared_spec), tok), _build(_cfg(corpus=spec), tok)
  assert ours.stats["prepared"] and not raw.stats["prepared"]
  a, b = iter(ours.train), iter(raw.train)
  for _ in range(6):
    x, y = next(a), next(b)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)
  # Sources joining by phase read the prepared sources as the raw ones too.
  by_phase = dict(source_phases=((0.3, "domain"), (0.7, "")))
  a = iter(_build(_cfg(corpus=prepared_spec, **by_phase), tok).train)
  b = iter(_build(_cfg(corpus=spec, **by_phase), tok).train)
  for _ in range(6):
    x, y = next(a), next(b)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)
  for name, batches in raw.held_out[0].sources.items():
    for x, y in zip(ours.held_out[0].sources[name], batches):
      for k in x:
        np.testing.assert_array_equal(x[k], y[k], err_msg=f"{name} {k}")
  assert os.path.isdir(os.path.join(out, "domain", "eval-32"))


def test_a_trained_tokenizer_sees_the_mixture_by_weight(corpora):
  """Trained on a mixture, a tokenizer reads about as many sentences as the sources
  hold (40 + 25 documents of one sentence: no capital letter starts another), drawn
  0.3 : 0.7."""
  _, spec, _ = corpora
  sentences = mixture.tokenizer_sentences(_cfg(corpus=spec), seed=0)
  assert sum("alpha" in s for s in sentences) == round(0.3 * 65)
  assert sum("zulu" in s for s in sentences) == round(0.7 * 65)


def test_tokenizer_sentences_are_a_bounded_sample_streamed(monkeypatch, caplog):
  """A corpus too large to hold, streamed by a generator that fails when read past
  config.data.tokenizer.read_sentences: the tokenizer (and a vocabulary extension)
  gets sample_sentences of them, drawn from all that were read (not the first ones),
  and the log says how many of how many; a mixture's sample keeps its weights."""
  read = {}

  def documents(spec, text_field="text", data_dir=None, line_breaks="space"):
    del text_field, data_dir, line_breaks
    read[spec] = 0
    while True:
      if read[spec] == 1_000:
        pytest.fail(f"{spec} read past config.data.tokenizer.read_sentences")
      read[spec] += 1
      yield [f"{spec} number {read[spec]}."]

  monkeypatch.setattr(mixture.sources_lib, "iter_documents", documents)
  caplog.set_level("INFO")
  cfg = _cfg(corpus="/big")
  cfg.tokenizer.update(sample_sentences=50, read_sentences=1_000)
  sentences = mixture.tokenizer_sentences(cfg, seed=0)
  numbers = [int(s.split()[-1].rstrip(".")) for s in sentences]
  assert len(set(numbers)) == 50 and read == {"/big": 1_000}
  assert max(numbers) > 500 and sorted(numbers) != list(range(1, 51))
  assert "Tokenizer sentences: 50 sampled of 1,000 read (at most" in caplog.text
  sentences = mixture.tokenizer_sentences(_cfg(corpus="general:0.3=/g,domain:0.7=/d",
                                               tokenizer=cfg.tokenizer), seed=0)
  assert (sum(s.startswith("/g") for s in sentences),
          sum(s.startswith("/d") for s in sentences)) == (15, 35)
  assert "50 sampled of 2,000 read (general 1,000, domain 1,000)" in caplog.text


@pytest.mark.slow
def test_a_mixture_run_stopped_by_sigterm_resumes_exactly(corpora, on_train_batch, tmp_path):
  """A pretraining run on the 0.3 : 0.7 mixture stopped by SIGTERM before step 3 and
  rerun ends with the uninterrupted run's metrics (each source's held-out ones too) and
  state, bit for bit: the mixed stream resumes where it stopped."""
  root, spec, tok = corpora
  c = tiny_config(num_steps=6, eval_every=6, checkpoint_every=2, log_every=1,
                  eval_batches=1)
  c.objectives = ("mlm",)
  c.data.update(corpus=spec, packing="full_sentences", max_predictions_per_seq=3)
  c.data.tokenizer.path, c.model.vocab_size = str(root / "tok"), tok.vocab_size
  reference, stopped = str(tmp_path / "reference"), str(tmp_path / "stopped")
  pretrain.run(c, reference)
  on_train_batch(lambda n, _: n == 3 and os.kill(os.getpid(), signal.SIGTERM))
  pretrain.run(c, stopped)
  assert int(faults.saved_state(stopped)["step"]) == 3
  on_train_batch(lambda n, _: None)
  pretrain.run(c, stopped)
  faults.assert_same_metrics(stopped, reference)
  assert {"eval/general/mlm_loss", "eval/domain/mlm_loss"} <= {
      f"{r['split']}/{k}" for r in faults.metrics(reference) for k in r}
  faults.assert_same_arrays(faults.saved_state(stopped), faults.saved_state(reference))
