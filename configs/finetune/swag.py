"""Multiple choice (SWAG): one [CLS] context [SEP] start + ending [SEP] sequence per
choice, a scalar score each, softmax over the four (BERT: lr 2e-5, batch 16, 3 epochs).

  python -m bertjax.finetune --config=configs/finetune/swag.py --workdir=/tmp/swag \
      --config.init_from=/path/to/bert-base-uncased \
      --config.data.train=swagaf/data/train.csv --config.data.dev=swagaf/data/val.csv
"""

from configs.finetune import base


def get_config():
  c = base.get_config()
  c.task.name = "multiple_choice"
  c.task.max_seq_length = 128  # Tokens per choice sequence.
  c.task.metrics = ("accuracy",)  # Selects the best sweep run.
  c.train.batch_size = 16  # Examples (each of four sequences) per step.
  c.train.learning_rate = 2e-5
  return c
