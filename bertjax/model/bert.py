"""The 'bert' family (BERT, RoBERTa, XLM-R, SpanBERT): the post-LN encoder, the
pretraining heads (MLM, NSP; SpanBERT's SBO: `sbo.py`), the task heads' trunk, its
FLOPs, and the `FAMILY` that gives all of it to the rest of bertjax."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model import layers, layout
from bertjax.model.config import ModelConfig
from bertjax.model.family import Family
from bertjax.model.layers import BATCH, EMBED, LENGTH
from bertjax.model.sbo import SpanBoundaryHead


class Encoder(nn.Module):
  """Embeddings, `num_layers` post-LN blocks and the pooler (dense + tanh on [CLS])."""

  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.embeddings = layers.Embeddings(cfg)
    self.layers = layers.block_stack(cfg)
    if cfg.pooler:
      self.pooler = layers.dense(cfg, cfg.hidden_size, ("embed", "hidden"), ("hidden",),
                                 "pooler")

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None,
               position_ids=None, segment_ids=None, deterministic: bool = True,
               output_hidden_states: bool = False):
    """input_ids: [B, T] int; attention_mask: [B, T] (1 real, 0 pad); token_type_ids:
    [B, T] segment A/B; position_ids: [B, T] (default from the config); segment_ids:
    [B, T] document ids of a packed row (no attention across documents).

    Returns a dict: `last_hidden_state` [B, T, E], `pooled` [B, E] (when the config has a
    pooler) and, with `output_hidden_states`, `hidden_states` [L+1, B, T, E]
    (embedding output first).
    """
    cfg = self.config
    if attention_mask is None:
      attention_mask = (input_ids != cfg.pad_token_id).astype(jnp.int32)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if position_ids is None:
      position_ids = layers.position_ids_for(cfg, input_ids)
    mask = layers.encoder_mask(attention_mask, segment_ids)
    x = self.embeddings(input_ids, token_type_ids, position_ids, deterministic)
    if cfg.scan_layers:
      embedded = x
      x, ys = self.layers(x, mask, deterministic, output_hidden_states)  # ys [L, B, T, E]
      hidden = [embedded[None], ys] if output_hidden_states else []
    else:
      hidden = [x[None]]
      for layer in self.layers:
        x = layer(x, mask, deterministic, False)
        hidden.append(x[None])
    out = {"last_hidden_state": x}
    if cfg.pooler:
      out["pooled"] = self.pool(x[:, 0])
    if output_hidden_states:
      out["hidden_states"] = jnp.concatenate(hidden)
    return out

  def pool(self, cls: jax.Array) -> jax.Array:
    """The pooler: dense + tanh of [CLS] vectors [..., E] -> [..., E]."""
    return jnp.tanh(self.pooler(cls))

  def attend(self, x):
    return self.embeddings.attend(x)


class MLMHead(nn.Module):
  """dense + GELU + LayerNorm, then the tied input embedding plus a vocab bias."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, encoder: Encoder) -> jax.Array:
    """[B, P, E] hidden states at the masked positions -> [B, P, vocab] logits."""
    cfg = self.config
    x = layers.dense(cfg, cfg.hidden_size, ("embed", "hidden"), ("hidden",), "transform")(x)
    x = layers.layer_norm(cfg, "transform_norm")(nn.gelu(x, approximate=False))
    bias = self.param("bias", layers.zeros_init(("vocab",)), (cfg.vocab_size,),
                      cfg.param_dtype)
    logits = encoder.attend(x) + bias.astype(cfg.dtype)
    return layers.constrain(logits, (BATCH, None, "activation_vocab"))


class BertForPreTraining(nn.Module):
  """Encoder + MLM head (computed only at `masked_lm_positions`) + optional NSP and
  SpanBERT SBO heads."""

  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.encoder = Encoder(cfg)
    self.mlm = MLMHead(cfg)
    if cfg.nsp:
      self.nsp = layers.dense(cfg, 2, ("embed", "classes"), ("classes",), "nsp")
    if cfg.sbo:
      self.sbo = SpanBoundaryHead(cfg)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None,
               masked_lm_positions=None, position_ids=None, segment_ids=None,
               span_left_positions=None, span_right_positions=None,
               span_relative_positions=None, deterministic: bool = True):
    """masked_lm_positions: [B, P] indices into T (P = max_predictions_per_seq); None
    computes the MLM logits at every position (P = T).

    span_left_positions, span_right_positions, span_relative_positions: [B, P] span
    boundaries and offsets of each prediction (SBO only, from span masking).

    Returns `mlm_logits` [B, P, vocab], with NSP `nsp_logits` [B, 2] and with SBO
    `sbo_logits` [B, P, vocab] (float32).
    """
    out = self.encoder(input_ids, attention_mask, token_type_ids, position_ids,
                       segment_ids, deterministic)
    x = hidden = out["last_hidden_state"]
    if masked_lm_positions is not None:
      x = jnp.take_along_axis(x, masked_lm_positions[..., None].astype(jnp.int32), axis=1)
      x = layers.constrain(x, (BATCH, None, EMBED))
    result = {"mlm_logits": self.mlm(x, self.encoder).astype(jnp.float32)}
    if self.config.nsp:
      result["nsp_logits"] = self.nsp(out["pooled"]).astype(jnp.float32)
    if self.config.sbo and (span_left_positions is not None or self.is_initializing()):
      if span_left_positions is None:  # init without span inputs: create the params
        span_left_positions = span_right_positions = span_relative_positions = (
            jnp.zeros(x.shape[:2], jnp.int32))
      result["sbo_logits"] = self.sbo(hidden, span_left_positions, span_right_positions,
                                      span_relative_positions, self.encoder
                                      ).astype(jnp.float32)
    return result

  def encode(self, input_ids, attention_mask=None, token_type_ids=None,
             output_hidden_states: bool = True):
    """The encoder alone (for `load_pretrained(...).encode`)."""
    return self.encoder(input_ids, attention_mask, token_type_ids,
                        output_hidden_states=output_hidden_states)

  def init_params(self, rng: jax.Array):
    """The parameters (boxed in `nn.Partitioned`, with their logical axes) drawn from
    `rng`; their shapes do not depend on the dummy [1, 8] input used to create them."""
    ids = jnp.zeros((1, 8), jnp.int32)
    return self.init({"params": rng}, ids,
                     masked_lm_positions=jnp.zeros((1, 2), jnp.int32))["params"]


