"""Predictions of a fine-tuned model (any task of bertjax.tasks) on a file:

  python -m bertjax.predict --checkpoint=/tmp/sst2 --input=test.tsv --output=preds.jsonl

`--checkpoint` is a fine-tuning workdir (config.json, tokenizer/, task.json,
checkpoints/); `--input` is in the format the task reads for training (GLUE TSV, CoNLL,
SQuAD JSON, SWAG CSV, .jsonl or tfds:NAME), gold fields optional. Writes JSON lines,
one per example: its input fields and `prediction` (a label or score, a tag per word,
the answer text, the entity spans, or the chosen ending's index).

With `--glue_dir=DIR`, a GLUE task's predictions on its test set go to the file the
GLUE server expects instead (DIR/SST-2.tsv, ...; an MNLI model's on test_matched,
test_mismatched and the diagnostic set to MNLI-m.tsv, MNLI-mm.tsv and AX.tsv):

  python -m bertjax.predict --checkpoint=/tmp/mnli \
      --input=glue_data/MNLI/test_mismatched.tsv --glue_dir=/tmp/glue_submission
"""

from __future__ import annotations

import json
import os
from typing import Any

from absl import app, flags

from bertjax.console import cli
from bertjax import files
from bertjax.errors import CheckpointError, DataError

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
  from bertjax import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bertjax.data import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  from bertjax.model import ModelConfig  # pylint: disable=g-import-not-at-top
  from bertjax.tasks import get_task, loop  # pylint: disable=g-import-not-at-top

  task_path = os.path.join(checkpoint, files.TASK_FILE)
  if not os.path.isfile(task_path):
    raise CheckpointError(f"{checkpoint} has no {files.TASK_FILE}: give a fine-tuning "
                          "workdir (python -m bertjax.finetune --workdir=...).")
  config = ckpt_lib.load_config(checkpoint)
  with open(task_path) as f:
    saved = json.load(f)
  tokenizer = tok_lib.load_tokenizer(os.path.join(checkpoint, files.TOKENIZER_DIR))
  task = get_task(config.task.name)(config.task, tokenizer, config.task.max_seq_length)
  task.labels = saved["labels"]
  examples = task.read(input_path, split)
  if not examples:
    raise CheckpointError(f"{input_path} holds no examples.")
  features = task.featurize(examples, train=False)
  model = ModelConfig.from_config(config.model)
  # Prediction neither accumulates nor skips: runs older than these fields predict too.
  config.train.update(grad_accum_steps=1, skip_step_on_spikes=False)
  setup = loop.build(config, task, model, loop.example_batch(features), saved["num_steps"])
  checkpointer = ckpt_lib.Checkpointer(checkpoint, read_only=True)
  step = checkpointer.latest_step()
  if step is None:
    raise CheckpointError(f"{checkpoint} has no checkpoint yet; finish (or resume) the "
                          "fine-tuning run first.")
  params = checkpointer.restore(step, {"params": ckpt_lib.abstract_on(
      setup.abstract.params, setup.shardings.params)})["params"]
  checkpointer.close()
  outputs, _ = loop.predictor(setup, task)(params, features, config.train.eval_batch_size)
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
          glue_dir: str = "") -> tuple[str, int]:
  """Predicts and writes JSON lines to `output` (default CHECKPOINT/predictions.jsonl)
  or, with `glue_dir`, the GLUE server's file there. Returns (path, predictions)."""
  if glue_dir:  # Checked before predicting.
    from bertjax import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
    task = ckpt_lib.load_config(checkpoint).task.get("glue", "")
    output = os.path.join(glue_dir, glue_file(task, input_path) + ".tsv")
  records = predict(checkpoint, input_path, split)
  if glue_dir:
    os.makedirs(glue_dir, exist_ok=True)
    write_glue_tsv(records, task, output)
    return output, len(records)
  output = output or os.path.join(checkpoint, files.PREDICTIONS_FILE)
  with open(output, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r, ensure_ascii=False) + "\n")
  return output, len(records)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  output, count = write(f.checkpoint, f.input, f.output, f.split, f.glue_dir)
  print(f"wrote {count} predictions to {output}")


def define_flags() -> None:
  """The CLI's flags; defined only when run as a program, so that importing `predict`
  next to other bertjax CLIs does not define `--checkpoint` twice."""
  flags.DEFINE_string("checkpoint", None, "Fine-tuning workdir.", required=True)
  flags.DEFINE_string("input", None, "File (or tfds:NAME) to predict.", required=True)
  flags.DEFINE_string("output", "", "JSON lines out; default CHECKPOINT/predictions.jsonl.")
  flags.DEFINE_string("split", "test", "Split of a tfds:NAME input.")
  flags.DEFINE_string("glue_dir", "", "A GLUE task's test set: write the GLUE server's "
                      "DIR/<TASK>.tsv (index, prediction) instead of JSON lines.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
