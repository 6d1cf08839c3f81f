"""deberta_tiny: the DeBERTa-v3 family at a CPU's size, pretrained by replaced-token
detection (a generator of half its depth, 1 layer; GDES) on the embedded corpus (the
Python documentation that ships with every Python): 2 layers, H=128, I=512, A=2, 32 log
buckets of relative positions (shared keys, normed relative embeddings, no absolute
positions), a 4,096-piece SentencePiece vocabulary in
DeBERTa-v3's layout trained on the corpus. It reproduces no paper table: it is the
family's recipe that runs anywhere (configs/deberta_v3_base.py's settings, shortened as
configs/bert_tiny.py shortens BERT's; dropout off, as there).

  python -m bertjax.main --config=configs/deberta_tiny.py --workdir=/tmp/deberta_tiny
  python -m bertjax.fill_mask --checkpoint=/tmp/deberta_tiny "please turn [MASK] homework in ."
"""

from configs import deberta_v3_base


def get_config(arg=None):
  c = deberta_v3_base.get_config(arg)
  c.model.vocab_size = 4096
  c.model.hidden_size = 128
  c.model.num_layers = 2
  c.model.num_heads = 2
  c.model.intermediate_size = 512
  c.model.max_position_embeddings = 128
  c.model.position_buckets = 32  # 16 exact offsets each side, log-spaced to 128.
  c.model.dropout_rate = 0.0  # A few minutes of training underfit: no dropout.
  c.model.attention_dropout_rate = 0.0
  c.model.cls_dropout = 0.0
  c.generator.num_layers = 1  # Half the discriminator's depth, as the recipe's.
  c.data.corpus = "embedded"
  c.data.max_seq_length = 128
  c.data.max_predictions_per_seq = 20
  c.data.eval_fraction = 0.05
  c.data.tokenizer.vocab_size = 4096
  c.train.batch_size = 32
  c.train.num_steps = 1500
  c.train.learning_rate = 2e-3
  c.train.warmup_steps = 150
  c.train.log_every = 50
  c.train.eval_every = 500
  c.train.eval_batches = 0
  c.train.checkpoint_every = 500
  return c
