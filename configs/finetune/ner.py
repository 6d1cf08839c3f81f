"""Sequence labelling: CoNLL-2003 NER (BIO tags, entity F1) or, with `:pos`, POS
tagging (word accuracy). Every subword trains on its word's tag; words are decoded
from their first subword.

  python -m bertjax.finetune --config=configs/finetune/ner.py --workdir=/tmp/ner \
      --config.init_from=/path/to/bert-base-cased \
      --config.data.train=conll2003/train.txt --config.data.dev=conll2003/valid.txt
  # or the prepared TFDS dataset: --config.data.train=tfds:conll2003 (dev: its 'dev' split)
"""

from configs.finetune import base


def get_config(arg="ner"):
  c = base.get_config()
  c.task.name = "tagging"
  c.task.tag_column = -1 if arg == "ner" else 1  # CoNLL-2003: NER last, POS second.
  # Words and tags features of a tfds: input (tfds:conll2003: tokens, pos, chunks, ner).
  c.task.tfds_fields = ("tokens", "ner" if arg == "ner" else "pos")
  c.task.metrics = ("f1", "precision", "recall", "accuracy") if arg == "ner" else (
      "accuracy",)  # The first selects the best sweep run.
  c.train.learning_rate = 5e-5
  return c
