"""mmBERT-base (Marone et al. 2025, "mmBERT: A Modern Multilingual Encoder with Annealed
Language Learning", arXiv 2509.06888): ModernBERT's architecture (configs/modernbert_base.py)
with the Gemma 2 tokenizer's 256,000 pieces: 22 pre-LN layers, H=768, I=1152 (GeGLU),
A=12, a 128-token sliding window with global attention every third layer;
307,786,240 parameters with the MLM head (Hugging Face's ModernBertForMaskedLM count,
111.2M without the embedding; the authors: 307M and 110M).

The recipe is the authors' three Composer runs (github:JHU-CLSP/mmBERT,
configs/mmBERT-base.yaml, -ext.yaml, -decay.yaml: "pt", "ext", "decay" below) in ONE
run, its cascading annealed language learning included: languages join by phase and
are sampled at a falling tau (q_i ~ p_i^tau of their token counts):

  phase     steps    rows x length   tokens  sources            tau  masking  lr                    theta (global, local)
  pretrain  500,150  4,608 x 1,024   2.3T    60 langs + code    0.7  30%      warm-up 3B tok, 8e-4  10,000
  ext        15,895  4,608 x 8,192   600B    109 langs + code   0.5  15%      8e-4, constant        160,000
  decay       2,649  4,608 x 8,192   100B    every source       0.3   5%      8e-4 -> 1.6e-5, 1-sqrt 160,000

Every number and where it comes from:
- Phase tokens: the paper (2.3T, 600B, 100B; the authors' README rounds the first to
  2.0T); mmBERT-small-ext.yaml's cumulative `max_duration: 2900000000000tok` less ext's
  600B gives the same 2.3T (pt's own `max_duration: 400000000000tok` is one resumed
  segment's). ext `max_duration: 600000000000tok`, decay `100000000000tok` (both
  `reset_time_once: true`).
- Rows: `global_train_batch_size: 4608` in all three yamls, at `max_seq_len` 1024 (pt),
  8192 (ext, decay): 4,718,592 tokens a step, then 37,748,736 (rows, not tokens, stay
  fixed: `train.batch_by_tokens` False). Steps = tokens / tokens a step (the warm-up's
  below included; `tests/test_mmbert_recipe.py` derives them with `bertjax.data.phases`).
- Batch-size warm-up: pt `batch_size_warmup_tokens: 60000000000tok`,
  `batch_size_warmup_min_size: 48` (a micro-batch per GPU). The yamls do not give the
  GPU count; 8, as ModernBERT's authors ran, is assumed here: sizes of 384 .. 4,224 rows
  in steps of 384 (`batch_warmup_sizes` 11), each for 2,312 steps.
- Learning rate: pt `lr: 0.0008`, `warmup_stable_decay` with `t_warmup: 3000000000tok`
  (3B tokens: 4,856 steps through the first three warm-up sizes), `t_decay: 0tok`; ext the
  same lr and scheduler with `t_warmup: 0tok`, `t_decay: 0tok` (constant); decay
  `one_minus_sqrt`, `alpha_f: 0.02` over all its 100B tokens (`decay_fraction` =
  2,649 / 518,694, to 8e-4 x 0.02).
- Optimizer: `decoupled_stableadamw`, betas (0.9, 0.95), eps 1e-8, weight decay 8e-5,
  not on biases and norms (`filter_bias_norm_wd`), no gradient clipping (as
  configs/modernbert_base.py: optimi's StableAdamW with fully decoupled decay).
- Masking: the paper and the authors' README: 30% in pretraining, 15% in ext
  (`mlm_probability: 0.15`), 5% in the decay (`0.05`): `masked_lm_prob_phases`. pt's
  yaml for base says `mlm_probability: 0.25` (small's says 0.3); the paper's 30% is
  used. The held-out batches are masked at 15% throughout (bertjax's choice, as for
  ModernBERT: one rate to compare phases by; the yamls evaluate rarely).
- Languages (`config.data.source_phases`): the sources of each phase are the
  non-zero columns of the authors' statistics/language_counts.csv: `pretrain` (60
  languages and `code`, `PRETRAIN_LANGUAGES`), `ext` (49 more, `EXT_LANGUAGES`); the
  decay reads every source the run names (the authors' `decay-all`: 1,833 languages).
  Tau 0.7, 0.5, 0.3: the paper (and the README's "Temperature Annealing: 0.7 -> 0.5 ->
  0.3"); p_i counts tokens (`data.language_counts`).
- Rotary theta: pt `rotary_emb_base: 10000`, `local_attn_rotary_emb_base: 10000`; ext /
  decay 160,000 for both (`model.global_rope_theta_phases`,
  `model.local_rope_theta_phases`; inference and export use 160,000).
- Model: `num_hidden_layers: 22`, `hidden_size: 768`, `intermediate_size: 1152`,
  `num_attention_heads: 12`, `vocab_size: 256000`, `sliding_window: 128`,
  `global_attn_every_n_layers: 3`, `norm_kwargs: eps 1e-5, bias false`, no biases in
  the attention and MLP, `attn_out_dropout_prob: 0.1` (the Wo output only), embedding and
  MLP dropout 0, `init_method: full_megatron` (ModernBERT's init); pad 0, eos / sep 1,
  bos 2 (the [CLS] position), mask 4: the Gemma 2 tokenizer's ids (`train_loader`).
  `seed: 21`; packed rows, documents isolated (`sequence_packing: true`).
Not reproduced: the data (FineWeb2, DCLM, Dolmino and the rest, re-mixed per phase:
give each language's corpus); the three decay mixtures the authors trained
(`decay-eng`, `decay-mid`, `decay-all`) and merged: train each with its
`--config.data.source_phases` last phase and merge them with `python -m bertjax.merge`
(docs/multilingual.md); tokens counted as rows x length.

The tokenizer is Gemma 2's (google/gemma-2-9b, gated; mmBERT's own folders ship it):
give its folder. Without one, a byte-level BPE of 256,000 pieces is trained on the
corpus, which is no longer mmBERT.

  python -m bertjax.main --config=configs/mmbert_base.py:/data/mmbert --workdir=gs://b/mmbert \
      --config.data.tokenizer.path=/models/mmBERT-base
(`:/data/mmbert`: a folder with a corpus folder per language code, e.g. /data/mmbert/deu:
the run's sources are every folder there, `languages`; without it, or for a folder not
there, the first two phases' 110 sources under it, and the decay reads those.)
"""

