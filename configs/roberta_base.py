"""RoBERTa-base (Liu et al. 2019): BERT-base's shape with 50k byte-level BPE, no NSP,
no segment embeddings in use, positions offset past the padding index, dynamic
masking, large batches (8k sequences of 512, lr 6e-4, b2 0.98, eps 1e-6, 500k steps,
24k warm-up).

  python -m bertjax.main --config=configs/roberta_base.py --workdir=/tmp/roberta \
      --config.data.corpus='/data/*.txt' --config.data.tokenizer.path=/path/roberta-base
"""

from configs import bert_base


def get_config(arg=None):
  c = bert_base.get_config(arg)
  c.model.vocab_size = 50265
  c.model.max_position_embeddings = 514
  c.model.type_vocab_size = 1
  c.model.pad_token_id = 1
  c.model.position_offset = 2
  c.model.layer_norm_eps = 1e-5
  c.model.pooler = False
  c.model.nsp = False
  c.data.max_seq_length = 512
  c.data.max_predictions_per_seq = 80
  c.data.tokenizer.kind = "sentencepiece"
  c.data.tokenizer.lowercase = False
  c.data.tokenizer.vocab_size = 50265
  c.train.batch_size = 8192
  c.train.num_steps = 500_000
  c.train.learning_rate = 6e-4
  c.train.warmup_steps = 24_000
  c.train.b2 = 0.98
  return c
