"""What the ELECTRA path tests share (test_electra_finetune.py, _tools.py): tiny
Hugging Face ELECTRA directories (a discriminator, a generator, fine-tuned classes)
on the fixtures' 400-id WordPiece vocabulary written as vocab.txt, as the released
checkpoints ship theirs (transformers' models of them: tests/helpers.py's load_hf,
hf_outputs)."""

from __future__ import annotations

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
  assert files.save_hf_tokenizer(directory, tok) == "wordpiece"  # into the new folder
  perturb(getattr(transformers, cls)(hf_config(tok.vocab_size, **overrides))).save_pretrained(
      directory)
  return directory
