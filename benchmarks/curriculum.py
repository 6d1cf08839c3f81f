"""mmBERT's cascading annealed language learning against one flat mixture, at the tiny
recipe's size (issue 59, item 6):

  python -m benchmarks curriculum --out=/tmp/curriculum --seeds=0,1,2

Arms, each pretrained from scratch with each of --seeds (`config.seed`: weights, data
order and masking), on the shipped multilingual corpus (configs/mmbert_tiny.py:
tests/fixtures/multilingual/, 8 languages), the same 400 steps, rows, lengths, masking
phases, thetas and learning-rate schedule:
- `schedule`: configs/mmbert_tiny.py as it is: German, French and Spanish for 240 steps
  at tau 0.7, Basque, Welsh and Icelandic joining for 80 at tau 0.5, Breton and Faroese
  for the last 80 (the decay) at tau 0.3;
- `flat`: every language from the first step at one tau (--flat_tau, 0.3: the
  schedule's last), `config.data.source_phases` one phase.
Each run's held-out MLM (15% masking, each language's own held-out documents) at every
evaluation (every 80 steps) is its metrics.jsonl; the table gives each language's loss
and accuracy at the end of the ext phase (step 320) and of the run (400), mean and
standard deviation over the seeds, in --out/table.md and --out/results.json. Runs
finished in --out are read, not trained again. One process, one run after another.
"""

from __future__ import annotations

import json
import os
import statistics

from absl import flags

from bertjax.train import pretrain
from configs import mmbert_tiny

_OUT = flags.DEFINE_string("out", "/tmp/curriculum", "Folder of the runs and the tables.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Pretraining seeds of each arm.")
_FLAT_TAU = flags.DEFINE_float("flat_tau", 0.3, "The flat arm's tau.")
ARMS = ("schedule", "flat")
STEPS = (320, 400)  # The end of the ext phase, of the run.


def arm_config(arm: str, seed: int):
  c = mmbert_tiny.get_config()
  c.seed = seed
  if arm == "flat":
    c.data.source_phases = ((1.0, "", _FLAT_TAU.value),)
  return c


def evals(workdir: str) -> dict[int, dict]:
  """The run's held-out rows by step."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: r for r in rows if r.get("split") == "eval"}


def _cell(values) -> str:
  spread = statistics.stdev(values) if len(values) > 1 else 0.0
  return f"{statistics.mean(values):.3f} +- {spread:.3f}"


def main(argv) -> None:
  del argv
  os.makedirs(_OUT.value, exist_ok=True)
  results = {}
  for arm in ARMS:
    for seed in map(int, _SEEDS.value):
      workdir = os.path.join(_OUT.value, f"{arm}_s{seed}")
      done = os.path.isfile(os.path.join(workdir, "metrics.jsonl")) and max(
          evals(workdir), default=0) >= STEPS[-1]
      if not done:
        pretrain.run(arm_config(arm, seed), workdir)
      results[f"{arm}_s{seed}"] = {s: r for s, r in evals(workdir).items() if s in STEPS}
  with open(os.path.join(_OUT.value, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  joins = {**{n: "pretrain" for n in mmbert_tiny.FIRST},
           **{n: "ext" for n in mmbert_tiny.SECOND}, **{n: "decay" for n in mmbert_tiny.LATE}}
  lines = ["| language | joins | step | schedule loss | flat loss | schedule accuracy | "
           "flat accuracy |", "|---|---|---|---|---|---|---|"]
  for name, phase in [*joins.items(), ("all", "")]:
    prefix = "" if name == "all" else f"{name}/"
    for step in STEPS:
      cells = []
      for metric in ("mlm_loss", "mlm_accuracy"):
        for arm in ARMS:
          cells.append(_cell([results[f"{arm}_s{s}"][step][prefix + metric]
                              for s in map(int, _SEEDS.value)]))
      lines.append(f"| {name} | {phase} | {step} | " + " | ".join(cells) + " |")
  table = "\n".join(lines)
  with open(os.path.join(_OUT.value, "table.md"), "w") as f:
    f.write(table + "\n")
  print(table)
