"""ModernBERT-base (Warner et al. 2024, "Smarter, Better, Faster, Longer"): 22 pre-LN
layers, H=768, I=1152 (GeGLU), A=12, rotary positions, global attention every third
layer and a 128-token sliding window in the others; 149,655,232 parameters with the MLM
head, Hugging Face's count (149.0M in the encoder).

The model is Hugging Face's ModernBERT-base (`answerdotai/ModernBERT-base` config.json;
`python -m bertjax.convert --to=bertjax` imports it). The recipe is the paper's whole
pretraining, section 2.2 (Training Settings; Context Length Extension) and the
training-settings table of its appendix (Table 3), in ONE run: the authors' three
Composer runs, their yamls/modernbert/modernbert-base-{pretrain, context-extension,
learning-rate-decay}.yaml (github:AnswerDotAI/ModernBERT, branch
pretraining_documentation; "pt", "ce", "lrd" below), one after the other:

  phase        steps    rows x length   tokens   lr                      global theta
  pretrain    374,901   4,608 x 1,024   1.719T   warm-up 3B tok, 8e-4    10,000
  context      52,982     576 x 8,192   250B     3e-4, constant          160,000
  decay        10,596     576 x 8,192   50B      3e-4 -> 3e-7, 1-sqrt    160,000

Every number and where it comes from:
- Phase lengths and tokens: pt `max_seq_len: 1024`, `max_duration: 1_719_000_000_000tok`;
  ce `max_seq_len: 8192`, 250B tok; lrd 8192, 50B tok. Steps = tokens / (tokens per
  step), the batch warm-up's included (below): 21,195 + 353,706 = 374,901, then
  250e9 / 4,718,592 and 50e9 / 4,718,592 (`tests/test_modernbert_recipe.py` derives
  them from those tokens with `bertjax.data.phases`).
- Batch by tokens: pt `global_train_batch_size: 4608` rows of 1,024 = ce / lrd 576 rows
  of 8,192 = 4,718,592 tokens per step (`train.batch_by_tokens`, batch_size 576 at
  max_seq_length 8,192).
- Batch-size warm-up: pt `batch_size_warmup_min_size: 96` (a micro-batch per GPU, 8
  GPUs: 768 rows), `batch_size_warmup_tokens: 50_000_000_000tok`; the packer
  (src/sequence_packer.py) steps up by a micro-batch per GPU, 768 .. 3,840 rows, each
  size for the same number of steps: `batch_warmup_sizes` 5 -> 4,239 steps each.
- Learning rate: pt `lr: 8e-4` after `t_warmup: 3_000_000_000tok` (3B tokens at 768 x
  1,024 = 3,815 steps, all inside the first batch size), held (`t_decay: 0tok`); ce
  `lr: 3e-4`, `constant_with_warmup`, `t_warmup: 0tok`; lrd `one_minus_sqrt`, `alpha_f:
  0.001` over all 50B tokens (`decay_fraction` = 10,596 / 438,479, to 3e-4 x 0.001).
  The paper: "a constant LR of 8e-4 for 1.7 trillion tokens following a 3 billion token
  warmup", then "a constant lower learning rate of 3e-4 for 250 billion tokens", then
  "a 1-sqrt LR schedule over 50 billion tokens". The 8e-4 -> 3e-4 change is
  `learning_rate_restarts` at the context phase's first step.
- Optimizer: `decoupled_stableadamw` (main.py: optimi's StableAdamW, `decouple_lr=True`),
  betas (0.9, 0.98), eps 1e-6, weight decay 1e-5 (pt, ce, lrd), not on biases and
  norms (`filter_bias_norm_wd`), no gradient clipping. The decay per step is
  lr_t / 8e-4 x 1e-5 in every phase: optimi's `max_lr` (8e-4) is restored with the
  optimizer state, `restart_override` resets only lr and weight_decay (main.py).
- Masking: `mlm_probability: 0.3` in training (pt, ce, lrd), 0.15 for the held-out
  batches ("We always evaluate at 15% masking for consistent comparison"): hence
  masked_lm_prob 0.15 (evaluation) and masked_lm_prob_phases ((1.0, 0.3),) (training,
  twice the predictions per row).
- Rotary theta: pt `rotary_emb_base: 10000.0` on every layer; ce / lrd
  `rotary_emb_base: 160000.0` (global), `local_attn_rotary_emb_base: 10000.0`
  (`model.global_rope_theta_phases`; inference and export use the final 160,000).
- Sliding window 128, global attention every 3 layers (`sliding_window: 128`,
  `global_attn_every_n_layers: 3`); dropout 0.1 after the attention output projection
  only (`attn_out_dropout_prob: 0.1`; embedding, MLP and probabilities 0:
  `model.attention_output_dropout`); LayerNorm eps 1e-5 without bias; packed rows with
  documents isolated (`sequence_packing: true`, unpadded attention per document; here
  without a separator between two documents: `data.packing='stream'`);
  `seed: 17`; evaluation, checkpoints every 4,000 steps (`eval_interval`,
  `save_interval: 4000ba`), logs every 100 (`console_log_interval: 100ba`).
- Initialisation: `init_method: full_megatron`, Hugging Face's `_init_weights` (which
  bertjax's ModernBERT reproduces): truncated normal, std 0.02, output projections
  0.02 / sqrt(2 L).
Not reproduced: the data mixtures (1.7T tokens of the authors' corpus; the context
phase's re-sampled and the decay phase's up-sampled sources: give each phase's data
with `--config.data.corpus`, one corpus here); masking of [CLS] / [SEP] (the authors'
packer may mask any non-padding token, bertjax never masks special tokens); tokens are
counted as rows x length (the packer counts non-padding tokens; packed rows are full
but for a few tenths of a percent). The held-out MLM is measured at max_seq_length
(8,192) with the final theta throughout, so it reads low until the context phase.

Other schedules of the same family, as overrides: mmBERT's masking 30% -> 15% -> 5%
(github:JHU-CLSP/mmBERT) is
  --config.data.masked_lm_prob_phases='((0.855,0.3),(0.121,0.15),(0.024,0.05))'
(rates switching with these length phases: 374,901 / 52,982 / 10,596 of 438,479 steps).

  python -m bertjax.data.prepare --config=configs/modernbert_base.py --input=/data/text \
      --tokenizer=/data/tokenizer --output=/data/prepared --workers=64
  python -m bertjax.main --config=configs/modernbert_base.py --workdir=gs://bucket/mb \
      --config.data.corpus=/data/prepared --config.data.tokenizer.path=/data/tokenizer
"""

