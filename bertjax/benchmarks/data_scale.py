"""`python -m bertjax.benchmark data --scale`: preparing and starting at growing sizes.

  python -m bertjax.benchmark data --scale --sizes_mb=50,200,1000 --scale_workers=2

For each size it writes a corpus of that much text (the embedded documents repeated;
`--layout`: one text file, a directory of 256 KiB files, one .gz, or one Parquet file
of a document a row in row groups of 1,000 rows, as FineWeb's are written), then runs,
each as its own process as a user would, watched by psutil (peak RSS of the process
and of its workers together) and by `/usr/bin/time -v` where it exists (its maximum
resident set size: the largest single process of the tree):
1. `python -m bertjax.data.prepare --input=TEXT --tokenizer=TOK --output=TOKENS`
   (stage 1: tokenize), MB of text per second per worker and peak RSS;
2. `python -m bertjax.data.prepare --config=CONFIG --input=TOKENS --output=EXAMPLES`
   (stage 2: the config's examples, held-out split, manifest), the same figures;
3. `python -m bertjax.main --config=CONFIG --config.data.corpus=EXAMPLES` for
   `--scale_steps` steps: peak RSS, the time from its launch to its data being ready
   (imports, tokenizer, manifest: the trainer's "Data:" line) and to the first
   training batch (the pipeline's "first batch ready" line; the trainer builds and
   initialises the model in between), and the data build time itself.
At the first size, both stages also run with one worker right after the
`--scale_workers` run (the parallel speed-up), and with `--compare_raw` the trainer
also runs on the raw corpus of that size (the in-memory path, with
config.data.raw_text_limit_mb lifted) for comparison; `--raw_sizes` names the sizes
it does so at (default the first).
Each stage also reports its CPU seconds (all its processes) and the cores it kept busy
(CPU seconds / wall seconds): on a shared machine whose kernel gives every login
session an equal share of the CPU (sched_autogroup, as on this one), N workers cannot
use more than that share, so the wall-clock speed-up of more workers shows only while
cores are idle, and the CPU seconds say whether the work itself grew with N.
A table and the JSON of every figure are printed; the load average is recorded, as
this machine is shared.
"""

from __future__ import annotations

import datetime
import gzip
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from typing import Iterator

from absl import flags

from bertjax import writes
from bertjax.data import sources
from bertjax.data.tokenizer import train_tokenizer

_SIZES = flags.DEFINE_list("sizes_mb", ["50", "200", "1000"], "Corpus sizes, MB of text.")
_WORKERS = flags.DEFINE_integer("scale_workers", 2, "prepare --workers.")
_LAYOUT = flags.DEFINE_enum("layout", "file", ["file", "files", "gz", "parquet"],
                            "One text file, a directory of 256 KiB files, one .gz, or "
                            "one Parquet file (a document a row, 1,000-row groups).")
_DIR = flags.DEFINE_string("scale_dir", "/tmp/bertjax_data_scale",
                           "Where corpora, shards and workdirs go (reused: corpora are "
                           "kept, everything else rebuilt).")
_CONFIG = flags.DEFINE_string("scale_config", "configs/bert_tiny.py", "Recipe to prepare "
                              "and train (a file path, as --config takes it).")
_STEPS = flags.DEFINE_integer("scale_steps", 3, "Training steps of each run.")
_RAW = flags.DEFINE_bool("compare_raw", True, "Also train on the raw corpus, in memory.")
_RAW_SIZES = flags.DEFINE_list("raw_sizes", [], "The sizes (MB, of --sizes_mb) trained "
                               "on raw with --compare_raw (default: the first).")

MB = 2**20
_FIRST_BATCH = "Data: first batch ready"
_ROW_GROUP = 1000  # Parquet rows per row group
_TIME = "/usr/bin/time"  # GNU time: -v reports the maximum resident set size


def _documents() -> list[str]:
  """The embedded corpus's documents as text: a sentence a line."""
  return ["\n".join(d) for d in sources.load_documents("embedded")]


