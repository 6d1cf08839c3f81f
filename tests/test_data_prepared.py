"""Prepared examples (`prepare --config`, `prepare_examples`): the offline builders match
the in-memory ones, the pipeline reads a prepared directory in place (only the rows it
trains on), its manifest is checked against the config, a rerun resumes."""

import glob
import json
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertjax.data import (builders, manifest, multilingual, permutation, phases, pipeline,
                          prepare, prepare_examples, prepare_tokens, rows as rows_lib, seeds)
from bertjax.data.tokenizer import load_tokenizer
from bertjax.errors import ConfigError, DataError
from configs import bert_tiny
from tests import extra_env
from tests.helpers import offsets

REPO = extra_env.REPO

T = 64


def _cfg(**kw):
  cfg = bert_tiny.get_config().data
  cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.dupe_factor = T, 10, 2
  for k, v in kw.items():
    setattr(cfg, k, v)
  return cfg


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tokenizer):
  """The embedded corpus tokenized twice: in shards of 60 documents (6 with pyenv's
  CPython 3.11.7, whose documentation gives 324 documents; Debian's python3.11 embeds
  291: 5) and in 1; its tokenizer saved."""
  root = tmp_path_factory.mktemp("prepared")
  tokenizer.save(str(root / "tok"))
  for name, chunk in (("tokens6", 60), ("tokens1", 1000)):
    prepare_tokens.prepare("embedded", str(root / "tok"), str(root / name), workers=1,
                    chunk_documents=chunk, progress=False)
  return root


@pytest.fixture(scope="module")
def train_docs(prepared):
  """The training split of the 6-shard directory, with random access."""
  documents = prepare_tokens.TokenizedDocuments(str(prepared / "tokens6"))
  return prepare_examples.SplitDocuments(documents, False, _cfg().eval_fraction,
                                       seeds.stream_seed(0, seeds.SPLIT, 0))


def test_tokenized_documents_keep_few_shards_open(prepared, monkeypatch):
  monkeypatch.setattr(prepare_tokens, "MAX_OPEN_SHARDS", 2)
  directory = str(prepared / "tokens6")
  in_order = list(prepare_tokens.read_documents(directory))
  documents = prepare_tokens.TokenizedDocuments(directory)
  for i in np.random.default_rng(0).permutation(len(in_order))[:200]:
    assert documents[i] == in_order[i]
  assert len(documents._readers) == 2  # pylint: disable=protected-access


def test_offline_nsp_pairs_are_berts_and_draw_b_from_every_shard(train_docs, tokenizer):
  """One shard's unit: A and B come from the documents they claim (B after A when it
  is the true next segment, another document when random), random Bs come from the
  other shards too; over all shards the pair statistics equal the in-memory
  builder's on the same documents."""
  rng = np.random.default_rng(0)
  third = train_docs.of_shard(2).tolist()
  ex = builders.nsp_examples_of(train_docs, third, tokenizer, max_seq_length=T,
                                   short_seq_prob=0.1, dupe_factor=1, rng=rng)
  other_shard = 0
  for i in range(len(ex)):
    ids, types = ex.input_ids[i, :ex.lengths[i]], ex.token_type_ids[i, :ex.lengths[i]]
    a_len = int((types == 0).sum())
    a, b = ids[1:a_len - 1], ids[a_len:-1]
    doc_a, doc_b = ex.source_documents[i]
    assert doc_a in third
    flat_a, flat_b = (np.concatenate(train_docs[d]) for d in (doc_a, doc_b))
    starts_a, starts_b = offsets(flat_a, a), offsets(flat_b, b)
    assert starts_a and starts_b
    if ex.next_sentence_labels[i] == 0:
      assert doc_a == doc_b and any(sb >= sa + len(a) for sa in starts_a for sb in starts_b)
    else:
      assert doc_a != doc_b
      other_shard += doc_b not in third
  assert other_shard > 0.5 * ex.next_sentence_labels.sum()

  # Three draws of each (a draw's count varies by about 1.5%), pooled.
  docs = [train_docs[k] for k in range(len(train_docs))]
  offline = [builders.nsp_examples_of(
      train_docs, train_docs.of_shard(s).tolist(), tokenizer, max_seq_length=T,
      short_seq_prob=0.1, dupe_factor=2, rng=np.random.default_rng([seed, s]))
      for seed in range(3) for s in range(train_docs.shards)]
  memory = [builders.create_nsp_examples(docs, tokenizer, max_seq_length=T,
                                         short_seq_prob=0.1, dupe_factor=2,
                                         rng=np.random.default_rng(seed))
            for seed in range(3)]
  lengths = np.concatenate([e.lengths for e in offline])
  labels = np.concatenate([e.next_sentence_labels for e in offline])
  memory_lengths = np.concatenate([e.lengths for e in memory])
  memory_labels = np.concatenate([e.next_sentence_labels for e in memory])
  assert abs(len(lengths) / len(memory_lengths) - 1) < 0.03
  assert abs(labels.mean() - memory_labels.mean()) < 0.02
  assert abs(lengths.mean() / memory_lengths.mean() - 1) < 0.02
  assert abs((lengths == T).mean() - (memory_lengths == T).mean()) < 0.03


