"""mmBERT-small (Marone et al. 2025): mmBERT-base's recipe (configs/mmbert_base.py: the
phases, languages, taus, masking, thetas and every source) at H=384, A=6 (22 layers,
I=1152, 256,000 pieces): 140,897,536 parameters with the MLM head (Hugging Face's
ModernBertForMaskedLM count, 42.6M without the embedding; the authors: 140M and 42M).

What the authors' small yamls (github:JHU-CLSP/mmBERT configs/mmBERT-small.yaml,
-small-ext.yaml, -small-decay.yaml) change from base's:
- pt `t_warmup: 4000000000tok` (4B tokens: 7,013 steps through the warm-up's first two sizes) and
  `batch_size_warmup_tokens: 100000000000tok` (11 sizes of 3,853 steps each, the GPU
  count assumed 8 as for base): 508,625 steps of pretraining for its 2.3T tokens
  (ext's cumulative `max_duration: 2900000000000tok` less its 600B);
- ext and decay `lr: 0.0004`, `weight_decay: 4.0e-05` (`learning_rate_restarts` at the
  ext phase's first step);
- decay `warmup_stable_decay` with `t_decay: 100000000000tok`, `alpha_f: 0.04`: to 4e-4 x
  0.04 = 1.6e-5 over the decay's 100B tokens, linearly (the authors' trainer is
  ModernBERT's, whose src/scheduler.py WarmupStableDecayScheduler decays linearly; base's
  decay yaml says `one_minus_sqrt` instead);
- ext / decay `seed: 12345` (pt 21: one run here, seed 21);
- pt `mlm_probability: 0.3` (base's yaml says 0.25; both recipes use the paper's 30%).

  python -m bertjax.main --config=configs/mmbert_small.py:/data/mmbert --workdir=gs://b/mmbert_small \
      --config.data.tokenizer.path=/models/mmBERT-small
"""

from configs import mmbert_base

PRETRAIN, EXT, DECAY = 508_625, 15_895, 2_649
STEPS = PRETRAIN + EXT + DECAY


def get_config(arg=None):
  c = mmbert_base.get_config(arg)
  c.model.hidden_size = 384
  c.model.num_heads = 6
  fractions = (PRETRAIN / STEPS, EXT / STEPS, DECAY / STEPS)
  c.data.length_phases = ((fractions[0], 1024), (fractions[1], 8192), (fractions[2], 8192))
  c.data.masked_lm_prob_phases = tuple(zip(fractions, (0.3, 0.15, 0.05)))
  c.data.source_phases = mmbert_base.source_phases(
      fractions, mmbert_base.PRETRAIN_LANGUAGES, mmbert_base.EXT_LANGUAGES)
  c.train.batch_warmup_tokens = 100_000_000_000  # 11 sizes of 3,853 steps.
  c.train.num_steps = STEPS
  c.train.warmup_steps = 7_013  # 4B tokens through the 384- and 768-row sizes.
  c.train.learning_rate_restarts = ((fractions[0], 4e-4, 4e-5),)  # ext and decay.
  c.train.decay_fraction = DECAY / STEPS
  c.train.decay_shape = "linear"
  c.train.final_lr_fraction = 0.04  # alpha_f: 4e-4 x 0.04.
  return c
