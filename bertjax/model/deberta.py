"""DeBERTa-v2 / DeBERTa-v3 (He et al. 2021), exact to Hugging Face's
`transformers.DebertaV2Model` / `DebertaV2ForMaskedLM` and the fine-tuning classes
(v5.24), as the family's parts of the shared encoder (`stack.py`):

- Embeddings: token embedding (`embedding_size` wide, `embed_proj` to the hidden size
  when it differs), + absolute positions when `position_biased_input` (v2; v3 has
  none), + token types when `type_vocab_size` > 0, LayerNorm, then multiplied by the
  attention mask (padding rows zero, as Hugging Face does) and dropout. The relative
  position embeddings ([2S, E], S the attention span below) and their LayerNorm
  (`norm_rel_ebd='layer_norm'`) live here too: every block reads them.
- Post-LN blocks: LN(x + Attn(x)), then LN(x + FFN(x)) (`hidden_act`, LayerNorm eps
  1e-7). Disentangled self-attention: scores = content-to-content Q K^T, + c2p
  Q . Kr[idx(i, j)] + p2c K_j . Qr[idx(i, j)] (`pos_att_type`), all scaled by
  1/sqrt(D * (1 + len(pos_att_type))); Kr / Qr the relative embeddings through the
  block's own key / query projections (`share_att_key`, v3) or through
  `pos_key_proj` / `pos_query_proj`; idx(i, j) = clip(bucket(i - j) + S, 0, 2S - 1),
  bucket the log-bucketed relative position (`position_buckets` > 0; Hugging Face's
  `make_log_bucket_position`, in float32) or i - j itself. The c2p + p2c terms are the
  [B, N, T, T] float32 score `bias` of the one attention function
  (`bertjax.model.attention`), whose 'xla' path alone takes a bias:
  `resolve_impl(..., bias=True)` picks it, a kernel named in `attention_impl` is a
  one-line ConfigError.
- Packed rows: relative positions depend on i - j only, so a document's scores are
  those of the document alone; `segment_ids` keep documents apart and, with
  `position_biased_input`, absolute positions restart at each document.
- MLM head (`mlm_transform`): dense (E -> embedding size) + `hidden_act` + LayerNorm,
  then the tied token embedding plus a vocabulary bias. Task heads: `task_features`
  (Hugging Face's `ContextPooler` on [CLS]: dropout `pooler_dropout`, dense,
  `pooler_hidden_act`; then dropout `cls_dropout`; per token: dropout for tagging,
  none for span QA) and `output_layer`.

Not supported: DeBERTa-v2-xlarge's convolution after the first block
(`conv_kernel_size`; `bertjax.hf.deberta` refuses such a checkpoint in one line).
Parameters carry Hugging Face's names where they are alike (`bertjax.hf.deberta`).
Shapes: B batch, T length, E hidden, N heads, D head size, M intermediate size,
V vocabulary, S the attention span (position_buckets, or max_relative_positions).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.errors import ConfigError
from bertjax.model import attention as attention_lib, layers, stack
from bertjax.model.config import FamilyConfig
from bertjax.model.family import Family, Head
from bertjax.model.layers import ACTIVATIONS, BATCH, EMBED, HEADS, KV, LENGTH, constrain

POS_ATT_TYPES = ("c2p", "p2c")
NORM_REL_EBD = ("none", "layer_norm")


@dataclasses.dataclass(frozen=True)
class DebertaConfig(FamilyConfig):
  """Hyperparameters of a DeBERTa-v2 / v3 encoder and its heads, with Hugging Face's
  `DebertaV2Config` names; the defaults are DeBERTa-v3-base's config.json."""

  family: ClassVar[str] = "deberta"  # config.model.family (bertjax.model.FAMILIES)
  # What the data and the trainer ask of every family (bertjax.model.family.Family):
  # positions count from 0; no NSP, no SBO head, no pooler in the encoder (the
  # sequence heads' ContextPooler is their own).
  position_offset: ClassVar[int] = 0
  nsp: ClassVar[bool] = False
  sbo: ClassVar[bool] = False
  pooler: ClassVar[bool] = False

  vocab_size: int = 128100
  type_vocab_size: int = 0
  embedding_size: int = 0  # the token embedding's width; 0: hidden_size (set at init)
  position_biased_input: bool = False  # absolute position embeddings added (v2: True)
  relative_attention: bool = True  # the c2p / p2c terms
  max_relative_positions: int = -1  # < 1: max_position_embeddings
  position_buckets: int = 256  # log buckets of relative positions; <= 0: none
  pos_att_type: tuple[str, ...] = ("p2c", "c2p")
  share_att_key: bool = True  # positions through the content key / query projections
  norm_rel_ebd: str = "layer_norm"  # 'layer_norm' or 'none'
  layer_norm_eps: float = 1e-7
  hidden_act: str = "gelu"  # a key of layers.ACTIVATIONS
  dropout_rate: float = 0.1  # Hugging Face's hidden_dropout_prob
  attention_dropout_rate: float = 0.1  # attention_probs_dropout_prob
  pooler_dropout: float = 0.0  # the ContextPooler's, before its dense
  pooler_hidden_act: str = "gelu"
  cls_dropout: float = 0.1  # the sequence heads' after the pooler (HF: absent = hidden)
  initializer_cutoff_factor: float = 0.0  # untruncated: microsoft/DeBERTa's normal_
  rtd: bool = False  # DeBERTa-v3's replaced-token-detection head ('rtd', the discriminator's)

  def __post_init__(self):
    """Every field in range, or a one-line ConfigError naming it; `embedding_size` 0
    becomes the hidden size (the token embedding's width every family answers)."""
    if self.embedding_size == 0:
      object.__setattr__(self, "embedding_size", self.hidden_size)
    self.check_common(("type_vocab_size",) if self.type_vocab_size else (),
                      ("dropout_rate", "attention_dropout_rate", "pooler_dropout",
                       "cls_dropout"))
    if self.hidden_size % self.num_heads:
      raise ConfigError(
          f"config.model.hidden_size={self.hidden_size} is not divisible by "
          f"config.model.num_heads={self.num_heads}; pick sizes that divide.")
    if self.type_vocab_size < 0 or self.embedding_size < 0:
      raise ConfigError("config.model.type_vocab_size and embedding_size must be >= 0 "
                        f"(got {self.type_vocab_size}, {self.embedding_size}).")
    bad = [t for t in self.pos_att_type if t not in POS_ATT_TYPES]
    if bad or len(set(self.pos_att_type)) != len(self.pos_att_type):
      raise ConfigError(f"config.model.pos_att_type={self.pos_att_type!r}: use distinct "
                        f"entries of {list(POS_ATT_TYPES)} (DeBERTa-v3: ('p2c', 'c2p')).")
    if self.norm_rel_ebd not in NORM_REL_EBD:
      raise ConfigError(f"config.model.norm_rel_ebd={self.norm_rel_ebd!r}: use one of "
                        f"{list(NORM_REL_EBD)}.")
    for name in ("hidden_act", "pooler_hidden_act"):
      if getattr(self, name) not in ACTIVATIONS:
        raise ConfigError(f"config.model.{name}={getattr(self, name)!r}: use one of "
                          f"{sorted(ACTIVATIONS)}.")
    for name in ("layer_norm_eps", "initializer_range"):
      if not getattr(self, name) > 0:
        raise ConfigError(f"config.model.{name}={getattr(self, name)} must be positive.")
    if self.relative_attention and self.attention_impl not in ("", "xla"):
      raise ConfigError(f"config.model.attention_impl={self.attention_impl!r} takes no "
                        "attention score bias (DeBERTa's relative-position terms): use '' "
                        "or 'xla'.")

  @property
  def classifier_dropout(self) -> float:
    """The sequence heads' dropout after the pooler (Hugging Face's `cls_dropout`)."""
    return self.cls_dropout

  @property
  def embed_width(self) -> int:
    """The token embedding's width: `embedding_size`, or the hidden size."""
    return self.embedding_size or self.hidden_size

  @property
  def max_relative(self) -> int:
    """Hugging Face's `max_relative_positions`: max_position_embeddings when < 1."""
    return (self.max_relative_positions if self.max_relative_positions >= 1
            else self.max_position_embeddings)

  @property
  def attention_span(self) -> int:
    """S: the relative embeddings are [2S, E]; S = position_buckets when > 0, else
    the largest relative position (`max_relative`)."""
    return self.position_buckets if self.position_buckets > 0 else self.max_relative

  @property
  def scale_factor(self) -> int:
    """1 + len(pos_att_type): the scores are scaled by 1/sqrt(D * this)."""
    return 1 + len(self.pos_att_type)


