"""Building blocks of the encoder: embeddings, self-attention, the post-LN block.

Every parameter carries logical axis names (`nn.with_logical_partitioning`) and every
large activation a logical constraint; the rules table in the config maps the names
onto the mesh axes ('data', 'fsdp', 'tensor'). Shapes: B batch, T length, E hidden,
N heads, D head size, M intermediate (MLP) size.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from bertjax.errors import ConfigError
from bertjax.model.config import REMAT_POLICIES, ModelConfig

BATCH, LENGTH, EMBED = "activation_batch", "activation_length", "activation_embed"
HEADS, KV, MLP = "activation_heads", "activation_kv", "activation_mlp"


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  return nn.with_logical_constraint(x, tuple(names))


def param_init(cfg: ModelConfig, names: Sequence[str | None]):
  """BERT's initialiser (truncated normal, stddev `initializer_range`) with axis names."""
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(cfg.initializer_range), tuple(names))


def zeros_init(names: Sequence[str | None]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), tuple(names))


def dense(cfg: ModelConfig, features: int, kernel_names, bias_names, name) -> nn.Dense:
  return nn.Dense(
      features, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
      kernel_init=param_init(cfg, kernel_names), bias_init=zeros_init(bias_names),
      name=name)


def einsum(cfg: ModelConfig, shape, kernel_names, bias_names, name) -> nn.Einsum:
  """A multi-axis projection whose kernel is created at its true shape (so its logical
  names fit it), e.g. [E, N, D] for the query."""
  return nn.Einsum(
      shape, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
      kernel_init=param_init(cfg, kernel_names), bias_init=zeros_init(bias_names),
      name=name)


def layer_norm(cfg: ModelConfig, name: str, axis_name: str = "embed") -> nn.LayerNorm:
  """LayerNorm; its mean/variance are computed in float32 even for bf16 inputs."""
  return nn.LayerNorm(
      epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), (axis_name,)),
      bias_init=zeros_init((axis_name,)), name=name)


def position_ids_for(cfg: ModelConfig, input_ids: jax.Array) -> jax.Array:
  """[B, T] positions. BERT: 0..T-1. RoBERTa/XLM-R: counted from `position_offset`
  over non-padding tokens; padding gets `pad_token_id` (fairseq's convention)."""
  if cfg.position_offset == 0:
    return jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
  real = (input_ids != cfg.pad_token_id).astype(jnp.int32)
  return jnp.where(real > 0, jnp.cumsum(real, axis=1) - 1 + cfg.position_offset,
                   cfg.pad_token_id)


class Embeddings(nn.Module):
  """Token + segment + position embeddings, then LayerNorm and dropout."""

  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.word_embeddings = nn.Embed(
        cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        embedding_init=param_init(cfg, ("vocab", "embed")))
    self.position_embeddings = nn.Embed(
        cfg.max_position_embeddings, cfg.hidden_size, dtype=cfg.dtype,
        param_dtype=cfg.param_dtype, embedding_init=param_init(cfg, ("position", "embed")))
    if cfg.type_vocab_size > 0:
      self.token_type_embeddings = nn.Embed(
          cfg.type_vocab_size, cfg.hidden_size, dtype=cfg.dtype,
          param_dtype=cfg.param_dtype, embedding_init=param_init(cfg, ("segment", "embed")))
    self.LayerNorm = layer_norm(cfg, "LayerNorm")
    self.dropout = nn.Dropout(cfg.dropout_rate)

  def __call__(self, input_ids, token_type_ids, position_ids, deterministic: bool):
    """[B, T] ids -> [B, T, E]."""
    x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
    if self.config.type_vocab_size > 0:
      x = x + self.token_type_embeddings(token_type_ids)
    x = self.dropout(self.LayerNorm(x), deterministic=deterministic)
    return constrain(x, (BATCH, LENGTH, EMBED))

  def attend(self, x: jax.Array) -> jax.Array:
    """The tied output projection: [..., E] -> [..., vocab]."""
    return self.word_embeddings.attend(x)


