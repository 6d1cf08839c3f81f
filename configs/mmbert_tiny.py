"""mmbert_tiny: mmBERT's whole recipe (configs/mmbert_base.py) at a CPU's scale, on the
multilingual corpus the suite ships (tests/fixtures/multilingual/: the translated message
catalogues of Debian packages, 8 languages, 780 KB). ModernBERT's architecture at 4
layers, H=128, I=192, A=4, a 32-token window; a byte-level BPE of 8,192 pieces trained
on the languages' sample. It reproduces no paper table: it is the family's schedule
that runs anywhere, every piece of it at a small size:

  phase     steps  rows x length  sources                                  tau  masking  theta
  pretrain    240   32 x 64       deu fra spa                              0.7  30%      10,000
  ext          80   32 x 128      + eus cym isl                            0.5  15%      160,000
  decay        80   32 x 128      + bre fao (every source)                 0.3   5%      160,000

(mmBERT's first phase holds German, French and Spanish, its second adds Basque, Welsh and
Icelandic, Breton and Faroese join in its decay: the authors' language_counts.csv.)
A batch-size warm-up (8, 16, 24 rows for 10 steps each), the learning rate's warm-up,
stable phase and 1-sqrt decay to 2% over the decay phase, StableAdamW with fully decoupled
weight decay, packed rows with documents isolated; each language held out and scored on
its own (`held_out_mlm_accuracy/<language>`), the late ones before they join too.

  python -m bertjax.main --config=configs/mmbert_tiny.py --workdir=/tmp/mmbert_tiny
"""

import os

from configs import mmbert_base

CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "tests", "fixtures", "multilingual")
FIRST, SECOND, LATE = ("deu", "fra", "spa"), ("eus", "cym", "isl"), ("bre", "fao")
PRETRAIN, EXT, DECAY = 240, 80, 80
STEPS = PRETRAIN + EXT + DECAY


def get_config(arg=None):
  del arg
  c = mmbert_base.get_config()
  c.seed = 0
  c.data.languages = ",".join(f"{n}={os.path.join(CORPUS, n)}.txt" for n in FIRST + SECOND + LATE)
  for k, v in dict(vocab_size=8192, hidden_size=128, num_layers=4, num_heads=4,
                   intermediate_size=192, max_position_embeddings=128, local_attention=32,
                   pad_token_id=1).items():  # <pad> of the byte-level BPE trained here.
    c.model[k] = v
  fractions = (PRETRAIN / STEPS, EXT / STEPS, DECAY / STEPS)
  c.data.max_seq_length = 128
  c.data.length_phases = ((fractions[0], 64), (fractions[1], 128), (fractions[2], 128))
  c.data.masked_lm_prob_phases = tuple(zip(fractions, (0.3, 0.15, 0.05)))
  c.data.max_predictions_per_seq = 20  # 15% of 128 (x2 at 30%, 10 x 2 at 64).
  c.data.source_phases = mmbert_base.source_phases(fractions, FIRST, SECOND)
  c.data.eval_fraction = 0.1
  c.data.tokenizer.vocab_size = 8192
  c.train.batch_size = 32
  c.train.batch_warmup_tokens = 30_720  # 8, 16, 24 rows of 64 ...
  c.train.batch_warmup_sizes = 3  # ... 10 steps each.
  c.train.num_steps = STEPS
  c.train.learning_rate = 3e-3
  c.train.warmup_steps = 30
  c.train.decay_fraction = DECAY / STEPS
  c.train.log_every = 40
  c.train.eval_every = 80
  c.train.eval_batches = 0
  c.train.checkpoint_every = 200
  return c
