"""Model hyperparameters: one frozen dataclass, built from the config in one place."""

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


class FamilyConfig:
  """What the frozen config dataclass of every model family shares (mixed in): it is
  built from `config.model` in one place (`from_config`) and written back
  (`to_dict`); `family` names it in `bertjax.model.FAMILIES`."""

  family: ClassVar[str]

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


@dataclasses.dataclass(frozen=True)
class ModelConfig(FamilyConfig):
  """Hyperparameters of an encoder of the 'bert' family (BERT, RoBERTa, XLM-R,
  SpanBERT) and its pretraining heads.

  BERT: `type_vocab_size=2`, `position_offset=0`. RoBERTa / XLM-R: `type_vocab_size=1`
  and `position_offset=pad_token_id + 1` (positions count from past the padding index,
  padding tokens get position `pad_token_id`, exactly as fairseq and Hugging Face do).
  """

  family: ClassVar[str] = "bert"  # config.model.family (bertjax.model.FAMILIES)

  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  pad_token_id: int = 0
  position_offset: int = 0
  layer_norm_eps: float = 1e-12
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  initializer_range: float = 0.02
  pooler: bool = True
  nsp: bool = True
  sbo: bool = False  # SpanBERT's span-boundary objective head (with span masking)
  sbo_max_positions: int = 32  # relative positions inside a span the SBO head embeds
  # '' (the fastest path allowed: `attention.resolve_impl`), 'xla', 'cudnn' (GPU),
  # 'pallas_gpu' (GPU), 'splash' (TPU).
  attention_impl: str = ""
  scan_layers: bool = False  # nn.scan over the blocks: params under encoder/layers [L, ...]
  remat_policy: str = "none"  # a key of REMAT_POLICIES: what a block keeps for backward
  dtype: Any = jnp.float32  # compute dtype of activations
  param_dtype: Any = jnp.float32  # master weights

  def __post_init__(self):
    """Every field in range, or a one-line ConfigError naming it."""
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                 "intermediate_size", "max_position_embeddings", "type_vocab_size",
                 "sbo_max_positions"):
      if not getattr(self, name) >= 1:
        raise ConfigError(f"config.model.{name}={getattr(self, name)} must be >= 1.")
    if self.hidden_size % self.num_heads:
      raise ConfigError(
          f"config.model.hidden_size={self.hidden_size} is not divisible by "
          f"config.model.num_heads={self.num_heads}; pick sizes that divide.")
    if not 0 <= self.pad_token_id < self.vocab_size:
      raise ConfigError(f"config.model.pad_token_id={self.pad_token_id} must lie in "
                        f"[0, config.model.vocab_size={self.vocab_size}).")
    if not self.position_offset >= 0:
      raise ConfigError(f"config.model.position_offset={self.position_offset} must be >= 0.")
    for name in ("dropout_rate", "attention_dropout_rate"):
      if not 0 <= getattr(self, name) < 1:
        raise ConfigError(f"config.model.{name}={getattr(self, name)} must lie in [0, 1).")
    for name in ("layer_norm_eps", "initializer_range"):
      if not getattr(self, name) > 0:
        raise ConfigError(f"config.model.{name}={getattr(self, name)} must be positive.")
    if self.attention_impl not in ("", *IMPLS):
      raise ConfigError(f"config.model.attention_impl={self.attention_impl!r}: use '' "
                        f"(the fastest the platform allows) or one of {list(IMPLS)}.")
    if self.remat_policy not in REMAT_POLICIES:
      raise ConfigError(f"config.model.remat_policy={self.remat_policy!r}: use one of "
                       f"{sorted(REMAT_POLICIES)}.")
    if self.nsp and not self.pooler:
      raise ConfigError("config.model.nsp=True needs config.model.pooler=True.")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads
