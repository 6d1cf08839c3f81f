"""Fill the masks of a sentence with a pretrained MLM head.

    python -m bertjax.fill_mask --checkpoint=DIR --top_k=5 "please turn [MASK] homework in ."

DIR is a bertjax workdir or a Hugging Face model dir with an MLM head (of a workdir
that trains an ELECTRA pair, the generator). Write the mask as
the tokenizer's mask token ([MASK] for BERT, <mask> for RoBERTa / XLM-R); `[MASK]` is
accepted for both (`Pretrained.fill_mask`).
"""

from __future__ import annotations

from absl import app, flags

from bertjax.checkpoint import workdir
from bertjax.checkpoint.pretrained import load_pretrained
from bertjax.console import cli

def main(argv):
  texts = argv[1:]
  if not texts:
    raise app.UsageError("give the text(s) to fill as positional arguments.")
  checkpoint = flags.FLAGS.checkpoint
  pretrained = load_pretrained(checkpoint, network=workdir.masked_lm_network(checkpoint))
  for text in texts:
    print(text)
    for k, fillers in enumerate(pretrained.fill_mask(text, flags.FLAGS.top_k)):
      print(f"  mask {k + 1}: " + "  ".join(f"{t} {p:.3f}" for t, p in fillers))


def define_flags() -> None:
  """Defined only when run as a program: importing it next to the other programs
  defines no --checkpoint twice."""
  flags.DEFINE_string("checkpoint", None, "bertjax workdir or Hugging Face model dir.",
                      required=True)
  flags.DEFINE_integer("top_k", 5, "How many fillers to print per mask.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
