"""modernbert_tiny: the ModernBERT family and its whole recipe at a CPU's scale, on the
embedded corpus: 4 layers, H=128, I=192, A=4, a 32-token local window (global attention
every third layer). It reproduces no paper table: it is the family's default that runs
anywhere, with every piece of configs/modernbert_base.py's one-run recipe at a small
size (see that file for the sources):

  phase      steps   rows x length   lr                    global theta
  pretrain     400   64 x 64         warm-up 30, 3e-3      10,000
  context       50   32 x 128        1.125e-3              160,000
  decay         50   32 x 128        1.125e-3 -> 1.1e-6    160,000

a batch sized by tokens (4,096 per step), its warm-up (16, 32 and 48 rows of 64 for 10
steps each), packed rows with documents isolated, 30% masking in training and 15% in
the held-out batches, StableAdamW with fully decoupled weight decay, dropout on the
attention output only. The held-out MLM is measured at 128 tokens with the final theta.

  python -m bertjax.main --config=configs/modernbert_tiny.py --workdir=/tmp/modernbert_tiny
  python -m bertjax.fill_mask --checkpoint=/tmp/modernbert_tiny "please turn <mask> homework in ."
"""

from configs import modernbert_base

PRETRAIN, CONTEXT, DECAY = 400, 50, 50
STEPS = PRETRAIN + CONTEXT + DECAY


def get_config(arg=None):
  c = modernbert_base.get_config(arg)
  c.seed = 0
  c.model.vocab_size = 4096
  c.model.hidden_size = 128
  c.model.num_layers = 4
  c.model.num_heads = 4
  c.model.intermediate_size = 192
  c.model.max_position_embeddings = 128
  c.model.local_attention = 32
  c.model.pad_token_id = 1  # <pad> of the byte-level BPE trained on the corpus.
  c.data.corpus = "embedded"
  c.data.max_seq_length = 128
  c.data.length_phases = ((PRETRAIN / STEPS, 64), (CONTEXT / STEPS, 128),
                          (DECAY / STEPS, 128))
  # At 15%: >= round(0.15 * 126) = 19 at 128, 10 at 64; at 30%: 40 and 20.
  c.data.max_predictions_per_seq = 20
  c.data.eval_fraction = 0.05
  c.data.tokenizer.vocab_size = 4096
  c.train.batch_size = 32  # Rows of 128 (64 rows of 64 in phase 1).
  c.train.batch_warmup_tokens = 61_440  # 16, 32, 48 rows of 64 ...
  c.train.batch_warmup_sizes = 3  # ... 10 steps each.
  c.train.num_steps = STEPS
  c.train.learning_rate = 3e-3
  c.train.learning_rate_restarts = ((PRETRAIN / STEPS, 1.125e-3, 1e-5),)  # 3/8, as base's.
  c.train.warmup_steps = 30
  c.train.decay_fraction = DECAY / STEPS
  c.train.log_every = 50
  c.train.eval_every = 250
  c.train.eval_batches = 0
  c.train.checkpoint_every = 250
  return c
