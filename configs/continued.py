"""Continued pretraining of a published checkpoint on a domain corpus (domain-adaptive
pretraining: BioBERT and SciBERT from BERT, clinical or legal ModernBERTs): the model
section is the checkpoint's (`config.init_from`), so it lists only what a run chooses
(the dtype, the attention path, scan and remat); every other field, dropouts included,
comes from the checkpoint (bertjax/train/continued.py); the heads trained are
`config.objectives`' (('rtd',) continues a discriminator with its generator: config.generator,
config.init_generator_from). `arg` picks the family's recipe: 'bert' (BERT, RoBERTa, XLM-R,
ELECTRA, DeBERTa: MLM at 15% on packed rows), 'modernbert' (MLM at 30%, packed rows, StableAdamW, as
ModernBERT's authors pretrain) or 'mmbert' (a published mmBERT, continued with its decay
phase's settings: MLM at 5%, StableAdamW with betas (0.9, 0.95), eps 1e-8, weight decay
8e-5, the learning rate falling as 1 - sqrt to 2% of its peak: configs/mmbert_base.py). The numbers are a starting point (a short run at a learning rate below the
checkpoint's peak, decayed linearly), not a paper's recipe. docs/continued_pretraining.md
runs it on the real MiniLM.

  python -m bertjax.main --config=configs/continued.py --workdir=/tmp/continued \
      --config.init_from=/path/to/checkpoint \
      --config.data.corpus='general:0.3=embedded,domain:0.7=/data/notes' \
      --config.vocab_extension.num_new_tokens=500 --config.vocab_extension.corpus=domain
"""

import ml_collections

from configs import bert_base, modernbert_base


def get_config(arg=None):
  family = arg or "bert"
  if family not in ("bert", "modernbert", "mmbert"):
    raise ValueError(f"configs/continued.py:{family}: use :bert, :modernbert or :mmbert.")
  c = bert_base.get_config() if family == "bert" else modernbert_base.get_config()
  # MLM alone, on packed rows (as RoBERTa and ModernBERT continue): a checkpoint's NSP
  # head is kept in it but not trained; ('mlm', 'nsp') trains it (fresh where absent).
  c.objectives = ("mlm",)
  model = c.model
  c.model = ml_collections.ConfigDict()  # The rest is the checkpoint's.
  for field in ("dtype", "param_dtype", "attention_impl", "scan_layers", "remat_policy"):
    c.model[field] = model[field]  # As commented in configs/bert_base.py.
  # Replaced-token detection (--config.objectives="('rtd',)", an ELECTRA or DeBERTa-v3
  # checkpoint): the discriminator is the checkpoint's; the generator
  # config.init_generator_from's, else fresh at these sizes. 0: the generator
  # checkpoint's, or for a fresh one the family's fraction of the discriminator's
  # (ELECTRA: 1/4 of the width, heads and FFN; DeBERTa-v3: half the depth).
  c.generator = ml_collections.ConfigDict()
  c.generator.hidden_size = 0
  c.generator.num_heads = 0
  c.generator.intermediate_size = 0
  c.generator.num_layers = 0
  c.rtd = ml_collections.ConfigDict()
  c.rtd.discriminator_weight = 50.0  # lambda: ELECTRA's 50 (DeBERTa-v3's rtd.sh: 10).
  c.rtd.embedding_sharing = ""  # '': the family's (ELECTRA 'tied', DeBERTa 'gdes').
  c.data.max_seq_length = 128  # Tokens per row (the checkpoint's positions allow more).
  c.data.max_predictions_per_seq = 20  # At 15% of 128 (twice that at modernbert's 30%).
  c.data.length_phases = ()  # One length throughout.
  c.data.masked_lm_prob_phases = ()
  c.data.eval_fraction = 0.05  # Documents held out per source (domain and general).
  c.train.batch_size = 64
  c.train.batch_by_tokens = False
  c.train.batch_warmup_tokens = 0
  c.train.num_steps = 2_000
  c.train.learning_rate = 5e-5  # Below a pretraining peak: the weights are trained.
  c.train.learning_rate_restarts = ()
  c.train.warmup_steps = 100
  c.train.schedule = "linear"
  c.train.decay_start = "warmup_end"  # From the peak to 0 at the last step.
  c.train.eval_every = 500
  c.train.eval_batches = 20
  c.evals.eval.at_start = True  # The checkpoint's held-out MLM: the baseline.
  c.train.checkpoint_every = 500
  c.train.log_every = 50
  if family != "bert":  # ModernBERT's pretraining's masking, packing and optimizer.
    c.data.masked_lm_prob_phases = ((1.0, 0.3),)  # 30% in training (15% held out).
    c.data.max_predictions_per_seq = 40  # round(0.3 * 126) = 38 fit.
    # The authors' dropout on Wo's output (Hugging Face's config has no such field, so
    # a checkpoint from there holds 0).
    c.model.attention_output_dropout = 0.1
  if family == "mmbert":  # mmBERT's decay phase (configs/mmbert_base.py's sources).
    c.data.masked_lm_prob_phases = ((1.0, 0.05),)  # 5% in training (15% held out).
    c.data.max_predictions_per_seq = 20  # round(0.05 * 126) = 6 fit.
    c.train.b2, c.train.eps, c.train.weight_decay = 0.95, 1e-8, 8e-5
    c.train.schedule = "wsd"
    c.train.decay_fraction = 0.95  # Every step after the warm-up's 100 of 2,000 ...
    c.train.decay_shape = "1-sqrt"  # ... as the decay phase's one_minus_sqrt ...
    c.train.final_lr_fraction = 0.02  # ... to 2% (alpha_f).
  return c
