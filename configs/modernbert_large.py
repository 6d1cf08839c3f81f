"""ModernBERT-large (Warner et al. 2024): 28 pre-LN layers, H=1024, I=2624 (GeGLU),
A=16; 395,881,664 parameters with the MLM head, Hugging Face's count (394.8M in the
encoder). Everything not listed here is ModernBERT-base's recipe
(configs/modernbert_base.py, whose docstring gives each number's source).

Its whole pretraining in one run, from the paper's section 2.2 and appendix Table 3
and the authors' yamls/modernbert/modernbert-large-{pretrain, context-extension,
learning-rate-decay}.yaml ("pt", "ce", "lrd"; github:AnswerDotAI/ModernBERT, branch
pretraining_documentation):

  phase          steps    rows x length   tokens   lr                       wd     theta
  pretrain      180,329   4,928 x 1,024   900B     warm-up 2B tok, 5e-4     1e-5   10k
  (restart)     162,299   4,928 x 1,024   819B     5e-5                     1e-6   10k
  context        49,542     616 x 8,192   250B     5e-5, constant           1e-6   160k
  decay           9,908     616 x 8,192   50B      5e-5 -> 5e-8, 1-sqrt     1e-6   160k

- Batch: pt `global_train_batch_size: 4928` rows of 1,024 = ce 616 rows of 8,192
  (5,046,272 tokens per step; batch_size 616 at 8,192 by tokens). lrd trains 624 rows
  (`global_train_batch_size: 624`, a multiple of its 6-row micro-batches on 8 GPUs);
  here the decay phase keeps 616 (1.3% fewer tokens per step, 9,908 steps for its 50B
  tokens instead of 9,781).
- Batch-size warm-up: pt `batch_size_warmup_min_size: 56` per GPU (448 rows),
  `batch_size_warmup_tokens: 10_000_000_000tok`: 448, 896, ..., 4,480 rows, 396 steps
  each (`batch_warmup_sizes` 10), then 4,928.
- Learning rate: pt `t_warmup: 2_000_000_000tok` (1,664 steps through the first five
  warm-up sizes) to `lr: 5e-4`, which "was too high and required a restart" (pt); the
  paper: "we trained ModernBERT-large at a LR of 5e-4 for 900 billion tokens. We rolled
  back and restarted training at 5e-5 for the remaining 800 billion tokens" (the
  restart at 900B tokens, `learning_rate_restarts`); ce and lrd `lr: 5e-5` and
  `weight_decay: 1.0e-6` ("Note that this is after the pretraining LR reduction": the
  restart's weight decay, read here as 1e-6 from the restart on, as ce's comment says);
  lrd 1-sqrt to alpha_f 0.001. decouple_lr's maximum stays 5e-4 (optimi's max_lr
  survives the restarts).
- Device micro-batch and the GPUs' layout (ce 7, lrd 6 rows per GPU) are Composer's
  business; `train.grad_accum_steps` plays that part here.
Not reproduced, beyond the base recipe's list: the initialisation of large from base's
pretraining checkpoint by center tiling (pt `init_from_checkpoint`; section 2.2, "Weight
Initialization and Tiling"): large starts from the Megatron-style random init here.

  python -m bertjax.main --config=configs/modernbert_large.py --workdir=gs://bucket/mbl \
      --config.data.corpus=/data/prepared --config.data.tokenizer.path=/data/tokenizer
"""

from configs import modernbert_base

# Steps of each phase: pretraining at 5e-4 (its batch-size warm-up of 10 x 396 steps
# and its 1,664-step learning-rate warm-up included) and after the restart at 5e-5,
# context extension, decay.
PRETRAIN, RESTART, CONTEXT, DECAY = 180_329, 162_299, 49_542, 9_908
STEPS = PRETRAIN + RESTART + CONTEXT + DECAY


def get_config(arg=None):
  c = modernbert_base.get_config(arg)
  c.model.hidden_size = 1024
  c.model.num_layers = 28
  c.model.num_heads = 16
  c.model.intermediate_size = 2624
  c.data.length_phases = (((PRETRAIN + RESTART) / STEPS, 1024), (CONTEXT / STEPS, 8192),
                          (DECAY / STEPS, 8192))
  c.train.batch_size = 616  # Rows of 8,192 tokens; 4,928 rows of 1,024 in phase 1.
  c.train.batch_warmup_tokens = 10_000_000_000  # 448, 896, ..., 4,480 rows of 1,024 ...
  c.train.batch_warmup_sizes = 10  # ... 396 steps each, then 4,928.
  c.train.num_steps = STEPS
  c.train.learning_rate = 5e-4  # Phase 1's first peak, decouple_lr's maximum throughout.
  # At 900B tokens: 5e-5 with weight decay 1e-6 to the end.
  c.train.learning_rate_restarts = ((PRETRAIN / STEPS, 5e-5, 1e-6),)
  c.train.warmup_steps = 1_664  # 2B tokens through the batch warm-up's first sizes.
  c.train.decay_fraction = DECAY / STEPS
  c.train.weight_decay = 1e-5
  return c
