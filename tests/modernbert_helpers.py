"""What the ModernBERT path tests share (test_modernbert_pretrain.py, _finetune.py,
_tools.py): a tokenizer like ModernBERT's, a tiny Hugging Face ModernBertForMaskedLM
directory and tiny bertjax configs of the family (transformers' models of them:
tests/helpers.py's load_hf, hf_outputs).

ModernBERT's own tokenizer cannot be downloaded here; `modernbert_tokenizer` builds its
equivalent from the stored 600-token byte-level BPE (tests/fixtures/bpe): a
tokenizer.json with the BPE, a ByteLevel pre-tokenizer, [UNK] [CLS] [SEP] [PAD] [MASK]
added after the BPE's ids (600..604, as ModernBERT's 50280..50284 follow its BPE;
[MASK] strips the space on its left) and the post-processor "[CLS] $A [SEP]".
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import ml_collections

from bertjax.model import modernbert as mb
from tests.helpers import tiny_config
from tests.tasks_helpers import fixture

SPECIALS = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")
UNK, CLS, SEP, PAD, MASK = range(600, 605)
VOCAB = 605
# The tiny encoder: 4 blocks (0 and 3 global), a window of 8 (4 each side), so rows of
# more than 9 tokens differ from global attention in blocks 1 and 2.
SIZES = dict(hidden_size=32, num_layers=4, num_heads=2, intermediate_size=48,
             local_attention=8, max_position_embeddings=128)
TEXTS = ["the cat sat on the mat while the dog ran in the garden of the old house",
         "a dog", "the music was truly superb and the cast was good"]


def modernbert_tokenizer(directory: str) -> str:
  """ModernBERT's kind of tokenizer.json (module docstring) in `directory`."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers, processors  # pylint: disable=g-import-not-at-top
  bpe = fixture("bpe")
  tok = tokenizers.Tokenizer(models.BPE.from_file(os.path.join(bpe, "vocab.json"),
                                                  os.path.join(bpe, "merges.txt")))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False,
                                                lstrip=t == "[MASK]") for t in SPECIALS])
  assert [tok.token_to_id(t) for t in SPECIALS] == [UNK, CLS, SEP, PAD, MASK]
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
      special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)])
  os.makedirs(directory, exist_ok=True)
  tok.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]",
               "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]",
               "unk_token": "[UNK]", "model_max_length": SIZES["max_position_embeddings"]},
              f)
  return directory


def hf_config(**overrides):
  """transformers.ModernBertConfig of the tiny encoder with the tokenizer's ids."""
  import transformers  # pylint: disable=g-import-not-at-top
  s = SIZES
  return transformers.ModernBertConfig(**{**dict(
      vocab_size=VOCAB, hidden_size=s["hidden_size"], num_hidden_layers=s["num_layers"],
      num_attention_heads=s["num_heads"], intermediate_size=s["intermediate_size"],
      global_attn_every_n_layers=3, local_attention=s["local_attention"],
      max_position_embeddings=s["max_position_embeddings"], pad_token_id=PAD,
      bos_token_id=CLS, eos_token_id=SEP, cls_token_id=CLS, sep_token_id=SEP), **overrides})


def hf_modernbert(directory: str, cls: str = "ModernBertForMaskedLM", **overrides) -> str:
  """A tiny random Hugging Face `cls` (its weights moved off their initial values, so
  that norms and biases matter) saved with save_pretrained, with the tokenizer."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  model = getattr(transformers, cls)(hf_config(**overrides))
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn(p.shape, generator=gen))
  model.save_pretrained(directory)
  modernbert_tokenizer(directory)
  return directory


def model_section(**overrides):
  """config.model of the tiny encoder, float32: every field of the family's dataclass
  at its default (Hugging Face's ModernBertConfig's; the recipes' training-only
  settings off), the sizes and the tokenizer's padding id set."""
  return ml_collections.ConfigDict(mb.ModernBertConfig(
      **{**SIZES, "vocab_size": VOCAB, "pad_token_id": PAD, "dtype": jnp.float32,
         **overrides}).to_dict())


def pretrain_config(tokenizer_dir: str, **train):
  """20 steps of the tiny encoder with the family's recipe (30% masking, packed rows of
  64 tokens with documents isolated, StableAdamW, a warm-up-stable-decay schedule) on
  the embedded corpus: tests/helpers.tiny_config's run (a checkpoint every 5 steps,
  metrics every 3) with a ModernBERT model."""
  c = tiny_config(**{**dict(num_steps=20, log_every=3, eval_every=20, checkpoint_every=5,
                            eval_batches=1, max_to_keep=3), **train})
  c.model = model_section()
  c.objectives = ("mlm",)
  c.data.max_seq_length = 64
  c.data.max_predictions_per_seq = 20  # round(0.3 * 62) = 19 fit
  c.data.masked_lm_prob = 0.3
  c.data.packing = "full_sentences"
  c.data.isolate_documents = True
  c.data.dupe_factor = 1
  c.data.tokenizer.path = tokenizer_dir
  c.data.tokenizer.vocab_size = VOCAB
  c.train.optimizer = "stable_adamw"
  c.train.schedule = "wsd"
  c.train.decay_fraction = 0.2
  c.train.max_grad_norm = 0.0
  return c