def _corpus(size_mb: int, layout: str) -> str:
  """Writes (once) about `size_mb` MB of text; returns its corpus spec."""
  documents = _documents()
  data = ("\n\n".join(documents) + "\n\n").encode()
  copies = max(1, round(size_mb * MB / len(data)))
  base = os.path.join(_DIR.value, f"text_{layout}_{size_mb}mb")
  spec = {"file": base + ".txt", "files": base, "gz": base + ".txt.gz",
          "parquet": base + ".parquet"}[layout]
  if os.path.exists(spec):
    return spec
  tmp = spec + ".tmp"
  if layout == "files":  # a directory of many files: several 256 KiB files per copy
    os.makedirs(tmp)
    per_file = max(1, 256 * 1024 // len(data))
    for k in range(0, copies, per_file):
      with open(os.path.join(tmp, f"{k:07d}.txt"), "wb") as f:
        f.write(data * min(per_file, copies - k))
  elif layout == "parquet":
    _write_parquet(tmp, (d for _ in range(copies) for d in documents))
  else:
    opener = (lambda p: gzip.open(p, "wb", compresslevel=1)) if layout == "gz" else (
        lambda p: open(p, "wb"))
    with opener(tmp) as f:
      for _ in range(copies):
        f.write(data)
  os.replace(tmp, spec)
  return spec


def _write_parquet(path: str, documents: Iterator[str]) -> None:
  """A Parquet file of a `text` column, `_ROW_GROUP` documents a row group, written a
  row group at a time."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  schema = pa.schema([("text", pa.string())])
  with pq.ParquetWriter(path, schema) as writer:
    group = []
    for document in documents:
      group.append(document)
      if len(group) == _ROW_GROUP:
        writer.write_table(pa.table({"text": group}, schema=schema))
        group = []
    if group:
      writer.write_table(pa.table({"text": group}, schema=schema))


def _run(cmd: list[str], log: str) -> dict:
  """Runs `cmd`, sampling the RSS of it and its children; returns seconds, CPU seconds,
  peak RSS (MiB) of all its processes together, /usr/bin/time -v's maximum resident
  set size (MiB; None without GNU time) and its output."""
  import psutil  # pylint: disable=g-import-not-at-top (a test extra, as transformers is)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  env.pop("JAX_NUM_CPU_DEVICES", None)
  start = time.time()
  cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = cpu.ru_utime + cpu.ru_stime
  timed = os.path.exists(_TIME)
  with open(log, "w") as out:
    proc = subprocess.Popen(([_TIME, "-v"] if timed else []) + cmd, stdout=out,
                            stderr=subprocess.STDOUT, env=env)
    root, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
      try:
        procs = [root, *root.children(recursive=True)]
        peak = max(peak, sum(p.memory_info().rss for p in procs))
      except psutil.Error:
        pass
      time.sleep(0.05)
  seconds = time.time() - start
  used = resource.getrusage(resource.RUSAGE_CHILDREN)  # waited-for processes, workers too
  cpu = used.ru_utime + used.ru_stime - cpu
  output = open(log).read()
  if proc.returncode:
    raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{output[-3000:]}")
  maxrss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", output)
  return {"seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2),
          "peak_rss_mib": round(peak / MB),
          "maxrss_mib": round(int(maxrss.group(1)) / 1024) if maxrss else None,
          "start": start, "output": output}


def _log_time(output: str, text: str) -> float | None:
  """The wall-clock time (seconds since the epoch) of absl's log line holding `text`."""
  for line in output.splitlines():
    m = re.match(r"[IWE](\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+)", line)
    if m and text in line:
      today = datetime.date.today()
      stamp = datetime.datetime.strptime(
          f"{today.year}-{m.group(1)}-{m.group(2)} {m.group(3)}", "%Y-%m-%d %H:%M:%S.%f")
      return stamp.timestamp()
  return None


def _prepare(spec: str, tokenizer: str, name: str, workers: int) -> dict:
  """Both stages into fresh directories; their figures."""
  tokens, examples = (os.path.join(_DIR.value, f"{name}_{s}") for s in ("tokens", "examples"))
  for d in (tokens, examples):
    shutil.rmtree(d, ignore_errors=True)
  py = [sys.executable, "-m", "bertjax.data.prepare", f"--workers={workers}"]
  one = _run(py + [f"--input={spec}", f"--tokenizer={tokenizer}", f"--output={tokens}"],
             tokens + ".log")
  two = _run(py + [f"--config={_CONFIG.value}", f"--input={tokens}",
                   f"--output={examples}"], examples + ".log")
  with open(os.path.join(examples, "manifest.json")) as f:
    manifest = json.load(f)
  text_mb = manifest["text"]["characters"] / MB
  return {"examples_dir": examples, "text_mb": round(text_mb, 1),
          "train_examples": sum(s["examples"] for k, s in manifest["splits"].items()
                                if k.startswith("train")),
          **{f"{stage}_{k}": v for stage, r in (("tokenize", one), ("build", two))
             for k, v in (("seconds", r["seconds"]), ("cpu_seconds", r["cpu_seconds"]),
                          ("cores_busy", round(r["cpu_seconds"] / r["seconds"], 2)),
                          ("peak_rss_mib", r["peak_rss_mib"]),
                          ("maxrss_mib", r["maxrss_mib"]),
                          ("mb_per_s_per_worker",
                           round(text_mb / r["seconds"] / workers, 2)))}}


def _train(corpus_spec: str, tokenizer: str, name: str, *extra: str) -> dict:
  """A few steps of the real trainer; its peak RSS and start-up times."""
  workdir = os.path.join(_DIR.value, f"{name}_workdir")
  shutil.rmtree(workdir, ignore_errors=True)
  steps = _STEPS.value
  r = _run([sys.executable, "-m", "bertjax.main", f"--config={_CONFIG.value}",
            f"--workdir={workdir}", f"--config.data.corpus={corpus_spec}",
            f"--config.data.tokenizer.path={tokenizer}",
            f"--config.train.num_steps={steps}", "--config.train.warmup_steps=1",
            f"--config.train.eval_every={steps}", "--config.train.eval_batches=1",
            f"--config.train.checkpoint_every={steps}", *extra], workdir + ".log")
  first, ready = (_log_time(r["output"], text) for text in (_FIRST_BATCH, "Data: {"))
  build = re.search(r"'build_seconds': ([\d.]+)", r["output"])
  return {"train_peak_rss_mib": r["peak_rss_mib"], "train_maxrss_mib": r["maxrss_mib"],
          "train_seconds": r["seconds"],
          "data_ready_s": round(ready - r["start"], 2) if ready else None,
          "first_batch_s": round(first - r["start"], 2) if first else None,
          "data_build_s": float(build.group(1)) if build else None}


def main(argv):
  del argv
  writes.claim(_DIR.value, writes.BENCHMARK, "data_scale", flag="--scale_dir")
  writes.record(_DIR.value, writes.BENCHMARK, "data_scale")
  tokenizer = os.path.join(_DIR.value, "tokenizer")
  if not os.path.isdir(tokenizer):  # bert_tiny's: 4,096 WordPiece ids
    sentences = [s for d in sources.load_documents("embedded") for s in d]
    train_tokenizer(sentences, kind="wordpiece", vocab_size=4096).save(tokenizer)
  raw_sizes = [int(s) for s in _RAW_SIZES.value] or [int(_SIZES.value[0])]
  rows, extra = [], {"raw_in_memory": {}}
  for i, size in enumerate(int(s) for s in _SIZES.value):
    spec = _corpus(size, _LAYOUT.value)
    row = {"size_mb": size, "load_before": round(os.getloadavg()[0], 1)}
    row.update(_prepare(spec, tokenizer, f"{_LAYOUT.value}_{size}mb", _WORKERS.value))
    if i == 0 and _WORKERS.value > 1:  # side by side with the run above
      one = _prepare(spec, tokenizer, f"{_LAYOUT.value}_{size}mb_1worker", 1)
      extra["one_worker"] = {k: v for k, v in one.items() if k != "examples_dir"}
      extra["one_worker"]["load_after"] = round(os.getloadavg()[0], 1)
      extra["speedup"] = {stage: round(one[f"{stage}_seconds"] / row[f"{stage}_seconds"], 2)
                          for stage in ("tokenize", "build")}
      print(json.dumps(extra), flush=True)
    row.update(_train(row["examples_dir"], os.path.join(row["examples_dir"], "tokenizer"),
                      f"{_LAYOUT.value}_{size}mb"))
    row["load_after"] = round(os.getloadavg()[0], 1)
    rows.append(row)
    print(json.dumps(row), flush=True)
    if _RAW.value and size in raw_sizes:
      extra["raw_in_memory"][size] = _train(spec, tokenizer, f"raw_{_LAYOUT.value}_{size}mb",
                                            "--config.data.raw_text_limit_mb=0")
      print(json.dumps(extra), flush=True)
  print("| text | tokenize MB/s/worker (peak RSS; largest process) | build MB/s/worker "
        "(peak RSS; largest process) | train peak RSS (largest process) | data ready / "
        "first batch after launch | data build | load |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['text_mb']:,.0f} MB | {r['tokenize_mb_per_s_per_worker']} "
          f"({r['tokenize_peak_rss_mib']:,}; {r['tokenize_maxrss_mib']} MiB) | "
          f"{r['build_mb_per_s_per_worker']} ({r['build_peak_rss_mib']:,}; "
          f"{r['build_maxrss_mib']} MiB) | {r['train_peak_rss_mib']:,} "
          f"({r['train_maxrss_mib']}) MiB | {r['data_ready_s']} s / "
          f"{r['first_batch_s']} s | {r['data_build_s']} s | "
          f"{r['load_before']}-{r['load_after']} |")
  for size, r in extra["raw_in_memory"].items():
    print(f"raw {size} MB in memory: train peak RSS {r['train_peak_rss_mib']:,} "
          f"({r['train_maxrss_mib']}) MiB | data ready / first batch after launch "
          f"{r['data_ready_s']} s / {r['first_batch_s']} s | data build "
          f"{r['data_build_s']} s")
  if "one_worker" in extra:
    print(f"\n| {rows[0]['text_mb']:,.0f} MB, workers | tokenize: wall s (CPU s, cores "
          "busy) | build: wall s (CPU s, cores busy) |\n|---|---|---|")
    for n, r in ((_WORKERS.value, rows[0]), (1, extra["one_worker"])):
      print(f"| {n} | " + " | ".join(
          f"{r[f'{st}_seconds']} ({r[f'{st}_cpu_seconds']}, {r[f'{st}_cores_busy']})"
          for st in ("tokenize", "build")) + " |")
  base = rows[0]["train_peak_rss_mib"]
  print(json.dumps({"train_rss_ratio_to_smallest": [
      round(r["train_peak_rss_mib"] / base, 3) for r in rows], **extra}))
