"""Hugging Face model directories on disk: the weights (`read_state_dict`), the
tokenizer files as transformers reads them (`save_hf_tokenizer`), and a directory's
config.json + model.safetensors (`write`)."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from bertjax.data.tokenizer import SENTENCEPIECE_FILE, SPM_FILE
from bertjax.errors import CheckpointError


def read_state_dict(directory: str) -> dict[str, np.ndarray]:
  """Weights of a Hugging Face model dir: model.safetensors (or its shards), else
  pytorch_model.bin (read with torch, imported only then)."""
  join = lambda name: os.path.join(directory, name)
  if os.path.isfile(join("model.safetensors")):
    shards = ["model.safetensors"]
  elif os.path.isfile(join("model.safetensors.index.json")):
    with open(join("model.safetensors.index.json")) as f:
      shards = sorted(set(json.load(f)["weight_map"].values()))
  elif os.path.isfile(join("pytorch_model.bin")):
    import torch  # pylint: disable=g-import-not-at-top
    state = torch.load(join("pytorch_model.bin"), map_location="cpu", weights_only=True)
    return {k: v.float().numpy() if v.is_floating_point() else v.numpy()
            for k, v in state.items()}
  else:
    raise CheckpointError(f"{directory} has no model.safetensors or pytorch_model.bin.")
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  state = {}
  for shard in shards:
    state.update(load_file(join(shard)))
  return state


def _json(path: str) -> Any:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _save_byte_level_bpe(directory: str, state: dict) -> None:
  """RoBERTa's files of a byte-level BPE tokenizer.json `state`: vocab.json (the model's
  vocabulary and the added tokens, <mask> included) and merges.txt."""
  vocab = dict(state["model"]["vocab"])
  vocab.update({t["content"]: t["id"] for t in state.get("added_tokens", [])})
  with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as f:
    json.dump(vocab, f, ensure_ascii=False)
  merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
  with open(os.path.join(directory, "merges.txt"), "w", encoding="utf-8") as f:
    f.write("#version: 0.2\n" + "".join(m + "\n" for m in merges))


def _post_processor(tokenizer):
  """The `tokenizers` post-processor that adds `tokenizer`'s special tokens as
  `Tokenizer.build_inputs` does: [CLS] a [SEP] b [SEP] (token types 0 / 1) or
  <s> a </s></s> b </s>."""
  from tokenizers import processors  # pylint: disable=g-import-not-at-top
  cls = (tokenizer.id_to_token(tokenizer.cls_id), tokenizer.cls_id)
  sep = (tokenizer.id_to_token(tokenizer.sep_id), tokenizer.sep_id)
  if tokenizer.style == "roberta":
    return processors.RobertaProcessing(sep, cls, trim_offsets=False,
                                        add_prefix_space=False)
  return processors.TemplateProcessing(
      single=f"{cls[0]} $A {sep[0]}", pair=f"{cls[0]} $A {sep[0]} $B:1 {sep[0]}:1",
      special_tokens=[cls, sep])


def _special_tokens(tokenizer) -> dict[str, str]:
  """tokenizer_config.json's names of the special tokens (bos / eos: [CLS] / [SEP])."""
  name = lambda i: tokenizer.id_to_token(i)
  names = {"cls_token": name(tokenizer.cls_id), "sep_token": name(tokenizer.sep_id),
           "bos_token": name(tokenizer.cls_id), "eos_token": name(tokenizer.sep_id)}
  if tokenizer.unk_id is not None:  # a byte-level BPE may have none (EuroBERT's)
    names["unk_token"] = name(tokenizer.unk_id)
  return names