@pytest.mark.parametrize("packing", ["full_sentences", "doc_sentences"])
def test_offline_packing_fills_rows_like_in_memory(train_docs, tokenizer, packing):
  docs = [train_docs[k] for k in range(len(train_docs))]
  shards = [[train_docs[k] for k in train_docs.of_shard(s)]
            for s in range(train_docs.shards)]
  memory = builders.create_packed_examples(docs, tokenizer, max_seq_length=T,
                                              packing=packing, isolate_documents=True)
  offline = [builders.create_packed_examples(d, tokenizer, max_seq_length=T,
                                                packing=packing, isolate_documents=True)
             for d in shards]
  fill = sum(e.lengths.sum() for e in offline) / sum(e.input_ids.size for e in offline)
  memory_fill = memory.lengths.sum() / memory.input_ids.size
  assert abs(fill - memory_fill) < 0.01
  if packing == "full_sentences":
    assert fill >= 0.99
  rows = np.concatenate([rows_lib.encode(e, tokenizer.word_starts(), np.dtype("<u2"))
                         for e in offline])
  decoded = rows_lib.decode(rows, isolate=True)
  if packing == "doc_sentences":  # one document a row
    assert (decoded["segment_ids"].max(1) == 1).all()
  else:
    assert (decoded["segment_ids"].max(1) > 1).mean() > 0.2
  body = decoded["input_ids"][decoded["attention_mask"] == 1]
  specials = np.isin(body, list(tokenizer.special_ids)).sum()
  assert len(body) - specials == sum(len(s) for d in docs for s in d)


def _examples(tokens, out, cfg, nsp=True):
  """`prepare_examples.build` of `cfg` in this process, at the row lengths of its length
  phases (split over 4 steps, as `prepare --config` has them from the config check)."""
  return prepare_examples.build(
      str(tokens), str(out), cfg, nsp=nsp, seed=0,
      lengths=phases.row_lengths(phases.length_phases(cfg, 4)), workers=0, progress=False)


def _build(prepared, name, tokens="tokens6", nsp=True, **cfg):
  out = prepared / name
  if not (out / manifest.MANIFEST).exists():
    _examples(prepared / tokens, out, _cfg(**cfg), nsp)
  return str(out)


def test_prepared_packed_pipeline_equals_the_in_memory_one(prepared, tokenizer):
  """One tokenized shard: the prepared rows are the in-memory rows, so training and
  evaluation batches (isolated documents, whole-word masks; held out at each phase's
  length) are the same bit for bit, and so are the global batches of 2 processes."""
  kw = dict(packing="full_sentences", length_phases=((0.5, 32), (0.5, 64)),
            isolate_documents=True, masking="whole_word")
  spec = _build(prepared, "packed1", "tokens1", nsp=False, **kw)
  args = dict(batch_size=4, seed=0, nsp=False, position_offset=2, num_steps=4)
  ours = pipeline.build_pretraining_data(_cfg(corpus=spec, **kw), tokenizer, **args)
  raw = pipeline.build_pretraining_data(_cfg(corpus="embedded", **kw), tokenizer, **args)
  assert ours.stats["prepared"] and not raw.stats["prepared"]
  for k in ("documents", "eval_documents", "train_examples", "eval_examples", "tokens",
            "padding_fraction", "phases"):
    assert ours.stats[k] == raw.stats[k], k
  assert ours.most_frequent_token == raw.most_frequent_token
  halves = [iter(pipeline.build_pretraining_data(
      _cfg(corpus=spec, **kw), tokenizer, **{**args, "batch_size": 2}, process_index=p,
      process_count=2).train) for p in (0, 1)]
  a, b = iter(ours.train), iter(raw.train)
  for batch in range(6):  # across the phase boundary (2 steps at 32)
    x, y = next(a), next(b)
    halves_x = [next(h) for h in halves]
    assert x.keys() == y.keys() and "segment_ids" in x
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=f"{k} of batch {batch}")
      np.testing.assert_array_equal(np.concatenate([h[k] for h in halves_x]), x[k],
                                    err_msg=f"{k} of global batch {batch}")
  for phase in (0, 1):  # each length phase's held-out rows (eval-32, eval-64)
    a, b = ours.held_out[phase].all(), raw.held_out[phase].all()
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
      assert x["input_ids"].shape[1] == (32, 64)[phase]
      for k in x:
        np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_each_process_reads_only_the_rows_it_trains_on(prepared, tokenizer, monkeypatch):
  """Starting reads nothing; then a process reads its own rows of the global shuffle
  (the batches it was fed, and a few it reads ahead), never another process's."""
  spec = _build(prepared, "nsp6")
  reads = []
  original = rows_lib.FileRows.read
  monkeypatch.setattr(rows_lib.FileRows, "read", lambda self, index: reads.append(
      (self, np.array(index))) or original(self, index))
  n = manifest.load(spec)["splits"]["train-64"]["examples"]
  b, taken, ahead = 4, 5, 12  # batch, batches taken, at most grain's read-ahead + threads
  read = {}
  for p in (0, 1):
    data = pipeline.build_pretraining_data(_cfg(corpus=spec), tokenizer, batch_size=b,
                                           seed=0, nsp=True, process_index=p,
                                           process_count=2)
    assert not reads
    it = iter(data.train)
    for _ in range(taken):
      next(it)
    blocks = 2 * np.arange(taken + ahead) + p  # this process's blocks of b elements
    g = (blocks[:, None] * b + np.arange(b)).ravel()
    own = permutation.permute(g, n, seeds.stream_seed(0, seeds.SHUFFLE, 0, 0))
    source = reads[0][0]
    batch = data.eval_batches[1]
    assert batch["input_ids"].shape == (b, T)
    assert [len(i) for s, i in reads if s is not source] == [b]  # one eval batch
    while True:  # until the read-ahead threads have filled their buffer
      count = len(reads)
      time.sleep(0.2)
      if len(reads) == count:
        break
    read[p] = np.concatenate([i for s, i in reads if s is source])
    assert set(own[:taken * b]) <= set(read[p]) <= set(own)
    reads.clear()
  assert not set(read[0]) & set(read[1])


