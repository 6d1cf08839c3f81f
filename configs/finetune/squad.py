"""SQuAD v1.1 (default) or v2.0 (`:v2`): span QA with doc stride, n-best decoding and
the official EM / F1 (BERT: lr 5e-5 v1.1 / 5e-5 v2.0, batch 32, 2-3 epochs, 384 tokens).

  python -m bertjax.finetune --config=configs/finetune/squad.py:v2 --workdir=/tmp/squad2 \
      --config.init_from=/path/to/bert-base-uncased \
      --config.data.train=train-v2.0.json --config.data.dev=dev-v2.0.json
"""

from configs.finetune import base


def get_config(arg="v1"):
  c = base.get_config()
  c.task.name = "squad"
  c.task.version_2 = arg == "v2"  # Unanswerable questions: predict '' via the null score.
  c.task.max_seq_length = 384  # Tokens per window.
  c.task.doc_stride = 128  # Tokens between the starts of consecutive windows.
  c.task.max_query_length = 64  # Question tokens kept.
  c.task.max_answer_length = 30  # Longest answer, in tokens.
  c.task.n_best_size = 20  # Start and end candidates per window.
  c.task.null_score_diff_threshold = 0.0  # v2: answer '' when null - best exceeds this.
  c.task.metrics = ("f1", "exact")  # The first selects the best sweep run.
  c.train.learning_rate = 5e-5
  c.train.num_epochs = 2
  return c
