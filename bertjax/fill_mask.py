"""Fill the masks of a sentence with a pretrained MLM head.

    python -m bertjax.fill_mask --checkpoint=DIR --top_k=5 "please turn [MASK] homework in ."

DIR is a bertjax workdir or a Hugging Face model dir with an MLM head. Write the mask as
the tokenizer's mask token ([MASK] for BERT, <mask> for RoBERTa / XLM-R); `[MASK]` is
accepted for both.
"""

from __future__ import annotations


from absl import app, flags
import numpy as np

from bertjax.api import Pretrained, load_pretrained
from bertjax.console import cli
from bertjax.errors import DataError


def fill_mask(pretrained: Pretrained, text: str, top_k: int = 5
              ) -> list[list[tuple[str, float]]]:
  """For each mask in `text` (left to right), the `top_k` (token, probability) pairs."""
  tok = pretrained.tokenizer
  text = text.replace("[MASK]", tok.mask_token)
  out = pretrained.logits([text])
  positions = np.flatnonzero(out["input_ids"][0] == tok.mask_id)
  if positions.size == 0:
    raise DataError(f"the text has no {tok.mask_token} to fill: {text!r}")
  logits = out["mlm_logits"][0, positions, :tok.vocab_size]  # [P, vocab]
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  result = []
  for row in probs:
    best = np.argsort(-row)[:top_k]
    result.append([(tok.id_to_token(int(i)), float(row[i])) for i in best])
  return result


def main(argv):
  texts = argv[1:]
  if not texts:
    raise app.UsageError("give the text(s) to fill as positional arguments.")
  pretrained = load_pretrained(flags.FLAGS.checkpoint)
  for text in texts:
    print(text)
    for k, fillers in enumerate(fill_mask(pretrained, text, flags.FLAGS.top_k)):
      print(f"  mask {k + 1}: " + "  ".join(f"{t} {p:.3f}" for t, p in fillers))


def define_flags() -> None:
  """Defined only when run as a program (importing `fill_mask` defines no flags)."""
  flags.DEFINE_string("checkpoint", None, "bertjax workdir or Hugging Face model dir.",
                      required=True)
  flags.DEFINE_integer("top_k", 5, "How many fillers to print per mask.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