# ---- The task heads' trunk (Hugging Face's Bert/RobertaFor* heads) ----------------

def _pooled_or_cls(config: ModelConfig, out: dict, deterministic: bool) -> jax.Array:
  """[B, E]: the pooler's output (dense + tanh on [CLS]) when the encoder has one;
  else RoBERTa's classification head's first half, a dense + tanh of the head's own
  ('pooler', freshly initialised) over the dropped-out [CLS] vector."""
  if config.pooler:
    return out["pooled"]
  cls = nn.Dropout(config.dropout_rate)(out["last_hidden_state"][:, 0],
                                        deterministic=deterministic)
  dense = layers.dense(config, config.hidden_size, ("embed", "hidden"), ("hidden",), "pooler")
  return jnp.tanh(dense(cls))


def sequence_features(config: ModelConfig, out: dict, deterministic: bool) -> jax.Array:
  """[B, E]: the pooled [CLS] vector (`_pooled_or_cls`) with dropout."""
  return nn.Dropout(config.dropout_rate)(_pooled_or_cls(config, out, deterministic),
                                         deterministic=deterministic)


def token_features(config: ModelConfig, out: dict, deterministic: bool,
                   dropout: bool) -> jax.Array:
  """[B, T, E]: the last hidden states, with dropout when `dropout` (tagging; BERT's
  span-QA head reads them as they are)."""
  x = out["last_hidden_state"]
  return nn.Dropout(config.dropout_rate)(x, deterministic=deterministic) if dropout else x


def output_layer(config: ModelConfig, features: int, name: str) -> nn.Dense:
  """A head projection [E] -> [features] with BERT's initialiser and logical axes."""
  return layers.dense(config, features, ("embed", "classes"), ("classes",), name)


def slot_features(config: ModelConfig, encoder: Encoder, out: dict, batch: dict) -> dict:
  """Each packed example's [CLS] vector as a row of its own ([B*K, 1, E]), pooled by
  the encoder's pooler when it has one."""
  B, K = batch["cls_positions"].shape
  cls = jnp.take_along_axis(out["last_hidden_state"], batch["cls_positions"][..., None],
                            axis=1).reshape(B * K, 1, -1)  # [B*K, 1, E]
  slots = {"last_hidden_state": cls, "attention_mask": jnp.ones((B * K, 1), jnp.int32)}
  if config.pooler:
    slots["pooled"] = encoder.pool(cls[:, 0])
  return slots


def train_flops(cfg: ModelConfig, batch: int, seq: int, predictions: int
                ) -> dict[str, float]:
  """FLOPs of one training step (forward + backward = 3 x forward) by term, and their
  `total`:

    6 * N_enc * B * T                 the encoder's matmuls, N_enc = L * (4 E^2 + 2 E M)
                                      (weights only: no embeddings, biases, LayerNorms)
    + 12 * L * B * T^2 * E            attention scores Q K^T and the weighted sum P V
    + 6 * B * P * (E^2 + E V)         the MLM head at the P masked positions only
    + 6 * B * (E^2 + 2 E)             pooler and NSP classifier on [CLS] (when present)

  B batch, T length, P masked positions per row, L layers, E hidden, M intermediate,
  V vocabulary. Embedding lookups are gathers (no FLOPs); element-wise work (softmax,
  GELU, LayerNorm, the optimizer) is not model FLOPs, as in the PaLM MFU definition.
  Hugging Face's `BertForPreTraining` computes the MLM logits at every position: its
  FLOPs are `train_flops(cfg, B, T, predictions=T)`."""
  E, M, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.vocab_size
  n_enc = L * (4 * E * E + 2 * E * M)
  terms = {
      "encoder_matmuls": 6.0 * n_enc * batch * seq,
      "attention": 12.0 * L * batch * seq * seq * E,
      "mlm_head": 6.0 * batch * predictions * (E * E + E * V),
      "pooler_nsp": 6.0 * batch * ((E * E if cfg.pooler else 0) + (2 * E if cfg.nsp else 0)),
  }
  terms["total"] = sum(terms.values())
  return terms


FAMILY = Family(
    name="bert", config=ModelConfig, pretraining=BertForPreTraining, encoder=Encoder,
    to_layout=layout.to_layout,
    # BERT's recipe trains the pooler and NSP; RoBERTa's (positions past the padding
    # id) neither, but a pooler serves its classifiers.
    pretraining_heads=lambda c: dataclasses.replace(c, pooler=True,
                                                    nsp=c.position_offset == 0),
    train_flops=train_flops,
    sequence_features=sequence_features, token_features=token_features,
    output_layer=output_layer, head_dropout=lambda config: config.dropout_rate,
    slot_features=slot_features,
    phase_inputs=lambda config, lengths: [{} for _ in lengths])  # trains at any length
