"""Predictions of a fine-tuned model (any task of bertjax.tasks) on a file, as records
(`predict`), JSON lines or the GLUE server's files (`write`); the program is
`python -m bertjax.predict`.

The input is in the format the task reads for training (GLUE TSV, CoNLL, SQuAD JSON,
SWAG CSV, .jsonl or tfds:NAME), gold fields optional. Each record holds the example's
input fields and `prediction` (a label or score, a tag per word, the answer text, the
entity spans, or the chosen ending's index).
"""

from __future__ import annotations

import json
import os
from typing import Any

from bertjax import writes
from bertjax.checkpoint import files, workdir
from bertjax.errors import CheckpointError, DataError
from bertjax.tasks import finetune, finetuned

# Gold fields of the readers' examples: not echoed next to the prediction.
GOLD = ("label", "tags", "answers", "entities", "is_impossible")

# GLUE task (configs/finetune/glue.py:TASK) -> its test-server file (MNLI: matched;
# `glue_file` names the mismatched and diagnostic ones) and the labels the server takes
# (STS-B: a score).
GLUE_FILES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B",
              "qqp": "QQP", "mnli": "MNLI-m", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
GLUE_LABELS = {"cola": ("0", "1"), "sst2": ("0", "1"), "mrpc": ("0", "1"),
               "qqp": ("0", "1"), "wnli": ("0", "1"),
               "mnli": ("entailment", "neutral", "contradiction"),
               "qnli": ("entailment", "not_entailment"),
               "rte": ("entailment", "not_entailment")}


def predict(checkpoint: str, input_path: str, split: str = "test") -> list[dict[str, Any]]:
  """One record per example of `input_path`: its input fields and `prediction`."""
  run = workdir.open_finetuned(checkpoint, read_params=False)
  task = finetuned.task_of(run)
  examples = task.read(input_path, split)
  if not examples:
    raise DataError(f"{input_path} holds no examples.")
  features = task.featurize(examples, train=False)
  model = finetune.inference(run.config, task, run.model,
                             finetune.example_batch(features))
  params = workdir.restore_params(checkpoint, shardings=model.params)
  outputs, _ = finetune.predictor(model, task)(params, features,
                                               run.config.train.eval_batch_size)
  predictions = task.decode(outputs, features, examples)
  if isinstance(predictions, dict):  # SQuAD: {question id: answer}.
    predictions = [predictions[e["id"]] for e in examples]
  return [{**{k: v for k, v in e.items() if k not in GOLD}, "prediction": p}
          for e, p in zip(examples, predictions)]


def glue_file(task: str, input_path: str) -> str:
  """The GLUE server's file name (without .tsv) for predictions of a model of GLUE
  `task` on `input_path`: an MNLI model's on the mismatched test set go to MNLI-mm, on
  the diagnostic set (diagnostic.tsv, AX.tsv, tfds:glue/ax) to AX."""
  if task not in GLUE_FILES:
    raise CheckpointError(f"config.task.glue={task!r} is not a GLUE task; --glue_dir writes "
                          f"the test-server files of {sorted(GLUE_FILES)}.")
  name = os.path.basename(input_path.rstrip("/")).lower()
  if task == "mnli" and "mismatched" in name:
    return "MNLI-mm"
  if task == "mnli" and ("diagnostic" in name or name.split(".")[0] == "ax"
                         or input_path.lower().startswith("tfds:glue/ax")):
    return "AX"
  return GLUE_FILES[task]


def write_glue_tsv(records: list[dict[str, Any]], task: str, path: str) -> None:
  """The GLUE server's `index<TAB>prediction` file of a GLUE `task`'s predictions, in
  the order of the examples' `index` (their row in the test file) when they carry one."""
  allowed = GLUE_LABELS.get(task)
  lines = []
  for n, r in enumerate(records):
    p = r["prediction"]
    if allowed is None:
      p = f"{float(p):.3f}"
    elif p not in allowed:
      raise DataError(f"prediction {p!r} is not a label the GLUE server takes for "
                      f"{GLUE_FILES[task]} {list(allowed)}: fine-tune with "
                      f"configs/finetune/glue.py:{task}'s labels.")
    lines.append((int(r.get("index", n)), p))
  with open(path, "w", encoding="utf-8") as f:
    f.write("index\tprediction\n" + "".join(f"{i}\t{p}\n" for i, p in sorted(lines)))


def write(checkpoint: str, input_path: str, output: str = "", split: str = "test",
          glue_dir: str = "", overwrite: bool = False) -> tuple[str, int]:
  """Predicts and writes JSON lines to `output` (default CHECKPOINT/predictions.jsonl)
  or, with `glue_dir`, the GLUE server's file there. Returns (path, predictions). As
  `bertjax.writes` says: an output equal to the input, or another file of the
  checkpoint, is refused; an existing one is replaced only with `overwrite`; either
  before anything is predicted."""
  default = os.path.join(checkpoint, files.PREDICTIONS_FILE)
  if glue_dir:  # Checked before predicting.
    task = workdir.load_config(checkpoint).task.glue
    output = os.path.join(glue_dir, glue_file(task, input_path) + ".tsv")
  output = output or default
  inputs = {"--input": input_path}
  if os.path.abspath(output) != os.path.abspath(default):
    inputs["--checkpoint"] = checkpoint
  with writes.output_file(output, overwrite, inputs,
                          "--glue_dir's file" if glue_dir else "--output") as tmp:
    records = predict(checkpoint, input_path, split)
    if glue_dir:
      write_glue_tsv(records, task, tmp)
    else:
      with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
          f.write(json.dumps(r, ensure_ascii=False) + "\n")
  return output, len(records)