# ---- Relative positions -----------------------------------------------------------

def log_bucket(relative: np.ndarray, buckets: int, max_position: int) -> np.ndarray:
  """Hugging Face's `make_log_bucket_position` in numpy, float32 as there (so the
  ceilings fall alike): |r| < buckets / 2 kept, beyond that log-spaced up to
  `max_position`; sign kept. int64 of the shape of `relative` (int)."""
  rel = np.asarray(relative, np.int64)
  mid = buckets // 2
  abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
  log_pos = np.ceil(np.log(abs_pos.astype(np.float32) / np.float32(mid))
                    / np.log(np.float32((max_position - 1) / mid))
                    * np.float32(mid - 1)) + np.float32(mid)
  return np.where(abs_pos <= mid, rel, (log_pos * np.sign(rel)).astype(np.int64))


@functools.cache
def relative_offsets(length: int, buckets: int, max_position: int) -> np.ndarray:
  """[2T - 1] int32, T = `length`: entry d + T - 1 is idx(d) = clip(bucket(d) + S, 0,
  2S - 1) for the relative position d = i - j in -(T-1)..T-1, the row of the relative
  embeddings query i meets key j at (c2p reads the query's projection there, p2c the
  key's: bucket is odd, so Hugging Face's p2c index of (j, i) negated is this one).
  S = buckets when > 0, else max_position; bucket the log buckets or d itself."""
  rel = np.arange(-(length - 1), length)
  span = buckets if buckets > 0 else max_position
  if buckets > 0:
    rel = log_bucket(rel, buckets, max_position)
  return np.clip(rel + span, 0, 2 * span - 1).astype(np.int32)


