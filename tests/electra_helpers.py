"""What the ELECTRA path tests share (test_electra_finetune.py, _tools.py): tiny
Hugging Face ELECTRA directories (a discriminator, a generator, fine-tuned classes)
on the fixtures' 400-id WordPiece vocabulary written as vocab.txt, as the released
checkpoints ship theirs, and transformers' outputs on them."""

from __future__ import annotations

import numpy as np

from bertjax.data.tokenizer import load_tokenizer
from bertjax.hf import files
from tests.helpers import perturb
from tests.tasks_helpers import fixture

# The tiny network: embeddings of 16 projected to 32, 2 blocks, 4 heads.
SIZES = dict(embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=48, max_position_embeddings=64)
TEXTS = ["the movie was truly superb and the cast was good", "a dull film",
         "john smith lives in new york"]


def hf_config(vocab_size: int = 400, **overrides):
  """transformers.ElectraConfig of the tiny network."""
  import transformers  # pylint: disable=g-import-not-at-top
  return transformers.ElectraConfig(**{**SIZES, "vocab_size": vocab_size, **overrides})


def hf_electra(directory: str, cls: str = "ElectraForPreTraining", **overrides) -> str:
  """A tiny random transformers `cls` (every weight moved off its initial value) saved
  with save_pretrained, and the fixtures' WordPiece vocabulary as vocab.txt."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  tok = load_tokenizer(fixture("tokenizer"))
  torch.manual_seed(0)
  perturb(getattr(transformers, cls)(hf_config(tok.vocab_size, **overrides))).save_pretrained(
      directory)
  assert files.save_hf_tokenizer(directory, tok) == "wordpiece"
  return directory


def load_hf(directory: str, cls: str | None = None):
  """The transformers model of a directory (its config's class unless `cls`), eager
  attention, eval mode."""
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
