"""The BERT paper's feature-based approach (section 5.4, Table 7): the pretrained
encoder is frozen and a tagger is trained over its activations.

Features per token: 'concat_last4', the last four hidden states concatenated ([B, T,
4E], the paper's best, 96.1 dev F1 on CoNLL-2003 with BERT-base), or 'scalar_mix',
ELMo's learned mix gamma * sum_j softmax(s)_j h_j of the L blocks' outputs (the
paper's "weighted sum of all 12 layers"). The tagger: a BiLSTM (`lstm_layers` layers
of `lstm_size` units per direction; the paper: two layers of 768) then a linear layer,
or a linear layer alone.

Frozen means no gradient and no optimizer state: `FinetuneModel` runs the encoder
deterministically under `jax.lax.stop_gradient` when its head says
`frozen_encoder` (no backward pass through the encoder, none of its activations kept
for one), and `finetune.make_optimizer` gives the encoder's parameters
`optax.set_to_zero` through `optax.partition` (no Adam moments for them).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.errors import ConfigError
from bertjax.model import family_of
from bertjax.tasks import base

FEATURES = ("concat_last4", "scalar_mix")
TAGGERS = ("bilstm", "linear")


def check(task_cfg, model: Any = None) -> None:
  """ConfigError for an unknown `features` / `tagger`, or (given the encoder) too few
  layers for 'concat_last4'."""
  if task_cfg.features not in ("",) + FEATURES:
    raise ConfigError(f"config.task.features={task_cfg.features!r}: use '' (fine-tuning) "
                      f"or one of {FEATURES}.")
  if task_cfg.tagger not in TAGGERS:
    raise ConfigError(f"config.task.tagger={task_cfg.tagger!r}: use one of {TAGGERS}.")
  if task_cfg.lstm_size < 1 or task_cfg.lstm_layers < 1:
    raise ConfigError(f"config.task.lstm_size={task_cfg.lstm_size} and lstm_layers="
                      f"{task_cfg.lstm_layers} must be >= 1.")
  if model is not None and task_cfg.features == "concat_last4" and model.num_layers < 3:
    raise ConfigError(f"config.task.features='concat_last4' needs 4 hidden states; the "
                      f"encoder has {model.num_layers} layers (+ embeddings): use "
                      "'scalar_mix'.")


class ScalarMix(nn.Module):
  """ELMo's scalar mix (Peters et al. 2018, eq. 1): softmax-normalised weights s [L]
  (initially equal) and a scale gamma []."""

  @nn.compact
  def __call__(self, layers: jax.Array) -> jax.Array:
    """layers [L, B, T, E] -> [B, T, E]."""
    s = self.param("weights", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           (None,)), (layers.shape[0],))
    gamma = self.param("gamma", nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                             ()), ())
    w = jax.nn.softmax(s.astype(jnp.float32)).astype(layers.dtype)
    return gamma.astype(layers.dtype) * jnp.einsum("l,lbte->bte", w, layers)


class FeatureTaggingHead(nn.Module):
  """A tagger over a frozen encoder's features (`FinetuneModel` gives this head
  `hidden_states` [L+1, B, T, E], embeddings first, out of `stop_gradient`)."""

  config: Any  # the model config (any family)
  num_tags: int
  features: str  # 'concat_last4' | 'scalar_mix'
  tagger: str  # 'bilstm' | 'linear'
  lstm_size: int
  lstm_layers: int
  frozen_encoder = True  # Read by FinetuneModel.

  @nn.compact
  def __call__(self, out: dict, batch: dict, deterministic: bool) -> dict:
    """-> `logits` [B, T, K] float32."""
    hidden = out["hidden_states"]
    if self.features == "concat_last4":
      x = jnp.concatenate(list(hidden[-4:]), axis=-1)  # [B, T, 4E]
    else:
      x = ScalarMix(name="scalar_mix")(hidden[1:])  # [B, T, E]
    family = family_of(self.config)
    drop = nn.Dropout(self.config.classifier_dropout)
    x = drop(x, deterministic=deterministic)
    if self.tagger == "bilstm":
      lengths = jnp.sum(batch["attention_mask"], axis=-1).astype(jnp.int32)  # [B]
      for i in range(self.lstm_layers):
        forward, backward = (nn.RNN(nn.OptimizedLSTMCell(
            self.lstm_size, dtype=self.config.dtype, param_dtype=self.config.param_dtype,
            name=f"lstm_{i}_{d}")) for d in ("forward", "backward"))
        x = nn.Bidirectional(forward, backward)(x, seq_lengths=lengths)  # [B, T, 2 * size]
        x = drop(x, deterministic=deterministic)
    return {"logits": family.output_layer(self.config, self.num_tags, "tagger")(x)
                      .astype(jnp.float32)}