def test_manifest_disagreement_is_one_config_error(prepared, tokenizer):
  spec = _build(prepared, "nsp6")
  cases = [(dict(dupe_factor=5), True, "dupe_factor=2 but this run has 5"),
           (dict(), False, "'nsp' examples but this run"),
           (dict(length_phases=((0.5, 32), (0.5, 64))), True, "no train-32"),
           (dict(eval_fraction=0.1), True, "eval_fraction"),
           (dict(line_breaks="apart"), True, "line_breaks='space' but this run has 'apart'")]
  for kw, nsp, message in cases:
    with pytest.raises(ConfigError, match=message) as e:
      pipeline.build_pretraining_data(_cfg(corpus=spec, **kw), tokenizer, batch_size=4,
                                      seed=0, nsp=nsp, num_steps=10)
    assert "\n" not in str(e.value)
  # Prepared before each phase was evaluated at its own length: no eval-32.
  info = manifest.load(spec)
  info["splits"]["train-32"] = info["splits"]["train-64"]
  with pytest.raises(ConfigError, match="no held-out rows eval-32 .*rerun the") as e:
    manifest.check(info, spec, _cfg(length_phases=((0.5, 32), (0.5, 64))),
                   info["tokenizer"]["fingerprint"], nsp=True, lengths=[32, 64])
  assert "\n" not in str(e.value)
  other = load_tokenizer(str(prepared / "tok"))
  other.vocab_size -= 1  # as if another vocabulary
  with pytest.raises(ConfigError, match="another tokenizer.*tokenizer.path="):
    pipeline.build_pretraining_data(_cfg(corpus=spec), other, batch_size=4, seed=0,
                                    nsp=True)


def test_rerun_resumes_and_refuses_other_settings(prepared, tokenizer):
  spec = _build(prepared, "nsp6")
  shard = os.path.join(spec, "train-64", "part-00002.rows")
  before = open(shard, "rb").read()
  manifest_before = json.loads(open(os.path.join(spec, manifest.MANIFEST)).read())
  os.remove(shard + ".json")  # as if killed while writing it: no manifest yet
  os.remove(shard)
  os.rename(os.path.join(spec, manifest.MANIFEST), os.path.join(spec, "manifest.old"))
  with pytest.raises(DataError, match="did not finish.*rerun the same"):
    pipeline.build_pretraining_data(_cfg(corpus=spec), tokenizer, batch_size=4, seed=0,
                                    nsp=True)
  out = _examples(prepared / "tokens6", spec, _cfg())
  assert open(shard, "rb").read() == before
  assert out["splits"] == manifest_before["splits"]
  assert out["documents"] == manifest_before["documents"]
  with pytest.raises(DataError, match="other settings: dupe_factor=3") as e:
    _examples(prepared / "tokens6", spec, _cfg(dupe_factor=3))
  assert "\n" not in str(e.value)


def test_held_out_split_is_the_in_memory_one(prepared, tokenizer):
  """The prepared held-out documents are the ones a raw run holds out, whatever the
  sharding; counts and the unigram statistics agree."""
  spec = _build(prepared, "nsp6")
  info = manifest.load(spec)
  raw = pipeline.build_pretraining_data(_cfg(corpus="embedded"), tokenizer, batch_size=4,
                                        seed=0, nsp=True)
  assert info["documents"]["eval"] == raw.stats["eval_documents"] == permutation.num_held_out(
      info["documents"]["total"], _cfg().eval_fraction)
  assert info["train_tokens"] == raw.stats["tokens"]
  assert info["most_frequent_token"] == raw.most_frequent_token


def test_remote_paths_read_through_epath(prepared, tokenizer, monkeypatch):
  spec = _build(prepared, "nsp6")
  local = next(iter(pipeline.build_pretraining_data(
      _cfg(corpus=spec), tokenizer, batch_size=4, seed=0, nsp=True).train))
  monkeypatch.setattr(rows_lib, "is_remote", lambda path: True)
  remote = next(iter(pipeline.build_pretraining_data(
      _cfg(corpus=spec), tokenizer, batch_size=4, seed=0, nsp=True).train))
  for k in local:
    np.testing.assert_array_equal(local[k], remote[k])