class SelfAttention(nn.Module):
  """Bidirectional multi-head self-attention.

  `config.attention_impl`: None / 'xla' / 'cudnn' go through
  `jax.nn.dot_product_attention` (with 'cudnn', GPU, bf16/fp16, a plain padding mask
  becomes cuDNN's key-length padding mask: rows are right-padded; a packed-row mask is
  passed as a [B, 1, T, T] mask); 'splash' runs the Pallas splash-attention kernel for
  TPU (`splash_attention`), which never materialises the [B, N, T, T] scores. In
  training with `attention_dropout_rate > 0` (the paper's recipe) the attention
  probabilities need dropout, which the fused kernels do not offer; that case goes
  through `flax.linen.dot_product_attention` (cudnn and splash refuse it). Softmax
  statistics are float32 on every path.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool) -> jax.Array:
    """x: [B, T, E]; mask: `encoder_mask`'s ([B, 1, T, T] bool, True where attention is
    allowed, or for 'splash' [B, T] int32 kernel segment ids)."""
    cfg = self.config
    shape, names = (cfg.hidden_size, cfg.num_heads, cfg.head_dim), ("embed", "heads", "kv")
    q, k, v = (einsum(cfg, shape, names, names[1:], n)(x, "BTE,END->BTND")
               for n in ("query", "key", "value"))  # [B, T, N, D]
    q, k, v = (constrain(t, (BATCH, LENGTH, HEADS, KV)) for t in (q, k, v))
    if cfg.attention_impl == "splash" and self.is_initializing():
      mask = mask[:, None, :, None] == mask[:, None, None, :]  # Shapes only: T may be 8.
    elif cfg.attention_impl == "splash":
      if not deterministic and cfg.attention_dropout_rate > 0:
        raise ConfigError("config.model.attention_impl='splash' has no attention "
                          "dropout; set config.model.attention_dropout_rate=0.0.")
      return self._output(splash_attention(q, k, v, mask))
    if not deterministic and cfg.attention_dropout_rate > 0:
      if cfg.attention_impl == "cudnn":
        raise ConfigError("config.model.attention_impl='cudnn' has no attention dropout; "
                          "set config.model.attention_dropout_rate=0.0.")
      out = nn.dot_product_attention(
          q, k, v, mask=mask, dropout_rng=self.make_rng("dropout"),
          dropout_rate=cfg.attention_dropout_rate, deterministic=False, dtype=cfg.dtype,
          force_fp32_for_softmax=True)
    elif cfg.attention_impl == "cudnn" and mask.shape[2] == 1:
      # Right-padded rows: cuDNN's padding mask from the key lengths (no [T, T] bias).
      lengths = jnp.sum(mask[:, 0, 0, :], axis=-1, dtype=jnp.int32)  # [B]
      out = jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths,
                                         implementation="cudnn")
    else:
      impl = None if cfg.attention_impl == "splash" else cfg.attention_impl
      out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=impl)
    return self._output(out)

  def _output(self, out: jax.Array) -> jax.Array:
    """[B, T, N, D] attention output -> [B, T, E] through the output projection."""
    cfg = self.config
    out = constrain(out, (BATCH, LENGTH, HEADS, KV))
    shape = (cfg.num_heads, cfg.head_dim, cfg.hidden_size)
    return einsum(cfg, shape, ("heads", "kv", "embed"), ("embed",), "output")(
        out, "BTND,NDE->BTE")


SPLASH_BLOCK = 128  # The kernel's tile along T (its compute blocks are 128 lanes wide).


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                     segment_ids: jax.Array) -> jax.Array:
  """The Pallas splash-attention kernel (`jax.experimental.pallas.ops.tpu`).

  q, k, v: [B, T, N, D]; segment_ids: [B, T] int32 (`splash_segment_ids`): a query
  attends the keys of its own id. Returns [B, T, N, D] in q's dtype (softmax statistics
  float32). Under a context mesh the kernel runs per shard (`jax.shard_map`: batch and
  heads split as the logical-axis rules say, T whole); compiled for TPU it is the TPU
  kernel, on any other platform the same kernel in Pallas's interpreter (slow: tests).
  """
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # pylint: disable=g-import-not-at-top

  B, T, N, D = q.shape
  if T % SPLASH_BLOCK:
    raise ConfigError(f"config.model.attention_impl='splash' needs a sequence length "
                      f"divisible by {SPLASH_BLOCK}, got {T}; pad the rows or use 'xla'.")
  q = q * jnp.asarray(D ** -0.5, q.dtype)  # The kernel does not scale the logits.

  def per_shard(q, k, v, ids):  # [b, T, n, D] x3, [b, T]
    n = q.shape[2]
    block = min(T, 512)
    sizes = splash.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=SPLASH_BLOCK,
        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=SPLASH_BLOCK,
        block_q_dq=block, block_kv_dq=block)
    mask = splash.MultiHeadMask([splash.FullMask((T, T))] * n)

    def run(interpret):
      def apply(q, k, v, ids):
        kernel = splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1,
                                        q_seq_shards=1, interpret=interpret)
        one = lambda q, k, v, s: kernel(q, k, v, splash.SegmentIds(s, s))
        out = jax.vmap(one)(*(t.swapaxes(1, 2) for t in (q, k, v)), ids)  # [b, n, T, D]
        return out.swapaxes(1, 2)
      return apply

    return jax.lax.platform_dependent(q, k, v, ids, tpu=run(False), default=run(True))

  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return per_shard(q, k, v, segment_ids)
  batch, heads = (_dividing(nn.logical_to_mesh_axes((name,))[0], size, mesh)
                  for name, size in ((BATCH, B), (HEADS, N)))
  qkv = PartitionSpec(batch, None, heads, None)
  return jax.shard_map(per_shard, mesh=mesh, in_specs=(qkv, qkv, qkv, PartitionSpec(batch)),
                       out_specs=qkv, check_vma=False)(q, k, v, segment_ids)


def _dividing(axes, size: int, mesh):
  """The leading mesh axes of `axes` (a rule's value) whose product divides `size`."""
  axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
  while axes and size % int(np.prod([mesh.shape[a] for a in axes])):
    axes = axes[:-1]
  return axes or None


class TransformerBlock(nn.Module):
  """Post-LN block: LN(x + Attn(x)), then LN(x + FFN(x)) with GELU, dropout 0.1.

  `scanned=True` gives the `nn.scan` signature: it returns (x, x if `keep` else None),
  the carry and the per-layer output (stacked by the scan into [L, B, T, E]).
  """

  config: ModelConfig
  scanned: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool,
               keep: bool = False):
    """[B, T, E] -> [B, T, E]."""
    cfg = self.config
    drop = nn.Dropout(cfg.dropout_rate)
    h = SelfAttention(cfg, name="attention")(x, mask, deterministic)
    x = layer_norm(cfg, "attention_norm")(x + drop(h, deterministic=deterministic))
    x = constrain(x, (BATCH, LENGTH, EMBED))
    h = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), ("mlp",), "intermediate")(x)
    h = constrain(nn.gelu(h, approximate=False), (BATCH, LENGTH, MLP))  # [B, T, M]
    h = dense(cfg, cfg.hidden_size, ("mlp", "embed"), ("embed",), "output")(h)
    x = layer_norm(cfg, "output_norm")(x + drop(h, deterministic=deterministic))
    x = constrain(x, (BATCH, LENGTH, EMBED))
    if self.scanned:
      return x, (x if keep else None)
    return x