import os

from configs import modernbert_base, model_section

# statistics/language_counts.csv: the sources with tokens in the `pretrain` column, and
# those `ext` adds (every other source joins in the decay).
PRETRAIN_LANGUAGES = (
    "afr arb azj ben bul ces cmn code dan deu ekk ell eng fas fil fin fra gle glg guj heb "
    "hin hrv hun ind ita jpn kat kaz khk khm kor lit lvs mal mar mkd mya nld nob npi pbt "
    "pol por ron rus sin slk slv spa swe swh tam tel tha tur ukr urd vie xho zsm").split()
EXT_LANGUAGES = (
    "als amh anp ars ary arz bel bew bod bos cat ceb ckb cym epo eus fry gla gmh gsw hat "
    "hif hye isl jav kan kir kmr lao lat ltz mlt mri mww nap nno nrm ory pan pcm plt rmy "
    "snd som srp tat tgk uzn yue").split()
TAUS = (0.7, 0.5, 0.3)  # Each phase's sampling temperature.

# Steps of each phase (the docstring): pretraining (its batch-size warm-up of 11 x 2,312
# steps included), context extension, decay.
PRETRAIN, EXT, DECAY = 500_150, 15_895, 2_649
STEPS = PRETRAIN + EXT + DECAY


DATA = "/data/mmbert"  # Where the sources are without a config argument: DATA/<code>.


def languages(root: str) -> str:
  """`config.data.languages` of a folder holding a corpus per language code: every
  folder or file there, named by its name without extension; a folder not (yet) there:
  the first two phases' sources, root/<code>."""
  if not os.path.isdir(root):
    return ",".join(f"{n}={root}/{n}" for n in PRETRAIN_LANGUAGES + EXT_LANGUAGES)
  names = sorted(os.listdir(root))
  return ",".join(f"{os.path.splitext(n)[0]}={os.path.join(root, n)}" for n in names)


def source_phases(fractions, first, second, taus=TAUS) -> tuple:
  """`config.data.source_phases` of three phases: `first`'s sources, then with
  `second`'s, then every source, at `taus`."""
  return ((fractions[0], ",".join(first), taus[0]),
          (fractions[1], ",".join(first + second), taus[1]), (fractions[2], "", taus[2]))


def model_config(**fields):
  """mmBERT-base's `config.model` (the authors' yamls; ModernBERT's family defaults)."""
  return model_section(
      "modernbert", vocab_size=256_000, max_position_embeddings=8192,
      global_rope_theta=160_000.0, local_rope_theta=160_000.0,
      global_rope_theta_phases=(10_000.0, 160_000.0, 160_000.0),
      local_rope_theta_phases=(10_000.0, 160_000.0, 160_000.0),
      attention_output_dropout=0.1, pad_token_id=0, **fields)


def get_config(arg=None):
  """`arg`: a folder with a corpus per language code (`languages`; default the first
  two phases' 110 sources under DATA)."""
  c = modernbert_base.get_config()
  c.seed = 21
  c.model = model_config()
  fractions = (PRETRAIN / STEPS, EXT / STEPS, DECAY / STEPS)
  c.data.length_phases = ((fractions[0], 1024), (fractions[1], 8192), (fractions[2], 8192))
  c.data.masked_lm_prob = 0.15  # The held-out batches' rate.
  c.data.masked_lm_prob_phases = tuple(zip(fractions, (0.3, 0.15, 0.05)))
  c.data.max_predictions_per_seq = 1232  # 15% of 8,192 (x2 at 30%; 154 x 2 at 1,024).
  c.data.corpus = ""
  c.data.languages = languages(arg or DATA)
  c.data.language_counts = "tokens"
  c.data.source_phases = source_phases(fractions, PRETRAIN_LANGUAGES, EXT_LANGUAGES)
  c.data.tokenizer.vocab_size = 256_000
  c.train.batch_size = 4608  # Rows in every phase (tokens a step x8 from the ext phase).
  c.train.batch_by_tokens = False
  c.train.batch_warmup_tokens = 60_000_000_000  # 384, 768, ..., 4,224 rows of 1,024 ...
  c.train.batch_warmup_sizes = 11  # ... 2,312 steps each, then 4,608.
  c.train.num_steps = STEPS
  c.train.learning_rate = 8e-4
  c.train.learning_rate_restarts = ()
  c.train.warmup_steps = 4_856  # 3B tokens through the 384-, 768- and 1,152-row sizes.
  c.train.decay_fraction = DECAY / STEPS  # The decay phase: 1-sqrt over its 100B tokens ...
  c.train.final_lr_fraction = 0.02  # ... to 8e-4 x 0.02 (alpha_f).
  c.train.weight_decay = 8e-5
  c.train.b1 = 0.9
  c.train.b2 = 0.95
  c.train.eps = 1e-8
  return c
