"""The encoder every family shares, and its pretraining model (what MaxText's
`layers/decoders.py` is to its decoders). A family (`bertjax.model.family.Family`)
gives its parts; this module owns the rest, once for every family:

- `Encoder`: the family's embedding (token ids -> [B, T, E], and the context its
  blocks read), its `num_layers` blocks, as a list (`layer_{i}`) or, with
  `scan_layers`, the first `Family.unscanned_layers` as a list and the rest one
  `nn.scan`ned module 'layers' whose parameters have a leading [L - k] axis (logical
  name 'layers'), rematerialised per `remat_policy`; the family's final norm and
  pooler in their slots; every layer's output with `output_hidden_states`.
- `PreTraining`: the encoder ('encoder') and the pretraining heads it carries, by name
  ('mlm', every family's, and a family's own: BERT's 'nsp', SpanBERT's 'sbo'); each
  head's parameters under its name, each reads only its own inputs
  (`Head.inputs`) and gives '<name>_logits', float32.
- `MLMHead`: the family's transform (dense + activation + norm) at the masked
  positions (`gather`), then the tied token embedding plus a vocabulary bias
  (`tied_logits`, which SpanBERT's SBO head shares).
- `trunk_depth` (what fine-tuning freezes), `Encoder.slots` (packed examples, one
  row each), `pool`, and `train_flops` with `attention_pairs` (the FLOPs terms every
  family shares).

Shapes: B batch, T length, E hidden, V vocabulary, P predictions per row, L layers,
K examples packed in a row.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.errors import ConfigError
from bertjax.model.config import REMAT_POLICIES
from bertjax.model.layers import BATCH, EMBED, constrain, dense, zeros_init

# What every encoder reads: input_ids [B, T] int; attention_mask [B, T] (1 real, 0
# pad; default: ids != pad_token_id); token_type_ids [B, T] (segment A/B; default 0);
# position_ids [B, T] (default: the family's); segment_ids [B, T] (the documents of a
# packed row: no attention across them; default None, one document).
ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids",
                  "segment_ids")
# The `classifier_pooling`s a packed row's examples can be pooled by (`Encoder.slots`).
SLOT_POOLINGS = ("cls", "mean")


def _block_class(cfg: Any, block: type, scanned: bool):
  """The family's block, rematerialised per `remat_policy`."""
  if cfg.remat_policy == "none":
    return block
  # static_argnums count `self`: 3 = layer (a Python int outside the scan),
  # 4 = deterministic, 5 = keep (always passed).
  return nn.remat(block, policy=REMAT_POLICIES[cfg.remat_policy],
                  prevent_cse=not scanned,  # nn.scan already keeps the remat
                  static_argnums=(4, 5) if scanned else (3, 4, 5))


