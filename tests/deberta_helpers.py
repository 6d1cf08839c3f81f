"""What the DeBERTa tests share: tiny Hugging Face DeBERTa-v2 / v3 configs (the
variants the family must equal transformers on), a SentencePiece tokenizer in
DeBERTa's layout, a tiny Hugging Face DebertaV2ForMaskedLM directory, tiny bertjax
configs of the family, and the tensors of transformers' models.

DeBERTa-v3's own spm.model (128k pieces) cannot be downloaded here; `deberta_tokenizer`
trains a small one on the embedded corpus with the SentencePiece trainer in the same
layout: a unigram model whose pieces 0..3 are [PAD] [CLS] [SEP] [UNK], [MASK] the id
after the last piece (transformers' DebertaV2Tokenizer adds it there).
"""

from __future__ import annotations

import io
import json
import os

import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax.model import deberta as db
from tests.helpers import perturb, tiny_config

PIECES = 400  # the SentencePiece model's; [MASK] = 400
PAD, CLS, SEP, UNK, MASK = 0, 1, 2, 3, PIECES
VOCAB = PIECES + 1  # the tokenizer's ids: a bertjax model trained with it has these rows
HF_VOCAB = VOCAB + 7  # the Hugging Face models': a few unused rows (128,100 for 128,001)
# The variants the family must equal transformers on (Hugging Face's DebertaV2Config
# keys): DeBERTa-v3 (no absolute positions, log buckets, shared keys, the relative
# embeddings' LayerNorm), DeBERTa-v2 (absolute positions, token types, plain relative
# positions clipped at 8, own position projections, no norm, an embedding narrower
# than the hidden size: the legacy MLM head), and c2p alone (scale 1/sqrt(2 D)).
BASE = dict(vocab_size=HF_VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=64, pad_token_id=PAD,
            bos_token_id=CLS, eos_token_id=SEP, relative_attention=True,
            max_relative_positions=-1)
VARIANTS = {
    "v3": dict(BASE, position_buckets=8, pos_att_type="p2c|c2p", share_att_key=True,
               norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0,
               legacy=False),
    "v2": dict(BASE, position_buckets=-1, max_relative_positions=8,
               pos_att_type="p2c|c2p", share_att_key=False, norm_rel_ebd="none",
               position_biased_input=True, type_vocab_size=2, embedding_size=24,
               hidden_act="gelu_new", legacy=True),
    "c2p": dict(BASE, position_buckets=16, max_relative_positions=32, pos_att_type=["c2p"],
                share_att_key=False, norm_rel_ebd="layer_norm", position_biased_input=False,
                type_vocab_size=0, legacy=False),
}
TEXTS = ["the cat sat on the mat while the dog ran in the garden of the old house",
         "a dog", "the music was truly superb and the cast was good"]


def hf_config(variant: str = "v3", **overrides):
  """transformers.DebertaV2Config of a variant (eager attention)."""
  import transformers  # pylint: disable=g-import-not-at-top
  return transformers.DebertaV2Config(**{**VARIANTS[variant], **overrides})


def hf_model(cls: str = "DebertaV2ForMaskedLM", variant: str = "v3", **overrides):
  """A tiny random transformers `cls` of a variant, every weight moved, eval mode."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  return perturb(getattr(transformers, cls)(hf_config(variant, **overrides)))


def state(model) -> dict[str, np.ndarray]:
  return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def config_json(model) -> dict:
  """The config.json save_pretrained would write for a transformers model (its class in
  `architectures`)."""
  return {**model.config.to_dict(), "architectures": [type(model).__name__]}


def deberta_tokenizer(directory: str) -> str:
  """DeBERTa's kind of spm.model (module docstring) and tokenizer_config.json, as a
  Hugging Face DeBERTa-v3 directory holds them, in `directory`."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  from bertjax.data import sources  # pylint: disable=g-import-not-at-top
  texts = [s for doc in sources.load_documents("embedded")[:300] for s in doc] + TEXTS
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts), model_writer=model, vocab_size=PIECES,
      model_type="unigram", pad_id=PAD, pad_piece="[PAD]", bos_id=CLS, bos_piece="[CLS]",
      eos_id=SEP, eos_piece="[SEP]", unk_id=UNK, unk_piece="[UNK]", minloglevel=2)
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "spm.model"), "wb") as f:
    f.write(model.getvalue())
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "DebertaV2Tokenizer", "do_lower_case": False,
               "model_max_length": BASE["max_position_embeddings"]}, f)
  return directory


def hf_deberta(directory: str, cls: str = "DebertaV2ForMaskedLM", variant: str = "v3",
               **overrides) -> str:
  """`hf_model` saved with save_pretrained, with the tokenizer."""
  hf_model(cls, variant, **overrides).save_pretrained(directory)
  deberta_tokenizer(directory)
  return directory


def model_section(**overrides):
  """config.model of a tiny DeBERTa-v3 (the dataclass's defaults: v3-base's shape of
  parts), float32, sized for the tokenizer."""
  sizes = dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48,
               max_position_embeddings=64, position_buckets=8, vocab_size=VOCAB,
               pad_token_id=PAD, dtype=jnp.float32)
  return ml_collections.ConfigDict(db.DebertaConfig(**{**sizes, **overrides}).to_dict())


def pretrain_config(tokenizer_dir: str, **train):
  """20 steps of the tiny DeBERTa with MLM on the embedded corpus (packed 64-token
  rows, documents isolated): tests/helpers.tiny_config's run (a checkpoint every 5
  steps, metrics every 3)."""
  c = tiny_config(**{**dict(num_steps=20, log_every=3, eval_every=20, checkpoint_every=5,
                            eval_batches=1, max_to_keep=3), **train})
  c.model = model_section()
  c.objectives = ("mlm",)
  c.data.max_seq_length = 64
  c.data.max_predictions_per_seq = 10
  c.data.packing = "full_sentences"
  c.data.isolate_documents = True
  c.data.length_phases = ()
  c.data.dupe_factor = 1
  c.data.tokenizer.path = tokenizer_dir
  c.data.tokenizer.vocab_size = VOCAB
  return c
