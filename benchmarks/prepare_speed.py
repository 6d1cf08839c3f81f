"""Stage 1 of `python -m bertjax.data.prepare` (text -> token shards) against the
tokenizer library alone on the same text (issue 59): how near the tokenizer's own speed
preparing runs, for each tokenizer kind, on one worker and on several.

  taskset -c 0 python -m benchmarks prepare_speed --mb=24 --workers=1 --passes=3
  python -m benchmarks prepare_speed --mb=24 --workers=1,2 --passes=3  # a quiet machine

The text: the docstrings of the installed Python (`docstrings.documents`, layout
'lines': a document a docstring, a line each of its lines, documents apart by a blank
line, as a BERT corpus file is) until --mb MB. Each kind's tokenizer is trained on its
first --train_mb MB (`train_tokenizer`, --vocab_size). Then, alternating for --passes
passes:
- `tokenizer`: the library alone (`tokenizers` encode_batch_fast, `sentencepiece`
  encode) on each document's text as the file holds it, in this process: its CPU
  seconds (time.process_time, every thread of the library's);
- `prepare_wN`: `prepare_tokens.prepare` into a fresh folder with N workers (reading the
  file, splitting sentences, tokenizing, writing the shards and their counts): its CPU
  seconds (this process and its workers, which exit before it returns) and wall seconds.
CPU seconds count every thread, so a library's threads that wait on a busy machine
inflate them: measure the speed per core under `taskset -c 0` (the library's threads and
the workers on one core; rayon and sentencepiece then start one thread), and the wall
speed-up of more workers on a quiet machine. Printed per kind: the median pass's seconds, stage 1's speed as a share of the
tokenizer's (CPU seconds of the tokenizer / CPU seconds of prepare: 1.0 is the
library's own speed per core), each worker count's wall-clock speed-up over one; results
as JSON in --out.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import tempfile
import time

from absl import flags

from benchmarks import docstrings

KINDS = ("wordpiece", "byte_level_bpe", "sentencepiece")


def define_flags() -> None:
  flags.DEFINE_float("mb", 24, "MB of docstring text.")
  flags.DEFINE_float("train_mb", 2, "MB of it each tokenizer is trained on.")
  flags.DEFINE_integer("vocab_size", 30000, "Each tokenizer's vocabulary.")
  flags.DEFINE_list("kinds", list(KINDS), f"Tokenizer kinds, of {KINDS}.")
  flags.DEFINE_list("workers", ["1", "2"], "prepare's --workers, each measured.")
  flags.DEFINE_integer("passes", 3, "Alternating passes of each path.")
  flags.DEFINE_string("dir", "", "Scratch folder (default: a temporary one).")
  flags.DEFINE_string("out", "", "Write the results as JSON here too.")


def _cpu() -> float:
  """CPU seconds of this process and its waited-for children, every thread."""
  me = resource.getrusage(resource.RUSAGE_SELF)
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def _bare(library, texts: list[str]) -> int:
  """The library alone on `texts`; returns the tokens."""
  if isinstance(library, bytes):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    sp = spm.SentencePieceProcessor(model_proto=library)
    return sum(map(len, sp.encode(texts)))
  return sum(len(e.ids) for e in library.encode_batch_fast(texts, add_special_tokens=False))


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  from bertjax.data import prepare_tokens  # pylint: disable=g-import-not-at-top
  from bertjax.data.tokenizer import load_tokenizer, train_tokenizer  # pylint: disable=g-import-not-at-top
  unknown = sorted(set(f.kinds) - set(KINDS))
  if unknown:
    raise SystemExit(f"--kinds: unknown {unknown}; use {KINDS}.")
  workers = [int(w) for w in f.workers]
  scratch = f.dir or tempfile.mkdtemp(prefix="prepare_speed_")
  os.makedirs(scratch, exist_ok=True)
  docs = docstrings.documents(docstrings.roots(["all"]), layout="lines",
                              max_bytes=int(f.mb * 2**20))
  corpus = os.path.join(scratch, "corpus.txt")
  with open(corpus, "w", encoding="utf-8") as fh:
    fh.write("\n\n".join(docs) + "\n")
  size = os.path.getsize(corpus)
  train_lines, n = [], 0
  for d in docs:
    train_lines += d.split("\n")
    n += len(d.encode())
    if n >= f.train_mb * 2**20:
      break
  print(f"corpus: {len(docs)} documents, {size / 2**20:.1f} MB; {corpus}", flush=True)
  results = {"documents": len(docs), "bytes": size, "cpus": os.cpu_count(), "kinds": {}}
  for kind in f.kinds:
    tok_dir = os.path.join(scratch, f"tok_{kind}")
    train_tokenizer(train_lines, kind=kind, vocab_size=f.vocab_size).save(tok_dir)
    library = load_tokenizer(tok_dir).library
    runs = {"tokenizer": []} | {f"prepare_w{w}": [] for w in workers}
    tokens = 0
    for _ in range(f.passes):
      start = _cpu()
      tokens = _bare(library, docs)
      runs["tokenizer"].append({"cpu_s": _cpu() - start})
      for w in workers:
        out = os.path.join(scratch, f"shards_{kind}_w{w}")
        shutil.rmtree(out, ignore_errors=True)
        start, wall = _cpu(), time.perf_counter()
        summary = prepare_tokens.prepare(corpus, tok_dir, out, workers=w, progress=False)
        runs[f"prepare_w{w}"].append({"cpu_s": _cpu() - start,
                                      "wall_s": time.perf_counter() - wall})
    median = {k: {m: statistics.median(r[m] for r in v) for m in v[0]}
              for k, v in runs.items()}
    bare = median["tokenizer"]["cpu_s"]
    one = median[f"prepare_w{workers[0]}"]["wall_s"]
    row = {"tokens_tokenizer": tokens, "tokens_prepare": summary["tokens"], "median": median,
           "passes": runs,
           "share_of_tokenizer_speed": {k: round(bare / v["cpu_s"], 2)
                                        for k, v in median.items() if k != "tokenizer"},
           "wall_speedup": {k: round(one / v["wall_s"], 2)
                            for k, v in median.items() if k != "tokenizer"}}
    results["kinds"][kind] = row
    print(f"{kind}: tokenizer {bare:.1f} CPU s ({tokens} tokens); " + "; ".join(
        f"{k} {v['cpu_s']:.1f} CPU s, {v['wall_s']:.1f} s wall, "
        f"{row['share_of_tokenizer_speed'][k]:.2f}x the tokenizer's speed, "
        f"{row['wall_speedup'][k]:.2f}x {workers[0]} worker's wall"
        for k, v in median.items() if k != "tokenizer"), flush=True)
  if f.out:
    with open(f.out, "w") as fh:
      json.dump(results, fh, indent=1)
  if not f.dir:
    shutil.rmtree(scratch)
