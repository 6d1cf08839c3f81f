"""What the EuroBERT and UltraBERT tests share (test_eurobert.py, test_ultrabert.py,
test_eurobert_train.py): tiny transformers models of each family (random, every weight
moved), their bertjax configs and parameters through the family's conversion table, the
model's outputs on both sides, and a tokenizer of each family's kind.

The tiny encoders: 3 blocks, hidden 32, 4 query heads over 2 key / value heads
(grouped-query attention), SwiGLU 48; UltraBERT's blocks 0 and 1 sliding (a radius of 4
each side, so rows of more than 9 tokens differ from global attention), block 2 full.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax.hf import convert
from bertjax.model import family_of
from tests.helpers import perturb

VOCAB = 96
HF_SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                pad_token_id=0, bos_token_id=1, eos_token_id=2)
HF_FAMILY = {  # family -> (config class, MLM class, its own small settings)
    "eurobert": ("EuroBertConfig", "EuroBertForMaskedLM",
                 dict(rope_parameters={"rope_type": "default", "rope_theta": 250_000.0},
                      mask_token_id=3)),
    "ultrabert": ("UltrabertConfig", "UltrabertForMaskedLM",
                  dict(sliding_window=4, prediction_head_size=40)),
}
FAMILIES = tuple(HF_FAMILY)


def hf_config(family: str, **overrides):
  import transformers  # pylint: disable=g-import-not-at-top
  config_cls, _, own = HF_FAMILY[family]
  return getattr(transformers, config_cls)(**{**HF_SMALL, **own, **overrides},
                                           attn_implementation="eager")


def hf_model(family: str, cls: str | None = None, **overrides):
  """A tiny random transformers `cls` (default: the family's MLM) with every weight
  moved (`perturb`), eval mode."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  return perturb(getattr(transformers, cls or HF_FAMILY[family][1])(
      hf_config(family, **overrides)))


def state(model) -> dict[str, np.ndarray]:
  return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def load(model, **overrides):
  """(config, params, task) of a transformers model through its conversion table."""
  hf = model.config.to_dict()
  return convert.table_of(hf).load(hf, state(model), **overrides)


def ours(cfg, params, scan: bool = False, dtype=jnp.float32, **inputs):
  """(hidden states [L+1, B, T, E], MLM logits [B, T, V]) of bertjax's model, jitted."""
  family = family_of(cfg)
  cfg = type(cfg).from_config({**cfg.to_dict(), "scan_layers": scan, "dtype": dtype,
                               "param_dtype": jnp.float32})
  model = family.pretraining(cfg)
  params = family.to_layout(params, scan)

  def run(p, i):
    hidden = model.apply({"params": p}, i["input_ids"], i.get("attention_mask"),
                         method=lambda m, *a: m.encoder(
                             *a, position_ids=i.get("position_ids"),
                             segment_ids=i.get("segment_ids"), output_hidden_states=True))
    return hidden["hidden_states"], model.apply({"params": p}, **i)["mlm_logits"]

  hidden, logits = jax.jit(run)(params, inputs)
  return np.asarray(hidden, np.float32), np.asarray(logits, np.float32)


def theirs(model, ids, mask=None):
  """(hidden states [L+1, B, T, E], logits) of the transformers model."""
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    out = model(torch.as_tensor(ids, dtype=torch.long), attention_mask=None if mask is None
                else torch.as_tensor(mask), output_hidden_states=True)
  return np.stack([h.numpy() for h in out.hidden_states]), out.logits.numpy()


def model_section(family: str, **overrides):
  """config.model of the tiny encoder (float32; BPE_VOCAB ids: the modernbert_helpers
  tokenizer's), every other field at the family dataclass's default."""
  cls = family_of(family).config
  sizes = dict(hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
               intermediate_size=48, max_position_embeddings=128, vocab_size=605,
               pad_token_id=603)
  if family == "ultrabert":
    sizes.update(sliding_window=4, prediction_head_size=40)
  return ml_collections.ConfigDict(cls(**{**sizes, "dtype": jnp.float32,
                                          **overrides}).to_dict())


# Llama-3's special tokens as EuroBERT's tokenizer has them (after the BPE's ids).
LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|mask|>")


def llama3_tokenizer(directory: str) -> str:
  """EuroBERT's kind of tokenizer folder (a Llama-3 byte-level BPE, tokenizer.json and
  tokenizer_config.json naming <|begin_of_text|> bos, <|end_of_text|> eos and pad,
  <|mask|> mask, a post-processor adding bos ... eos) over the stored BPE's pieces
  (RoBERTa's special tokens left out)."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers, processors  # pylint: disable=g-import-not-at-top
  from tests.tasks_helpers import fixture  # pylint: disable=g-import-not-at-top
  bpe = fixture("bpe")
  with open(os.path.join(bpe, "vocab.json"), encoding="utf-8") as f:
    pieces = sorted(json.load(f).items(), key=lambda kv: kv[1])
  # Llama-3's vocabulary has none of RoBERTa's <s> <pad> </s> <unk> <mask>.
  vocab = {t: i for i, (t, _) in enumerate(p for p in pieces if not p[0].startswith("<"))}
  with open(os.path.join(bpe, "merges.txt"), encoding="utf-8") as f:
    merges = [tuple(line.split()) for line in f.read().splitlines()[1:] if line.strip()]
  tok = tokenizers.Tokenizer(models.BPE(vocab, merges))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                          for t in LLAMA3_SPECIALS])
  bos, eos = (tok.token_to_id(t) for t in LLAMA3_SPECIALS[:2])
  tok.post_processor = processors.TemplateProcessing(
      single="<|begin_of_text|> $A <|end_of_text|>",
      special_tokens=[("<|begin_of_text|>", bos), ("<|end_of_text|>", eos)])
  os.makedirs(directory, exist_ok=True)
  tok.save(os.path.join(directory, "tokenizer.json"))
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": LLAMA3_SPECIALS[0],
               "eos_token": LLAMA3_SPECIALS[1], "pad_token": LLAMA3_SPECIALS[1],
               "mask_token": LLAMA3_SPECIALS[2]}, f)
  return directory