def skew(x: jax.Array) -> jax.Array:
  """[..., T, 2T - 1] -> [..., T, T]: y[a, b] = x[a, b - a + T - 1], by a slice and
  reshapes of the flattened rows (Transformer-XL's relative shift), no gather."""
  *lead, T, W = x.shape
  flat = x.reshape(*lead, T * W)[..., T - 1:T - 1 + T * (W - 1)]
  return flat.reshape(*lead, T, W - 1)[..., :T]


def layer_norm(cfg: DebertaConfig, name: str) -> nn.LayerNorm:
  """LayerNorm (eps `layer_norm_eps`), float32 statistics, torch's two-pass variance."""
  return layers.layer_norm(cfg, name, cfg.layer_norm_eps, fast_variance=False)


# ---- Modules ----------------------------------------------------------------------

class Embeddings(nn.Module):
  """Token (+ position, + token type) embeddings, embed_proj, LayerNorm, mask,
  dropout; and the relative embeddings every block reads."""

  config: DebertaConfig

  def setup(self):
    cfg = self.config
    width = cfg.embed_width
    self.word_embeddings = layers.embed(cfg, cfg.vocab_size, ("vocab", "embed"),
                                        features=width)
    if cfg.position_biased_input:
      self.position_embeddings = layers.embed(
          cfg, cfg.max_position_embeddings, ("position", "embed"), features=width,
          one_hot_rows=layers.POSITION_ONE_HOT_ROWS)
    if cfg.type_vocab_size > 0:
      self.token_type_embeddings = layers.embed(cfg, cfg.type_vocab_size,
                                                ("segment", "embed"), features=width)
    if width != cfg.hidden_size:
      self.embed_proj = layers.dense(cfg, cfg.hidden_size, ("hidden", "embed"),
                                     "embed_proj", use_bias=False)
    self.LayerNorm = layer_norm(cfg, "LayerNorm")
    self.dropout = nn.Dropout(cfg.dropout_rate)
    if cfg.relative_attention:
      self.rel_embeddings = layers.embed(cfg, 2 * cfg.attention_span,
                                         ("position", "embed"))
      if cfg.norm_rel_ebd == "layer_norm":
        self.rel_norm = layer_norm(cfg, "rel_norm")

  def __call__(self, input_ids, attention_mask, token_type_ids, position_ids,
               segment_ids, deterministic: bool):
    """[B, T] ids -> ([B, T, E], the blocks' context: (attention_mask [B, T],
    segment_ids [B, T] or None, the relative embeddings [2S, E] (normalised) or
    None)). position_ids (absolute, read only with `position_biased_input`) default to
    0..T-1, restarting in each document of `segment_ids`."""
    cfg = self.config
    x = self.word_embeddings(input_ids)
    if cfg.position_biased_input:
      if position_ids is None:
        position_ids = (jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
                        if segment_ids is None else stack.document_positions(segment_ids))
      x = x + self.position_embeddings(position_ids)
    if cfg.type_vocab_size > 0:
      x = x + self.token_type_embeddings(token_type_ids)
    if cfg.embed_width != cfg.hidden_size:
      x = self.embed_proj(x)
    x = self.LayerNorm(x) * attention_mask[..., None].astype(cfg.dtype)
    x = self.dropout(x, deterministic=deterministic)
    rel = None
    if cfg.relative_attention:
      rel = self.rel_embeddings.embedding.astype(cfg.dtype)
      if cfg.norm_rel_ebd == "layer_norm":
        rel = self.rel_norm(rel)
    return constrain(x, (BATCH, LENGTH, EMBED)), (attention_mask, segment_ids, rel)

  def attend(self, x: jax.Array) -> jax.Array:
    """The tied output projection: [..., embedding size] -> [..., V]."""
    return self.word_embeddings.attend(x)