def test_raw_text_above_the_limit_asks_for_prepare(tmp_path, tokenizer):
  path = tmp_path / "big.txt"
  path.write_text("A sentence of the corpus. Another one here.\n\n" * 25000)
  with pytest.raises(DataError, match="more than config.data.raw_text_limit_mb=1 .*"
                     "bertjax.data.prepare") as e:
    pipeline.build_pretraining_data(_cfg(corpus=str(path), raw_text_limit_mb=1),
                                    tokenizer, batch_size=4, seed=0, nsp=True)
  assert "\n" not in str(e.value)


def test_prepared_stream_restores_and_mixes_languages_by_sentences(prepared, tokenizer,
                                                                   tmp_path):
  """A prepared language next to a raw one: weights from each corpus's sentences
  (eq. 11.7); the stream's state restores it exactly, on 1 process or 2."""
  spec = _build(prepared, "nsp6")
  small = tmp_path / "small.txt"
  small.write_text("\n\n".join("The first sentence is here. A second one follows. "
                               f"Then number {i}." for i in range(40)) + "\n")
  cfg = _cfg(corpus="", languages=f"big={spec},small={small}")
  data = pipeline.build_pretraining_data(cfg, tokenizer, batch_size=4, seed=0, nsp=True)
  q = multilingual.sampling_probabilities([manifest.load(spec)["text"]["sentences"], 120],
                                          0.3)
  assert data.stats["source_weights"] == {"big": round(q[0], 4), "small": round(q[1], 4)}
  it = iter(data.train)
  for _ in range(3):
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(3)]
  again = iter(pipeline.build_pretraining_data(cfg, tokenizer, batch_size=4, seed=0,
                                               nsp=True).train)
  again.set_state(state)
  for want in expected:
    got = next(again)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  # On 2 processes (batches of 2, from the same state): the same global batches.
  halves = [iter(pipeline.build_pretraining_data(cfg, tokenizer, batch_size=2, seed=0,
                                                 nsp=True, process_index=p,
                                                 process_count=2).train) for p in (0, 1)]
  for half in halves:
    half.set_state(state)
  for want in expected:
    got = [next(half) for half in halves]
    for k in want:
      np.testing.assert_array_equal(np.concatenate([g[k] for g in got]), want[k],
                                    err_msg=k)


def _files(root):
  """{relative path: bytes} of every file under `root`."""
  return {os.path.relpath(os.path.join(d, n), root): open(os.path.join(d, n), "rb").read()
          for d, _, names in os.walk(root) for n in names}


@pytest.fixture(scope="module")
def beam_python():
  """The python of the Beam environment (tests/extra_env.py: built once, then cached)."""
  return extra_env.fixture_python(
      "beam", "import json, apache_beam, google.protobuf as p; print(json.dumps("
      "{'apache_beam': apache_beam.__version__, 'protobuf': p.__version__}))")


