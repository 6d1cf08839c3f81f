"""Shared test utilities: tiny configs and synthetic batches."""

from __future__ import annotations

import numpy as np

from configs import bert_tiny


def tiny_config(**train_overrides):
  """bert_tiny shrunk further so a compile takes seconds."""
  c = bert_tiny.get_config()
  c.model.vocab_size = 97
  c.model.hidden_size = 32
  c.model.num_heads = 2
  c.model.intermediate_size = 64
  c.model.max_position_embeddings = 32
  c.model.dropout_rate = c.model.attention_dropout_rate = 0.1  # Exercise the dropout paths.
  c.model.dtype = "float32"  # As on the CPU on every test platform (GPUs default to bf16).
  c.data.max_seq_length = 16
  c.data.max_predictions_per_seq = 4
  c.train.batch_size = 8
  c.train.num_steps = 20
  c.train.warmup_steps = 2
  c.train.learning_rate = 1e-3
  for k, v in train_overrides.items():
    setattr(c.train, k, v)
  return c


def synthetic_batch(config, batch_size: int, seed: int = 0) -> dict[str, np.ndarray]:
  """A valid pretraining batch of random ids with padding and masked positions."""
  rng = np.random.default_rng(seed)
  T, P, V = config.data.max_seq_length, config.data.max_predictions_per_seq, config.model.vocab_size
  lengths = rng.integers(T // 2, T + 1, size=batch_size)
  ids = rng.integers(5, V, size=(batch_size, T)).astype(np.int32)
  mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
  ids = ids * mask
  positions = np.stack([np.sort(rng.choice(np.arange(1, n), P, replace=False)) for n in lengths])
  labels = np.take_along_axis(ids, positions, 1)
  weights = np.ones((batch_size, P), np.float32)
  weights[:, -1] = 0  # one padding slot per row
  return {
      "input_ids": ids, "attention_mask": mask,
      "token_type_ids": (np.arange(T)[None] >= lengths[:, None] // 2).astype(np.int32) * mask,
      "masked_lm_positions": positions.astype(np.int32), "masked_lm_ids": labels.astype(np.int32),
      "masked_lm_weights": weights,
      "next_sentence_labels": rng.integers(0, 2, size=batch_size).astype(np.int32),
  }


def offsets(haystack, needle) -> list[int]:
  """Where `needle` occurs contiguously in `haystack` (int32 sequences)."""
  hay, sub = np.asarray(haystack, np.int32).tobytes(), np.asarray(needle, np.int32).tobytes()
  found, k = [], hay.find(sub)
  while k >= 0:
    if k % 4 == 0:
      found.append(k // 4)
    k = hay.find(sub, k + 1)
  return found


def perturb(model):
  """A Hugging Face torch model with every weight moved (random init leaves norms at 1
  and biases at 0, which would hide a swapped or dropped one), in eval mode."""
  import torch  # pylint: disable=g-import-not-at-top
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn(p.shape, generator=gen))
  return model.eval()


def load_hf(directory: str, cls: str | None = None):
  """The transformers model of a Hugging Face directory (its config's class unless
  `cls`), eager attention, eval mode."""
  import transformers  # pylint: disable=g-import-not-at-top
  if cls is None:
    cls = transformers.AutoConfig.from_pretrained(directory).architectures[0]
  return getattr(transformers, cls).from_pretrained(
      directory, attn_implementation="eager").eval()


def hf_outputs(model, ids: np.ndarray, mask: np.ndarray, **kwargs):
  """The transformers model's output on int [B, T] (or [B, C, T]) ids and mask."""
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    return model(torch.as_tensor(np.asarray(ids), dtype=torch.long),
                 attention_mask=torch.as_tensor(np.asarray(mask), dtype=torch.long),
                 **kwargs)