class Encoder(nn.Module):
  """The family's embedding, blocks, final norm and pooler (module docstring).

  The family's block is `block(config, scanned=False)`, called `(x [B, T, E], context,
  layer, deterministic, keep)` -> [B, T, E] (with `scanned`: (x, x if keep else
  None), the carry and the per-layer output); `layer` is the block's index, a Python
  int outside the scan and a traced scalar inside it."""

  config: Any
  family: Any  # the Family of `config`

  def setup(self):
    cfg, family = self.config, self.family
    self.embeddings = family.embeddings(cfg)
    k = min(family.unscanned_layers, cfg.num_layers) if cfg.scan_layers else cfg.num_layers
    block = _block_class(cfg, family.block, scanned=False)
    self.blocks = [block(cfg, name=f"layer_{i}") for i in range(k)]
    if k < cfg.num_layers:
      self.scanned = nn.scan(
          _block_class(cfg, family.block, scanned=True), variable_axes={"params": 0},
          split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast, 0, nn.broadcast, nn.broadcast),
          length=cfg.num_layers - k, metadata_params={nn.PARTITION_NAME: "layers"},
      )(cfg, scanned=True, name="layers")
    if family.final_norm is not None:
      self.final_norm = family.final_norm(cfg)
    if cfg.pooler:
      self.pooler = family.pooler(cfg)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None,
               position_ids=None, segment_ids=None, deterministic: bool = True,
               output_hidden_states: bool = False, **inputs):
    """The `ENCODER_INPUTS` (padding, token types and positions defaulted as there
    said) and the family's own (`Family.inputs`, e.g. ModernBERT's
    `global_rope_theta` [B]).

    Returns {'last_hidden_state': [B, T, E] (after the final norm), 'pooled': [B, E]
    with a pooler, and with `output_hidden_states` 'hidden_states' [L+1, B, T, E]: the
    embedding output and each block's, the last one final-normed}.
    """
    cfg = self.config
    if attention_mask is None:
      attention_mask = (input_ids != cfg.pad_token_id).astype(jnp.int32)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    x, context = self.embeddings(input_ids, attention_mask, token_type_ids, position_ids,
                                 segment_ids, deterministic, **inputs)
    hidden = [x[None]]
    for i, block in enumerate(self.blocks):
      x = block(x, context, i, deterministic, False)
      hidden.append(x[None])
    if len(self.blocks) < cfg.num_layers:
      x, ys = self.scanned(x, context, jnp.arange(len(self.blocks), cfg.num_layers),
                           deterministic, output_hidden_states)  # ys [L - k, B, T, E]
      hidden.append(ys)
    if self.family.final_norm is not None:
      x = self.final_norm(x)
      if output_hidden_states:  # the last block's output, final-normed
        hidden[-1:] = [hidden[-1][:-1], x[None]]
    out = {"last_hidden_state": x}
    if cfg.pooler:
      out["pooled"] = self.pooler(x[:, 0])
    if output_hidden_states:
      out["hidden_states"] = jnp.concatenate(hidden)
    return out

  def attend(self, x: jax.Array) -> jax.Array:
    """The tied output projection (the family embedding's `attend`): [..., E] -> [..., V]."""
    return self.embeddings.attend(x)

  def slots(self, out: dict, batch: dict) -> dict:
    """The K examples packed in each row (`batch['cls_positions']` [B, K], their
    'segment_ids' [B, T] k + 1), one row each, for heads that predict one thing per
    example: {'last_hidden_state' [B*K, 1, E]: each example's first token, or its
    mean (`classifier_pooling='mean'`), so that `pool` of the one-token row is the
    example's; 'attention_mask' [B*K, 1]; 'pooled' [B*K, E] with a pooler}."""
    hidden = out["last_hidden_state"]
    B, K = batch["cls_positions"].shape
    if self.config.classifier_pooling not in SLOT_POOLINGS:  # EuroBERT's 'late'
      raise ConfigError(
          f"config.model.classifier_pooling={self.config.classifier_pooling!r} pools "
          "after the head's own layers, which packed rows' slots cannot give: set "
          "config.task.batching='bucket' (or pool 'cls' / 'mean').")
    if self.config.classifier_pooling == "cls":
      x = jnp.take_along_axis(hidden, batch["cls_positions"][..., None], axis=1)
    else:
      member = jax.nn.one_hot(batch["segment_ids"], K + 1, dtype=hidden.dtype)[..., 1:]
      member = member * batch["attention_mask"][..., None].astype(hidden.dtype)  # [B, T, K]
      x = jnp.einsum("btk,bte->bke", member, hidden) / jnp.maximum(
          member.sum(1), 1.0)[..., None]
    x = x.reshape(B * K, 1, -1)
    slots = {"last_hidden_state": x, "attention_mask": jnp.ones((B * K, 1), jnp.int32)}
    if self.config.pooler:
      slots["pooled"] = self.pooler(x[:, 0])
    return slots


def document_positions(segment_ids: jax.Array) -> jax.Array:
  """[B, T] document ids of packed rows -> [B, T] positions restarting at 0 wherever
  the id changes (a family's positions in packed rows: each document's own)."""
  T = segment_ids.shape[1]
  idx = jnp.broadcast_to(jnp.arange(T), segment_ids.shape)
  starts = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool),
                            segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
  return idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)


def pool(hidden: jax.Array, attention_mask: jax.Array, how: str) -> jax.Array:
  """[B, T, E] -> [B, E]: 'cls' the first position (bertjax rows are right-padded),
  'mean' the mean over the real tokens."""
  if how == "cls":
    return hidden[:, 0]
  w = attention_mask.astype(hidden.dtype)[..., None]
  return jnp.sum(hidden * w, axis=1) / jnp.sum(w, axis=1)


