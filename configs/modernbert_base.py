"""ModernBERT-base (Warner et al. 2024): 22 pre-LN layers, H=768, I=1152 (GeGLU), A=12,
rotary positions, global attention every third layer and a 128-token sliding window in
the others, 149.7M parameters with the MLM head (the Hugging Face model's count).

The model is Hugging Face's ModernBERT-base (`answerdotai/ModernBERT-base` config.json:
`python -m bertjax.convert --to=bertjax` imports it). The pretraining recipe is the
paper's phase 1 (section 2.2 and Table 3's training settings; the authors'
yamls/modernbert/modernbert-base-pretrain.yaml): 30% masking, StableAdamW (lr 8e-4,
betas 0.9 / 0.98, eps 1e-6, decoupled weight decay 1e-5, no gradient clipping), a
warm-up-stable-decay schedule, packed 1,024-token rows with documents isolated.

  python -m bertjax.main --config=configs/modernbert_base.py --workdir=/tmp/modernbert \
      --config.data.corpus=/data/prepared --config.data.tokenizer.path=/data/tokenizer
"""

import ml_collections

from configs import bert_base


def model_config() -> ml_collections.ConfigDict:
  """ModernBERT-base's `config.model` (Hugging Face's ModernBertConfig defaults)."""
  m = ml_collections.ConfigDict()
  m.family = "modernbert"  # Pre-LN, GeGLU, rotary, alternating global / local attention.
  m.vocab_size = 50368  # ModernBERT's BPE vocabulary (50,280 tokens, padded to 64).
  m.hidden_size = 768  # H.
  m.num_layers = 22  # L, pre-LN blocks.
  m.num_heads = 12  # A; the head size (H / A) must be even (rotary pairs its halves).
  m.intermediate_size = 1152  # GeGLU's width: Wi maps H -> 2 x this.
  m.max_position_embeddings = 8192  # The context trained for (no position table).
  m.pad_token_id = 50283  # [PAD] in ModernBERT's vocabulary.
  m.norm_eps = 1e-5  # LayerNorm epsilon.
  m.norm_bias = False  # LayerNorms without a bias.
  m.attention_bias = False  # Wqkv and Wo without biases.
  m.mlp_bias = False  # Wi and Wo without biases.
  m.classifier_bias = False  # The heads' dense layer without a bias.
  m.decoder_bias = True  # The MLM vocabulary bias.
  m.global_attn_every_n_layers = 3  # Blocks 0, 3, 6, ... attend globally.
  m.local_attention = 128  # The others: a window of 128 tokens (64 each side).
  m.global_rope_theta = 160_000.0  # Rotary base of the global layers.
  m.local_rope_theta = 10_000.0  # Rotary base of the local layers.
  m.embedding_dropout = 0.0  # Dropout after the embedding norm.
  m.attention_dropout = 0.0  # Dropout on attention probabilities and Wo's output.
  m.mlp_dropout = 0.0  # Dropout inside GeGLU.
  m.classifier_dropout = 0.0  # Dropout in the task heads.
  m.hidden_activation = "gelu"  # GeGLU's activation (exact GELU).
  m.classifier_activation = "gelu"  # The heads' dense activation.
  m.classifier_pooling = "cls"  # Sequence heads pool 'cls' (first token) or 'mean'.
  m.initializer_range = 0.02  # Truncated-normal std of the input projections.
  m.initializer_cutoff_factor = 2.0  # Truncation, in standard deviations.
  # '' = the fastest path the platform, dtype and attention dropout allow (logged at
  # start-up); or 'xla', 'cudnn' (GPU), 'pallas_gpu' (GPU) or 'splash' (TPU).
  m.attention_impl = ""
  m.scan_layers = False  # nn.scan over blocks 1..L-1: compile time independent of depth.
  m.remat_policy = "none"  # Recompute in backward: 'none', 'full', 'dots', 'dots_no_batch'.
  # Activation dtype: '' = bfloat16 on GPUs and TPUs, float32 on the CPU; or 'float32',
  # 'bfloat16', 'float16'. Softmax / LayerNorm statistics and the loss are float32.
  m.dtype = ""
  m.param_dtype = "float32"  # Master-weight dtype (keep float32).
  return m


def get_config(arg=None):
  c = bert_base.get_config(arg)
  c.model = model_config()
  c.data.max_seq_length = 1024  # Packed 1,024-token rows.
  c.data.masked_lm_prob = 0.3  # 30% of the tokens predicted.
  c.data.max_predictions_per_seq = 308  # round(0.3 * 1022) = 307 fit.
  c.data.length_phases = ()  # One length here (the long-context phase: an override).
  c.data.packing = "full_sentences"  # Rows filled across documents ...
  c.data.isolate_documents = True  # ... each attending only to itself.
  c.data.tokenizer.kind = "byte_level_bpe"  # Trained on the corpus unless a path is given.
  c.data.tokenizer.lowercase = False
  c.data.tokenizer.vocab_size = 50368
  c.train.batch_size = 4608  # Rows of 1,024 tokens per step (after batch-size warm-up).
  c.train.num_steps = 364_000  # Phase 1: 1.719T tokens / (4,608 x 1,024).
  c.train.optimizer = "stable_adamw"
  c.train.learning_rate = 8e-4
  c.train.warmup_steps = 3_000  # 3B tokens of linear warm-up.
  c.train.schedule = "wsd"
  c.train.decay_fraction = 0.0  # Phase 1 holds the peak; the decay is a later phase.
  c.train.decay_shape = "1-sqrt"
  c.train.final_lr_fraction = 0.001
  c.train.weight_decay = 1e-5
  c.train.decouple_lr = True  # Composer's / optimi's fully decoupled weight decay.
  c.train.b1 = 0.9
  c.train.b2 = 0.98
  c.train.eps = 1e-6
  c.train.max_grad_norm = 0.0  # StableAdamW's update clipping replaces it.
  return c