def block_stack(cfg: ModelConfig):
  """The encoder's blocks: a list of `num_layers` modules named layer_{i}, or with
  `scan_layers` one `nn.scan`ned module named 'layers' whose parameters have a leading
  [L] axis (logical name 'layers'); either way rematerialised per `remat_policy`."""
  block = TransformerBlock
  if cfg.remat_policy != "none":
    # static_argnums count `self`: 3 = deterministic, 4 = keep (always passed).
    block = nn.remat(block, policy=REMAT_POLICIES[cfg.remat_policy],
                     prevent_cse=not cfg.scan_layers, static_argnums=(3, 4))
  if not cfg.scan_layers:
    return [block(cfg, name=f"layer_{i}") for i in range(cfg.num_layers)]
  scanned = nn.scan(
      block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
      in_axes=(nn.broadcast, nn.broadcast, nn.broadcast), length=cfg.num_layers,
      metadata_params={nn.PARTITION_NAME: "layers"})
  return scanned(cfg, scanned=True, name="layers")


def encoder_mask(cfg: ModelConfig, attention_mask_: jax.Array,
                 segment_ids: jax.Array | None = None) -> jax.Array:
  """What the blocks' attention takes: `splash_segment_ids` for 'splash', else
  `attention_mask`."""
  if cfg.attention_impl == "splash":
    return splash_segment_ids(attention_mask_, segment_ids)
  return attention_mask(attention_mask_, segment_ids)


def splash_segment_ids(attention_mask_: jax.Array,
                       segment_ids: jax.Array | None = None) -> jax.Array:
  """[B, T] key padding mask (1 real, 0 pad) and optional [B, T] document ids (>= 0) of
  a packed row -> [B, T] int32 ids for the splash kernel: a real token's document (0
  when unpacked), -1 for padding. A real query attends the real keys of its document,
  as with `attention_mask`; a padding query attends padding keys only (never a row with
  nothing to attend; padding outputs are never read)."""
  ids = jnp.zeros_like(attention_mask_) if segment_ids is None else segment_ids
  return jnp.where(attention_mask_.astype(bool), ids, -1).astype(jnp.int32)


def attention_mask(attention_mask: jax.Array, segment_ids: jax.Array | None = None):
  """[B, T] key padding mask (1 real, 0 pad) and optional [B, T] document ids of a
  packed row -> [B, 1, T, T] bool: a query may attend a real key of its own document."""
  keys = attention_mask.astype(bool)[:, None, None, :]
  if segment_ids is None:
    return keys
  same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
  return keys & same