def gather(hidden: jax.Array, positions: jax.Array) -> jax.Array:
  """[B, T, E] at positions [B, P] -> [B, P, E]."""
  x = jnp.take_along_axis(hidden, positions[..., None].astype(jnp.int32), axis=1)
  return constrain(x, (BATCH, None, EMBED))


def tied_logits(module: nn.Module, cfg: Any, x: jax.Array, encoder: Encoder,
                bias: bool = True) -> jax.Array:
  """[B, P, E] -> [B, P, V]: the encoder's tied token embedding plus (`bias`) a
  vocabulary bias, a parameter 'bias' [V] of `module` (call it in `module`'s compact
  `__call__`)."""
  logits = encoder.attend(x)
  if bias:
    b = module.param("bias", zeros_init(("vocab",)), (cfg.vocab_size,), cfg.param_dtype)
    logits = logits + b.astype(cfg.dtype)
  return constrain(logits, (BATCH, None, "activation_vocab"))


class MLMHead(nn.Module):
  """The family's `transform` (dense + activation + norm, built in this module's
  scope), then `tied_logits` (with a bias iff the config's `decoder_bias`), or, for a
  config whose `tie_word_embeddings` is False (EuroBERT, UltraBERT), its own
  'decoder' [D, V] (with a bias iff `decoder_bias`)."""

  config: Any
  transform: Callable[[Any, jax.Array], jax.Array]  # Family.mlm_transform

  @nn.compact
  def __call__(self, out: dict, encoder: Encoder, masked_lm_positions=None) -> jax.Array:
    """The encoder's output, at `masked_lm_positions` [B, P] (None: at every position,
    P = T) -> [B, P, V] logits."""
    cfg = self.config
    x = out["last_hidden_state"]
    if masked_lm_positions is not None:
      x = gather(x, masked_lm_positions)
    x = self.transform(cfg, x)
    if cfg.tie_word_embeddings:
      return tied_logits(self, cfg, x, encoder, cfg.decoder_bias)
    logits = dense(cfg, cfg.vocab_size, ("embed", "vocab"), "decoder",
                   use_bias=cfg.decoder_bias)(x)
    return constrain(logits, (BATCH, None, "activation_vocab"))


class PreTraining(nn.Module):
  """The encoder and the pretraining heads named in `heads` (`Family.pretraining`
  builds it: by default the heads the config's booleans name)."""

  config: Any
  family: Any  # the Family of `config`
  heads: tuple[str, ...] = ("mlm",)

  def setup(self):
    self.encoder = Encoder(self.config, self.family)
    for head in self.head_records:
      setattr(self, head.name, head.module(self.config))

  @property
  def head_records(self) -> list:
    """The `Head` of each name in `heads`."""
    return [self.family.head(name) for name in self.heads]

  @property
  def inputs(self) -> tuple[str, ...]:
    """Every input the model reads: the encoder's, the family's, each head's."""
    return (ENCODER_INPUTS + tuple(self.family.inputs)
            + tuple(k for head in self.head_records for k in head.inputs))

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None,
               position_ids=None, segment_ids=None, deterministic: bool = True,
               **inputs):
    """The encoder's inputs (`Encoder`), the family's (`Family.inputs`) and each
    head's (`Head.inputs`; e.g. MLM's masked_lm_positions [B, P], None: every
    position). A head whose inputs are required runs only when they are given (at
    initialisation, on zeros). Returns {'<head>_logits': float32} per head run."""
    unknown = sorted(set(inputs) - set(self.inputs))
    if unknown:
      raise TypeError(f"no part of this model reads {unknown}: its inputs are "
                      f"{list(self.inputs)} (heads {list(self.heads)}).")
    out = self.encoder(input_ids, attention_mask, token_type_ids, position_ids,
                       segment_ids, deterministic,
                       **{k: inputs[k] for k in self.family.inputs if k in inputs})
    result = {}
    for head in self.head_records:
      given = {k: inputs[k] for k in head.inputs if inputs.get(k) is not None}
      if head.required and len(given) < len(head.inputs):
        if not self.is_initializing():
          continue
        given = {k: jnp.zeros((input_ids.shape[0], 2), jnp.int32) for k in head.inputs}
      result[f"{head.name}_logits"] = getattr(self, head.name)(
          out, self.encoder, **given).astype(jnp.float32)
    return result

  def encode(self, input_ids, attention_mask=None, token_type_ids=None,
             output_hidden_states: bool = True):
    """The encoder alone (for `load_pretrained(...).encode`)."""
    return self.encoder(input_ids, attention_mask, token_type_ids,
                        output_hidden_states=output_hidden_states)

  def init_params(self, rng: jax.Array):
    """The parameters (boxed in `nn.Partitioned`, with their logical axes) drawn from
    `rng`; their shapes do not depend on the dummy [1, 8] input used to create them."""
    return self.init({"params": rng}, jnp.zeros((1, 8), jnp.int32))["params"]


