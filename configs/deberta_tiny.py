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

from configs import bert_tiny, deberta_v3_base


def get_config(arg=None):
  c = deberta_v3_base.get_config(arg)
  tiny = bert_tiny.get_config(arg)
  c.train = tiny.train  # bert_tiny's schedule.
  for k in ("corpus", "max_seq_length", "max_predictions_per_seq", "eval_fraction"):
    c.data[k] = tiny.data[k]  # Its corpus and rows; DeBERTa's masking and tokenizer.
  c.data.tokenizer.vocab_size = c.model.vocab_size = tiny.model.vocab_size
  c.model.hidden_size = tiny.model.hidden_size
  c.model.num_layers = tiny.model.num_layers
  c.model.num_heads = tiny.model.num_heads
  c.model.intermediate_size = tiny.model.intermediate_size
  c.model.max_position_embeddings = tiny.model.max_position_embeddings
  c.model.position_buckets = 32  # 16 exact offsets each side, log-spaced to 128.
  c.model.dropout_rate = 0.0  # A few minutes of training underfit: no dropout.
  c.model.attention_dropout_rate = 0.0
  c.model.cls_dropout = 0.0
  c.generator.num_layers = 1  # Half the discriminator's depth, as the recipe's.
  return c
