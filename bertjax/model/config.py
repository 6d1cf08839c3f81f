"""Model hyperparameters: what every family's frozen config dataclass shares
(`FamilyConfig`: built from `config.model` in one place, written back, its common
fields checked), dtypes by name and the rematerialisation policies. Each family's
dataclass lives in its file (`bert.ModelConfig`, `modernbert.ModernBertConfig`)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from bertjax.errors import ConfigError
from bertjax.model.attention import IMPLS

# Dtype names accepted wherever a config or an API takes one.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


AUTO_DTYPE_FIELD = "config.model.dtype"  # The one dtype field where '' means auto.


def default_dtype(platform: str | None = None) -> Any:
  """The activation dtype of `config.model.dtype=''`: bfloat16 on GPUs and TPUs (their
  matmul units; master weights, softmax / LayerNorm statistics and the loss stay
  float32), float32 on the CPU. `platform`: `jax.default_backend()` unless given."""
  return jnp.bfloat16 if (platform or jax.default_backend()) in ("gpu", "tpu") else jnp.float32


def dtype_of(name: str, field: str = AUTO_DTYPE_FIELD) -> Any:
  """The dtype named `name` (a key of DTYPES; for config.model.dtype '' is
  `default_dtype()`: the one place the platform decides it), or a one-line ConfigError
  naming `field`."""
  if name == "" and field == AUTO_DTYPE_FIELD:
    return default_dtype()
  if name not in DTYPES:
    raise ConfigError(f"{field}={name!r}: use one of {sorted(DTYPES)}"
                      + (" or '' (bfloat16 on GPUs and TPUs, float32 on the CPU)."
                         if field == AUTO_DTYPE_FIELD else "."))
  return DTYPES[name]

# Rematerialisation: what each block saves for the backward pass ('none': everything,
# no recomputation; 'full': only its input, the block is recomputed; 'dots': matmul
# outputs; 'dots_no_batch': matmul outputs without batch dimensions, i.e. the weight-
# stationary ones, recomputing attention scores).
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


# The sizes a replaced-token-detection generator takes from `config.generator`.
GENERATOR_SIZES = ("hidden_size", "num_heads", "intermediate_size", "num_layers")


@dataclasses.dataclass(frozen=True)
class FamilyConfig:
  """The fields every family's frozen config dataclass shares, declared once (a
  family's dataclass subclasses it, restating a field only to change its default):
  it is built from `config.model` in one place (`from_config`), written back
  (`to_dict`) and its common fields checked (`check_common`); `family` names it in
  `bertjax.model.FAMILIES`. The class constants and properties below are the answers of
  a family that lacks the feature (`bertjax.model.family` lists what every config
  answers). The defaults are BERT-base's sizes."""

  family: ClassVar[str]
  decoder_bias: ClassVar[bool] = True  # the MLM head's vocabulary bias
  tie_word_embeddings: ClassVar[bool] = True  # the MLM decoder is the token embedding
  classifier_pooling: ClassVar[str] = "cls"  # packed examples' rows: first token

  vocab_size: int = 30522
  hidden_size: int = 768  # E
  num_layers: int = 12  # L
  num_heads: int = 12  # N, attention heads (the head size is hidden_size / N)
  intermediate_size: int = 3072  # the feed-forward's width
  max_position_embeddings: int = 512  # a position table's rows, or the context trained for
  pad_token_id: int = 0
  initializer_range: float = 0.02  # the initial weights' standard deviation
  # The initial weights' normal truncated at +- this many initializer_range (0:
  # untruncated, torch's normal_; 2: google-research/bert's truncated normal).
  initializer_cutoff_factor: float = 2.0
  # '' (the fastest path the platform, dtype and attention dropout allow:
  # `attention.resolve_impl`), 'xla', 'cudnn' (GPU), 'pallas_gpu' (GPU), 'splash' (TPU).
  attention_impl: str = ""
  scan_layers: bool = False  # nn.scan over the blocks: params under encoder/layers [L, ...]
  remat_policy: str = "none"  # a key of REMAT_POLICIES: what a block keeps for backward
  dtype: Any = jnp.float32  # compute dtype of activations (config.model.dtype '': auto)
  param_dtype: Any = jnp.float32  # master weights

  @property
  def head_dim(self) -> int:
    """D, the size of a head."""
    return self.hidden_size // self.num_heads

  @property
  def max_length(self) -> int:
    """The tokens a row may hold: the positions from `position_offset` (each family's
    config answers it) to `max_position_embeddings`."""
    return self.max_position_embeddings - self.position_offset

  @property
  def num_kv_heads(self) -> int:
    """K, the key / value heads (grouped-query attention when < num_heads)."""
    return self.num_heads

  @property
  def embedding_size(self) -> int:
    """The width of the token embedding, which the MLM head's transform maps back to:
    `hidden_size` unless the family projects its embeddings (ELECTRA's field)."""
    return self.hidden_size

  @property
  def windows(self) -> tuple[int | None, ...]:
    """Each block's attention half-width (query i sees keys j with |i - j| <= w), None
    for global attention."""
    return (None,) * self.num_layers

  def generator(self, sizes: dict[str, int]) -> "FamilyConfig":
    """The generator of replaced-token detection for this discriminator: this config
    at `sizes` (`GENERATOR_SIZES`: config.generator's), without the 'rtd' head; every
    other field, the token embedding's width included, stays this one's (so the
    embedding tables the two networks share have one shape). One-line ConfigErrors: a
    size that is not a generator's, a generator wider or deeper than its
    discriminator."""
    unknown = sorted(set(sizes) - set(GENERATOR_SIZES))
    if unknown:
      raise ConfigError(f"config.generator has {unknown}: it sets only "
                        f"{list(GENERATOR_SIZES)} (the rest are config.model's).")
    generator = dataclasses.replace(self, rtd=False, **dict(sizes))
    for name in GENERATOR_SIZES:
      if getattr(generator, name) > getattr(self, name):
        raise ConfigError(
            f"config.generator.{name}={getattr(generator, name)} exceeds the "
            f"discriminator's config.model.{name}={getattr(self, name)}: a generator is at "
            "most the discriminator's size (ELECTRA: 1/4 to 1/2 of its width; "
            "DeBERTa-v3: half its depth).")
    return generator

  def check_common(self, sizes: tuple[str, ...], dropouts: tuple[str, ...]) -> None:
    """One-line ConfigErrors for the fields every family has: `sizes` (these and the
    common ones) >= 1, `dropouts` in [0, 1), the padding id inside the vocabulary, an
    attention path and a remat policy that exist."""
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                 "intermediate_size", "max_position_embeddings") + sizes:
      if not getattr(self, name) >= 1:
        raise ConfigError(f"config.model.{name}={getattr(self, name)} must be >= 1.")
    for name in dropouts:
      if not 0 <= getattr(self, name) < 1:
        raise ConfigError(f"config.model.{name}={getattr(self, name)} must lie in [0, 1).")
    if not self.initializer_cutoff_factor >= 0:
      raise ConfigError(f"config.model.initializer_cutoff_factor="
                        f"{self.initializer_cutoff_factor} must be >= 0 (0: an untruncated "
                        "normal).")
    if not 0 <= self.pad_token_id < self.vocab_size:
      raise ConfigError(f"config.model.pad_token_id={self.pad_token_id} must lie in "
                        f"[0, config.model.vocab_size={self.vocab_size}).")
    if self.attention_impl not in ("", *IMPLS):
      raise ConfigError(f"config.model.attention_impl={self.attention_impl!r}: use '' "
                        f"(the fastest the platform allows) or one of {list(IMPLS)}.")
    if self.remat_policy not in REMAT_POLICIES:
      raise ConfigError(f"config.model.remat_policy={self.remat_policy!r}: use one of "
                        f"{sorted(REMAT_POLICIES)}.")

  @classmethod
  def from_config(cls, model_cfg):
    """The dataclass of `config.model` (a ConfigDict or a plain dict): dtypes from
    their names ('' by platform, `dtype_of`), an unknown field or another family a
    one-line ConfigError."""
    d = dict(model_cfg)
    family = d.pop("family", cls.family)
    if family != cls.family:
      raise ConfigError(f"config.model.family={family!r} is not {cls.__name__}'s; set it "
                        f"to {cls.family!r}.")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - fields
    if unknown:
      raise ConfigError(f"Unknown config.model fields {sorted(unknown)}; known: {sorted(fields)}.")
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}  # JSON lists
    for key in ("dtype", "param_dtype"):
      if isinstance(d.get(key), str):
        d[key] = dtype_of(d[key], f"config.model.{key}")
    if d.get("attention_impl") in (None, "none", "None"):  # Older configs' "XLA picks".
      d["attention_impl"] = ""
    return cls(**d)

  def to_dict(self) -> dict:
    """JSON-serialisable form (dtypes as names), with its `family`."""
    d = {"family": self.family, **dataclasses.asdict(self)}
    for key in ("dtype", "param_dtype"):
      d[key] = jnp.dtype(d[key]).name
    return d