def trunk_depth(path: Sequence[str], num_layers: int) -> int | None:
  """Where a parameter of a model's tree (`path`: its keys from the root) sits in the
  encoder, bottom-up: 0 the embedding, i + 1 block i (unscanned), `num_layers` what
  lies above the blocks (the final norm, which trains with the top block); None
  outside the trunk (the pooler, every head) and for scanned blocks (encoder/layers
  stacks them all: no one depth). Fine-tuning's freezing reads it."""
  if len(path) < 2 or path[0] != "encoder":
    return None
  name = path[1]
  if name == "embeddings":
    return 0
  if name.startswith("layer_"):
    return int(name[len("layer_"):]) + 1
  if name == "final_norm":
    return num_layers
  return None


def attention_pairs(length: int, window: int | None) -> int:
  """(query, key) pairs a row of `length` tokens scores: length^2 globally; within a
  window of half-width w, length * (2w + 1) less the pairs past either end."""
  if window is None or window >= length - 1:
    return length * length
  return length * (2 * window + 1) - window * (window + 1)


def train_flops(family: Any, cfg: Any, batch: int, seq: int, predictions: int
                ) -> dict[str, float]:
  """FLOPs of one training step (forward + backward = 3 x forward) by term, and their
  `total`:

    6 * N_enc * B * T                  the blocks' matmuls, N_enc = L * W, W the weights
                                       a block multiplies each token by
                                       (`Family.block_weights`: no embeddings, biases,
                                       norms)
    + 12 * B * N Dh * sum_l pairs_l    attention Q K^T and P V over the pairs each
                                       layer scores (`attention_pairs` of the config's
                                       `windows`: T^2 for a global layer), N heads of
                                       size Dh (N Dh = E unless a family sets Dh)
    + 6 * B * P * (W_mlm + D V)        the MLM head at the P masked positions only: its
                                       transform (`Family.mlm_weights`, default E D)
                                       and decoder
    + 6 * B * T * W_tok                the weights outside the blocks every token is
                                       multiplied by (`Family.token_weights`, e.g.
                                       ELECTRA's embedding projection)
    + the family's own heads' terms    (`Family.head_flops`, e.g. BERT's pooler + NSP)

  B batch, T length, P masked positions per row, L layers, E hidden, D the token
  embedding's width (`embedding_size`, E unless the family projects), V vocabulary.
  Embedding lookups are gathers (no FLOPs); element-wise work (softmax, activations,
  norms, rotary, the optimizer) is not model FLOPs, as in the PaLM MFU definition. A
  model computing the MLM logits at every position (Hugging Face's) does
  `train_flops(..., predictions=T)`."""
  E, D, V = cfg.hidden_size, cfg.embedding_size, cfg.vocab_size
  pairs = sum(attention_pairs(seq, w) for w in cfg.windows)
  mlm = E * D if family.mlm_weights is None else family.mlm_weights(cfg)
  terms = {
      "encoder_matmuls": 6.0 * (cfg.num_layers * family.block_weights(cfg)) * batch * seq,
      "attention": 12.0 * batch * cfg.num_heads * cfg.head_dim * pairs,
      "mlm_head": 6.0 * batch * predictions * (mlm + D * V),
  }
  if family.token_weights is not None:
    terms["token_weights"] = 6.0 * family.token_weights(cfg) * batch * seq
  if family.head_flops is not None:
    terms.update(family.head_flops(cfg, batch))
  terms["total"] = sum(terms.values())
  return terms