class DisentangledSelfAttention(nn.Module):
  """Content and relative-position attention (module docstring), through
  `attention.attention` with the c2p + p2c terms as its score bias and DeBERTa's
  scale; then the output projection 'output'."""

  config: DebertaConfig

  @nn.compact
  def __call__(self, x: jax.Array, context, deterministic: bool) -> jax.Array:
    """x [B, T, E]; context: (padding [B, T], segment ids [B, T] or None, relative
    embeddings [2S, E] or None). -> [B, T, E]."""
    cfg = self.config
    padding, segment_ids, rel = context
    shape, names = (cfg.hidden_size, cfg.num_heads, cfg.head_dim), ("embed", "heads", "kv")
    proj = {n: layers.einsum(cfg, shape, names, n)
            for n in ("query_proj", "key_proj", "value_proj")}
    q, k, v = (constrain(proj[n](x, "BTE,END->BTND"), (BATCH, LENGTH, HEADS, KV))
               for n in ("query_proj", "key_proj", "value_proj"))
    scale = (cfg.head_dim * cfg.scale_factor) ** -0.5
    bias = None
    if cfg.relative_attention:
      rel = nn.Dropout(cfg.dropout_rate)(rel, deterministic=deterministic)[None]
      if not cfg.share_att_key:
        for kind, name in (("c2p", "pos_key_proj"), ("p2c", "pos_query_proj")):
          if kind in cfg.pos_att_type:
            proj[name] = layers.einsum(cfg, shape, names, name)
      shared = {"c2p": "key_proj", "p2c": "query_proj"}
      own = {"c2p": "pos_key_proj", "p2c": "pos_query_proj"}
      pos = {t: proj[(shared if cfg.share_att_key else own)[t]](rel, "BTE,END->BTND")[0]
             for t in cfg.pos_att_type}  # [2S, N, D]
      bias = relative_bias(cfg, q, k, pos.get("p2c"), pos.get("c2p"))
    dropout = not deterministic and cfg.attention_dropout_rate > 0
    impl = layers.attention_impl(self, cfg, dropout, x.shape[1], bias=bias is not None)
    out = attention_lib.attention(
        q, k, v, padding, segment_ids, bias=bias, scale=scale, impl=impl,
        dropout_rate=cfg.attention_dropout_rate if dropout else 0.0,
        dropout_rng=self.make_rng("dropout") if dropout else None)
    out = constrain(out, (BATCH, LENGTH, HEADS, KV))
    shape = (cfg.num_heads, cfg.head_dim, cfg.hidden_size)
    return layers.einsum(cfg, shape, ("heads", "kv", "embed"), "output",
                         bias_names=("embed",))(out, "BTND,NDE->BTE")


