"""Predictions of a fine-tuned model (any task of bertjax.tasks) on a file:

  python -m bertjax.predict --checkpoint=/tmp/sst2 --input=test.tsv --output=preds.jsonl

`--checkpoint` is a fine-tuning workdir (config.json, tokenizer/, task.json,
checkpoints/); `--input` is in the format the task reads for training (GLUE TSV, CoNLL,
SQuAD JSON, SWAG CSV, .jsonl or tfds:NAME), gold fields optional. Writes JSON lines,
one per example: its input fields and `prediction` (a label or score, a tag per word,
the answer text, the entity spans, or the chosen ending's index).
"""

from __future__ import annotations

import json
import os
from typing import Any

from absl import app, flags

from bertjax import cli, files
from bertjax.errors import CheckpointError

# Gold fields of the readers' examples: not echoed next to the prediction.
GOLD = ("label", "tags", "answers", "entities", "is_impossible")


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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  output = f.output or os.path.join(f.checkpoint, files.PREDICTIONS_FILE)
  records = predict(f.checkpoint, f.input, f.split)
  with open(output, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r, ensure_ascii=False) + "\n")
  print(f"wrote {len(records)} predictions to {output}")


def define_flags() -> None:
  """The CLI's flags; defined only when run as a program, so that importing `predict`
  next to other bertjax CLIs does not define `--checkpoint` twice."""
  flags.DEFINE_string("checkpoint", None, "Fine-tuning workdir.", required=True)
  flags.DEFINE_string("input", None, "File (or tfds:NAME) to predict.", required=True)
  flags.DEFINE_string("output", "", "JSON lines out; default CHECKPOINT/predictions.jsonl.")
  flags.DEFINE_string("split", "test", "Split of a tfds:NAME input.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