def _prepare(python, *flags):
  """`python -m bertjax.data.prepare FLAGS` from the repository root (this checkout's
  bertjax first on the path, for the Beam workers too)."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [REPO, *filter(None, [os.environ.get("PYTHONPATH")])]))
  out = subprocess.run([python, "-m", "bertjax.data.prepare", *flags], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  return out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nsp", "parquet"])
def test_beam_writes_the_shards_and_manifest_of_the_worker_pool(prepared, beam_python,
                                                                 documents, name):
  """`prepare --config` on Apache Beam (DirectRunner, two SDK worker processes, in the
  Beam environment: apache-beam, protobuf<7) and on the worker pool (--workers=2, this
  environment) write the same files byte for byte, and the same manifests and summaries
  but their wall time and own paths: NSP pairs over two length phases from a tokenized
  directory; packed rows of a Parquet corpus (stage 1, on the worker pool either way,
  reads it a row group at a time into OUTPUT/tokens). (A mixture prepares each source
  so: tests/test_data_mixture.py.)"""
  flags = ["--config=configs/bert_tiny.py", f"--config.data.max_seq_length={T}",
           "--config.data.max_predictions_per_seq=10", "--config.data.dupe_factor=2"]
  if name == "nsp":
    flags += [f"--input={prepared / 'tokens6'}", "--config.objectives=('mlm','nsp')",
              f"--config.data.length_phases=((0.5,32),(0.5,{T}))"]
  else:
    pq.write_table(pa.table({"text": [" ".join(d) for d in documents]}),
                   prepared / "corpus.parquet", row_group_size=50)
    flags += ["--config.objectives=('mlm',)", f"--tokenizer={prepared / 'tok'}",
              f"--input={prepared / 'corpus.parquet'}"]
  pool, beam = (prepared / f"{name}_pool", prepared / f"{name}_beam")
  _prepare(sys.executable, *flags, f"--output={pool}", "--workers=2")
  printed = _prepare(beam_python, *flags, f"--output={beam}", "--runner=DirectRunner",
                     "--beam_pipeline_options=direct_num_workers=2,"
                     "direct_running_mode=multi_processing")
  assert f"--config.data.corpus={beam}" in printed
  ours, theirs = _files(beam), _files(pool)
  assert sorted(ours) == sorted(theirs)
  shards = [p for p in ours if p.endswith(rows_lib.SUFFIX)]
  # The tokenized shards (6 of the 324 documents python3.11's sources embed; 5 of
  # Debian's 291) x 4 splits; 1 tokenized shard (the Parquet corpus) x 2 splits.
  tokenized = len(glob.glob(str(prepared / "tokens6" / "part-*.array_record")))
  assert tokenized >= 5 and len(shards) == (tokenized * 4 if name == "nsp" else 2)
  own = lambda blob: {**json.loads(blob), "seconds": 0, "input": 0}  # wall time, paths
  for path in ours:
    if path.endswith(".json") and os.path.basename(path) in (
        manifest.MANIFEST, manifest.SETTINGS, manifest.SUMMARY):
      assert own(ours[path]) == own(theirs[path]), path
    else:
      assert ours[path] == theirs[path], path
  built = json.loads(ours[manifest.MANIFEST])
  assert built["builder"] == ("nsp" if name == "nsp" else "full_sentences")
  assert ("eval-32" in built["splits"]) == (name == "nsp")


def test_beam_runner_without_beam_is_one_config_error(prepared, monkeypatch):
  monkeypatch.setitem(sys.modules, "apache_beam", None)  # as if not installed
  monkeypatch.delitem(sys.modules, "bertjax.data.prepare_beam", raising=False)
  monkeypatch.delattr(sys.modules["bertjax.data"], "prepare_beam", raising=False)
  config = bert_tiny.get_config()
  with pytest.raises(ConfigError, match=r"--runner needs Apache Beam: pip install") as e:
    list(prepare.prepare_config(config, input_spec=str(prepared / "tokens6"),
                                    tokenizer_path=None, output=str(prepared / "no"),
                                    workers=0, runner="DirectRunner"))
  assert "\n" not in str(e.value)


def test_a_chunks_records_are_each_documents_encode_document():
  """Stage 1 writes a chunk's records from its flat ids at once (`encode_documents`):
  each is `encode_document` of the document's non-empty units, a document of none
  written not at all."""
  rng = np.random.default_rng(0)
  units = np.array([3, 0, 2, 1, 4, 2, 1], np.int64)
  lengths = rng.integers(0, 4, int(units.sum())).astype(np.int64)
  lengths[3:5] = 0  # the third document: empty units only
  ids = rng.integers(0, 50, int(lengths.sum())).astype(np.int32)
  word_starts = rng.random(50) < 0.5
  records, kept = prepare_tokens.encode_documents(ids, lengths, units, word_starts)
  pieces = np.split(ids, np.cumsum(lengths)[:-1])
  expected, u = [], 0
  for n in units:
    sentences = [p for p in pieces[u:u + n] if len(p)]
    u += n
    if sentences:
      expected.append(prepare_tokens.encode_document(sentences, word_starts))
  assert records == expected and len(records) < len(units)
  np.testing.assert_array_equal(kept, lengths > 0)