def relative_bias(cfg: DebertaConfig, q: jax.Array, k: jax.Array,
                  pos_q: jax.Array | None, pos_k: jax.Array | None) -> jax.Array:
  """[B, N, T, T] float32: c2p[i, j] = q_i . pos_k[idx(i - j)] (with `pos_k`) plus
  p2c[i, j] = k_j . pos_q[idx(i - j)] (with `pos_q`), divided by sqrt(D *
  scale_factor) as Hugging Face does. q, k [B, T, N, D]; pos_q, pos_k [2S, N, D] (the
  relative embeddings projected); idx `relative_offsets`. Each product [B, N, T, 2S]
  is read along its last axis at one index vector ([B, N, T, 2T - 1], by relative
  position) and `skew`ed into place, not gathered pair by pair as Hugging Face does:
  the TPU compiler costs the pairwise gather at 35x the bytes (docs/scaling.md)."""
  T = q.shape[1]
  offsets = relative_offsets(T, cfg.position_buckets, cfg.max_relative)
  score = jnp.zeros((), jnp.float32)
  if pos_k is not None:  # content -> position: row i, column m = T - 1 - (i - j)
    c2p = jnp.einsum("bind,snd->bnis", q, pos_k).astype(jnp.float32)
    score = score + skew(jnp.take(c2p, jnp.asarray(offsets[::-1].copy()), axis=-1))
  if pos_q is not None:  # position -> content: key row j, column m = (i - j) + T - 1
    p2c = jnp.einsum("bjnd,snd->bnjs", k, pos_q).astype(jnp.float32)
    score = score + skew(jnp.take(p2c, jnp.asarray(offsets), axis=-1)).swapaxes(-1, -2)
  return score / jnp.sqrt(jnp.float32(cfg.head_dim * cfg.scale_factor))


class Block(layers.PostLNBlock):
  """Post-LN block (BERT's) with disentangled attention, `hidden_act` and torch's
  two-pass LayerNorm variance."""

  attention = DisentangledSelfAttention
  activation = staticmethod(lambda cfg, h: ACTIVATIONS[cfg.hidden_act](h))
  norm = staticmethod(layer_norm)


def mlm_transform(cfg: DebertaConfig, x: jax.Array) -> jax.Array:
  """The MLM head's 'transform' (dense E -> embedding size), `hidden_act` and
  'transform_norm': [B, P, E] -> [B, P, embedding size]."""
  x = layers.dense(cfg, cfg.embed_width, ("embed", "hidden"), "transform")(x)
  return layers.layer_norm(cfg, "transform_norm", cfg.layer_norm_eps, fast_variance=False,
                           axis_name="hidden")(ACTIVATIONS[cfg.hidden_act](x))