import ml_collections

from configs import bert_base, model_section

# Steps of each phase (see the docstring): pretraining (its batch-size warm-up of 5 x
# 4,239 steps included), context extension, decay.
PRETRAIN, CONTEXT, DECAY = 374_901, 52_982, 10_596
STEPS = PRETRAIN + CONTEXT + DECAY


def model_config() -> ml_collections.ConfigDict:
  """ModernBERT-base's `config.model`: the family's defaults (bertjax/model/modernbert.py:
  Hugging Face's ModernBertConfig), with the authors' pretraining choices."""
  return model_section(
      "modernbert",
      # The global layers' theta in each length phase: 10k at 1,024 tokens, then 160k
      # for the context extension and the decay (pt / ce / lrd `rotary_emb_base`).
      global_rope_theta_phases=(10_000.0, 160_000.0, 160_000.0),
      attention_output_dropout=0.1)  # Wo's output only (the authors' attn_out_dropout_prob).


def get_config(arg=None):
  c = bert_base.get_config(arg)
  c.seed = 17  # The yamls' seed (the data order differs from Composer's anyway).
  c.objectives = ("mlm",)  # Masked-LM alone (30% masking, below).
  c.model = model_config()
  c.data.max_seq_length = 8192  # The longest rows (context and decay phases).
  # 1,024-token rows, then 8,192 (the same predictions per token).
  c.data.length_phases = ((PRETRAIN / STEPS, 1024), (CONTEXT / STEPS, 8192),
                          (DECAY / STEPS, 8192))
  c.data.masked_lm_prob = 0.15  # The held-out batches' rate (the authors' evaluation).
  c.data.masked_lm_prob_phases = ((1.0, 0.3),)  # Training: 30% throughout.
  # At 15%: >= round(0.15 * 8,192) at 8,192, 154 at 1,024; at 30%: 2,464 and 308.
  c.data.max_predictions_per_seq = 1232
  # Rows filled across documents back to back, no separator between two: on real text
  # it learned more than FULL-SENTENCES' separators on every seed, with isolation and
  # without (docs/pretraining.md, "What differs by design, measured").
  c.data.packing = "stream"
  c.data.isolate_documents = True  # Each document attending only to itself.
  c.data.tokenizer.kind = "byte_level_bpe"  # Trained on the corpus unless a path is given.
  c.data.tokenizer.lowercase = False
  c.data.tokenizer.vocab_size = 50368
  c.train.batch_size = 576  # Rows of 8,192 tokens per step; 4,608 rows of 1,024 ...
  c.train.batch_by_tokens = True  # ... in phase 1: 4,718,592 tokens every step.
  c.train.batch_warmup_tokens = 50_000_000_000  # 768, 1,536, ..., 3,840 rows of 1,024 ...
  c.train.batch_warmup_sizes = 5  # ... 4,239 steps each, then 4,608.
  c.train.num_steps = STEPS
  c.train.optimizer = "stable_adamw"
  c.train.learning_rate = 8e-4  # Phase 1's peak, and decouple_lr's maximum throughout.
  c.train.learning_rate_restarts = ((PRETRAIN / STEPS, 3e-4, 1e-5),)  # Context, decay.
  c.train.warmup_steps = 3_815  # 3B tokens at 768 x 1,024 tokens per step.
  c.train.schedule = "wsd"
  c.train.decay_fraction = DECAY / STEPS  # The decay phase: 1-sqrt over its 50B tokens ...
  c.train.decay_shape = "1-sqrt"
  c.train.final_lr_fraction = 0.001  # ... to 3e-4 x 0.001 (alpha_f).
  c.train.weight_decay = 1e-5
  c.train.decouple_lr = True  # Composer's / optimi's fully decoupled weight decay.
  c.train.b1 = 0.9
  c.train.b2 = 0.98
  c.train.eps = 1e-6
  c.train.max_grad_norm = 0.0  # StableAdamW's update clipping replaces it.
  c.train.log_every = 100
  c.train.eval_every = 4_000
  c.train.checkpoint_every = 4_000
  return c
