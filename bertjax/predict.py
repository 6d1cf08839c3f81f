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

(`bertjax.tasks.predict` holds the library.)
"""

from __future__ import annotations

from absl import app, flags

from bertjax.console import cli
from bertjax.tasks import predict


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  output, count = predict.write(f.checkpoint, f.input, f.output, f.split, f.glue_dir,
                                f.overwrite)
  print(f"wrote {count} predictions to {output}")


def define_flags() -> None:
  """Defined only when run as a program: importing it next to the other programs
  defines no --checkpoint twice."""
  flags.DEFINE_string("checkpoint", None, "Fine-tuning workdir.", required=True)
  flags.DEFINE_string("input", None, "File (or tfds:NAME) to predict.", required=True)
  flags.DEFINE_string("output", "", "JSON lines out; default CHECKPOINT/predictions.jsonl.")
  flags.DEFINE_string("split", "test", "Split of a tfds:NAME input.")
  flags.DEFINE_string("glue_dir", "", "A GLUE task's test set: write the GLUE server's "
                      "DIR/<TASK>.tsv (index, prediction) instead of JSON lines.")
  flags.DEFINE_bool("overwrite", False, "Replace an existing output file.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