class RTDHead(nn.Module):
  """DeBERTa-v3's replaced-token detector (microsoft/DeBERTa's LMMaskPredictionHead,
  which transformers lacks): 'LayerNorm' of each token's hidden state plus the [CLS]
  one, 'dense' (E -> E), `hidden_act`, 'classifier' (E -> 1): [B, T, E] -> [B, T]."""

  config: DebertaConfig

  @nn.compact
  def __call__(self, out: dict, encoder) -> jax.Array:
    del encoder
    cfg = self.config
    h = out["last_hidden_state"]
    x = layer_norm(cfg, "LayerNorm")(h[:, :1] + h)
    x = ACTIVATIONS[cfg.hidden_act](
        layers.dense(cfg, cfg.hidden_size, ("embed", "hidden"), "dense")(x))
    return layers.dense(cfg, 1, ("hidden", "classes"), "classifier")(x)[..., 0]


def token_weights(cfg: DebertaConfig) -> int:
  """Per token outside the blocks: the 'rtd' head's E^2 + E, with the head."""
  return cfg.hidden_size * cfg.hidden_size + cfg.hidden_size if cfg.rtd else 0


# ---- Task heads (Hugging Face's DebertaV2For* trunks) ------------------------------

class ContextPooler(nn.Module):
  """Hugging Face's ContextPooler: dropout (`pooler_dropout`), dense, activation
  (`pooler_hidden_act`) of the [CLS] vectors [..., E] -> [..., E]."""

  config: DebertaConfig

  @nn.compact
  def __call__(self, cls: jax.Array, deterministic: bool) -> jax.Array:
    cfg = self.config
    cls = nn.Dropout(cfg.pooler_dropout)(cls, deterministic=deterministic)
    x = layers.dense(cfg, cfg.hidden_size, ("embed", "hidden"), "dense")(cls)
    return ACTIVATIONS[cfg.pooler_hidden_act](x)


def task_features(cfg: DebertaConfig, out: dict, deterministic: bool, pooled: bool,
                  dropout: bool = True) -> jax.Array:
  """Call inside a task head's compact `__call__`. Pooled, [B, E]: the head's own
  ContextPooler ('pooler') on [CLS], then dropout `cls_dropout` (sequence
  classification, multiple choice). Per token, [B, T, E]: the last hidden states,
  with dropout `dropout_rate` when `dropout` (tagging; span QA reads them as they
  are)."""
  x = out["last_hidden_state"]
  if pooled:
    x = ContextPooler(cfg, name="pooler")(x[:, 0], deterministic)
    return nn.Dropout(cfg.cls_dropout)(x, deterministic=deterministic)
  return nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic) if dropout else x


def output_layer(cfg: DebertaConfig, features: int, name: str) -> nn.Dense:
  """A head projection [E] -> [features], with bias."""
  return layers.dense(cfg, features, ("embed", "classes"), name)


def block_weights(cfg: DebertaConfig) -> int:
  """The weights a block multiplies each token by: query, key, value, output E^2 each,
  the feed-forward 2 E M, and each relative term a token's D-vector against the 2S
  projected relative embeddings of every head (2S E each; the projections of the
  relative embeddings themselves, 2S E^2 a block per batch, are not counted)."""
  E, M = cfg.hidden_size, cfg.intermediate_size
  relative = len(cfg.pos_att_type) * 2 * cfg.attention_span * E if cfg.relative_attention else 0
  return 4 * E * E + 2 * E * M + relative


FAMILY = Family(
    name="deberta", config=DebertaConfig, embeddings=Embeddings, block=Block,
    mlm_transform=mlm_transform, block_weights=block_weights,
    task_features=task_features, output_layer=output_layer,
    heads=(Head("rtd", RTDHead),), token_weights=token_weights)