def save_hf_tokenizer(directory: str, tokenizer, max_length: int = 512,
                      tokenizer_json: bool = False) -> str:
  """Writes the tokenizer as Hugging Face reads it, for a model of `max_length`
  positions (tokenizer_config.json's model_max_length; BERT's 512 when not given): a
  WordPiece vocabulary as vocab.txt (+ do_lower_case), a SentencePiece model as
  sentencepiece.bpe.model (XLM-R's layout) or spm.model (DeBERTa's, read by
  DebertaV2Tokenizer), a byte-level BPE as vocab.json + merges.txt (RoBERTa), any other
  `tokenizers` model as tokenizer.json — or, with
  `tokenizer_json` (a model type whose AutoTokenizer reads tokenizer.json only, e.g.
  ModernBERT's), every `tokenizers` model as tokenizer.json with a post-processor
  adding the special tokens as bertjax does (when it has none) and their names in
  tokenizer_config.json. A 'template' tokenizer (EuroBERT's Llama-3 BPE) is written as
  tokenizer.json (its own post-processor) with its special tokens' names either way.
  Returns 'wordpiece', 'sentencepiece', 'spm',
  'byte_level_bpe' or 'json'. `directory` must be new or empty (an export's temporary
  folder, `bertjax.writes.export_dir`): the kind is read off the files just written."""
  if os.path.isdir(directory) and os.listdir(directory):
    raise CheckpointError(f"{directory} is not empty: a tokenizer is exported into a new "
                          "folder (bertjax.writes.export_dir), never beside old files.")
  tokenizer.save(directory)
  json_path = os.path.join(directory, "tokenizer.json")
  spm_file = [n for n in (SENTENCEPIECE_FILE, SPM_FILE)
              if os.path.isfile(os.path.join(directory, n))]
  state = None if spm_file else _json(json_path)
  if spm_file == [SENTENCEPIECE_FILE]:
    kind, settings = "sentencepiece", {"tokenizer_class": "XLMRobertaTokenizer"}
  elif spm_file:  # DeBERTa's spm.model
    kind, settings = "spm", {"tokenizer_class": "DebertaV2Tokenizer",
                             "do_lower_case": False, "split_by_punct": False,
                             **_special_tokens(tokenizer)}
  elif tokenizer_json:
    if not state.get("post_processor"):
      import tokenizers  # pylint: disable=g-import-not-at-top
      written = tokenizers.Tokenizer.from_file(json_path)
      written.post_processor = _post_processor(tokenizer)
      written.save(json_path)
    kind, settings = "json", {"tokenizer_class": "PreTrainedTokenizerFast",
                              **_special_tokens(tokenizer)}
  elif (tokenizer.style == "roberta" and state["model"]["type"] == "BPE"
        and (state.get("pre_tokenizer") or {}).get("type") == "ByteLevel"
        and not state.get("normalizer")):
    # vocab.json + merges.txt rebuild RoBERTa's whole pipeline (<s> a </s></s> b </s>).
    os.remove(json_path)
    _save_byte_level_bpe(directory, state)
    # RoBERTa's <mask> swallows the space before it (lstrip), as bertjax's does.
    kind, settings = "byte_level_bpe", {"tokenizer_class": "RobertaTokenizer", "mask_token": {
        "__type": "AddedToken", "content": tokenizer.id_to_token(tokenizer.mask_id),
        "lstrip": True, "rstrip": False, "normalized": False, "single_word": False,
        "special": True}}
  elif tokenizer.style == "bert" and state["model"]["type"] == "WordPiece":
    # vocab.txt + do_lower_case rebuild BERT's full pipeline (with [CLS]/[SEP]) on
    # both sides; the bare tokenizer.json would lack the post-processor.
    os.remove(json_path)
    with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
      f.write("".join(tokenizer.id_to_token(i) + "\n" for i in range(tokenizer.vocab_size)))
    lower = tokenizer.tokenize("Hello World") == tokenizer.tokenize("hello world")
    kind, settings = "wordpiece", {"tokenizer_class": "BertTokenizer", "do_lower_case": lower}
  elif getattr(tokenizer, "style", None) == "template":
    # Its tokenizer.json's post-processor lays out the rows (EuroBERT's Llama-3 BPE);
    # tokenizer_config.json names the special tokens transformers cannot tell from it.
    kind, settings = "json", {"tokenizer_class": "PreTrainedTokenizerFast",
                              **_special_tokens(tokenizer)}
  else:
    kind, settings = "json", {}
  pad, mask = tokenizer.id_to_token(tokenizer.pad_id), tokenizer.id_to_token(tokenizer.mask_id)
  settings.setdefault("mask_token", mask)
  settings.update(pad_token=pad, model_max_length=max_length)
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump(settings, f, indent=2)
  return kind


def write(directory: str, hf_config: dict[str, Any], state: dict[str, np.ndarray]) -> None:
  """config.json and model.safetensors (float32 numpy `state`) into `directory`."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2)
  save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
