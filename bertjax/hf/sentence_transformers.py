"""sentence-transformers folders: what an embedding model adds to a Hugging Face model
dir so that `sentence_transformers.SentenceTransformer(path)` loads it as it is, and
the same read back from a published folder (e.g. all-MiniLM-L6-v2).

A folder is the transformers model at its root (module 0, `Transformer`, path ''),
`modules.json` listing the modules, `1_Pooling/config.json` (sentence-transformers
v5's keys: `word_embedding_dimension`, `pooling_mode_<mode>` booleans,
`include_prompt`; v6 reads them), `2_Normalize` when the embeddings are L2-normalised,
`sentence_bert_config.json` (`max_seq_length`, `do_lower_case`; sentence-transformers 6
writes neither and keeps the length as the tokenizer's `model_max_length`) and
`config_sentence_transformers.json` (`prompts`, `default_prompt_name`,
`similarity_fn_name`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from bertjax.errors import CheckpointError

MODULES_FILE = "modules.json"
POOLING_DIR = "1_Pooling"
NORMALIZE_DIR = "2_Normalize"
# v5's boolean keys of each pooling mode (`bertjax.tasks.pooling.POOLINGS`).
POOLING_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                "max": "pooling_mode_max_tokens",
                "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
                "weightedmean": "pooling_mode_weightedmean_tokens",
                "lasttoken": "pooling_mode_lasttoken"}
_TRANSFORMER = ("sentence_transformers.models.Transformer",
                "sentence_transformers.base.modules.transformer.Transformer")
_POOLING = ("sentence_transformers.models.Pooling",
            "sentence_transformers.sentence_transformer.modules.pooling.Pooling")
_NORMALIZE = ("sentence_transformers.models.Normalize",
              "sentence_transformers.base.modules.normalize.Normalize")


@dataclasses.dataclass(frozen=True)
class Settings:
  """How an embedding model turns a text into a vector (the folder's files' content).

  prompts: {'query': ..., 'document': ...} prefixes ('' none), prepended to a text of
  that kind before tokenization (pooled with it: `include_prompt`).
  """

  pooling: str = "mean"
  normalize: bool = True
  max_seq_length: int = 128
  prompts: dict[str, str] = dataclasses.field(default_factory=dict)
  similarity: str = "cosine"
  do_lower_case: bool = False


def _dump(path: str, value: Any) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=2)
    f.write("\n")


def write(directory: str, settings: Settings, embedding_dimension: int) -> None:
  """The sentence-transformers files of `settings` in `directory`, which already holds
  the transformers model (`bertjax.hf.convert.save_hf`)."""
  modules = [{"idx": 0, "name": "0", "path": "", "type": _TRANSFORMER[0]},
             {"idx": 1, "name": "1", "path": POOLING_DIR, "type": _POOLING[0]}]
  if settings.normalize:
    modules.append({"idx": 2, "name": "2", "path": NORMALIZE_DIR, "type": _NORMALIZE[0]})
    os.makedirs(os.path.join(directory, NORMALIZE_DIR), exist_ok=True)
  _dump(os.path.join(directory, MODULES_FILE), modules)
  os.makedirs(os.path.join(directory, POOLING_DIR), exist_ok=True)
  _dump(os.path.join(directory, POOLING_DIR, "config.json"), {
      "word_embedding_dimension": embedding_dimension,
      **{key: mode == settings.pooling for mode, key in POOLING_KEYS.items()},
      "include_prompt": True})
  _dump(os.path.join(directory, "sentence_bert_config.json"),
        {"max_seq_length": settings.max_seq_length, "do_lower_case": settings.do_lower_case})
  prompts = {k: v for k, v in settings.prompts.items() if v}
  _dump(os.path.join(directory, "config_sentence_transformers.json"), {
      "prompts": prompts, "default_prompt_name": None,
      "similarity_fn_name": settings.similarity})


_ST_TRANSFORMER = _TRANSFORMER[1]  # sentence-transformers 6's name of its Transformer
SPLADE_DIR = "1_SpladePooling"
_SPLADE = "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"
# A SPLADE folder's first module: v6's Transformer, or v5's MLMTransformer (both names).
_MLM_TRANSFORMER = _TRANSFORMER + (
    "sentence_transformers.sparse_encoder.models.MLMTransformer",
    "sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer")
_SPLADES = (_SPLADE, "sentence_transformers.sparse_encoder.models.SpladePooling")


def write_sparse(directory: str, settings: Settings, vocab_size: int, pooling: str,
                 activation: str) -> None:
  """The sentence-transformers files of a SPLADE model in `directory`, which already
  holds the transformers *ForMaskedLM model: a `SparseEncoder` folder as
  sentence-transformers 6 writes one (its Transformer with transformer_task
  'fill-mask', then SpladePooling; dot-product similarity)."""
  _dump(os.path.join(directory, MODULES_FILE), [
      {"idx": 0, "name": "0", "path": "", "type": _ST_TRANSFORMER},
      {"idx": 1, "name": "1", "path": SPLADE_DIR, "type": _SPLADE}])
  os.makedirs(os.path.join(directory, SPLADE_DIR), exist_ok=True)
  _dump(os.path.join(directory, SPLADE_DIR, "config.json"), {
      "pooling_strategy": pooling, "activation_function": activation,
      "embedding_dimension": vocab_size})
  _dump(os.path.join(directory, "sentence_bert_config.json"), {
      "transformer_task": "fill-mask", "max_seq_length": settings.max_seq_length,
      "do_lower_case": settings.do_lower_case})
  _dump(os.path.join(directory, "config_sentence_transformers.json"), {
      "model_type": "SparseEncoder",
      "prompts": {k: v for k, v in settings.prompts.items() if v},
      "default_prompt_name": None, "similarity_fn_name": "dot"})


def read_sparse(directory: str) -> tuple[Settings, str, str]:
  """(its `Settings`, SpladePooling's pooling_strategy, activation_function) of a
  `SparseEncoder` folder whose modules bertjax computes (an MLM Transformer at the
  folder's root, then SpladePooling); a one-line CheckpointError naming any other
  module (an inference-free Router, SparseStaticEmbedding, a SparseAutoEncoder)."""
  modules = _read(os.path.join(directory, MODULES_FILE))
  kinds = [m.get("type", "") for m in modules]
  if (len(kinds) != 2 or kinds[0] not in _MLM_TRANSFORMER or modules[0].get("path", "")
      or kinds[1] not in _SPLADES):
    raise CheckpointError(
        f"{directory}: modules {kinds} are not an MLM Transformer at the folder's root, "
        "then SpladePooling; bertjax computes only those (no Router, no "
        "SparseStaticEmbedding or SparseAutoEncoder): start from its transformers model.")
  cfg = _read(os.path.join(directory, modules[1]["path"], "config.json"))
  settings = read_settings_files(directory, pooling="mean", normalize=False)
  if settings.similarity not in ("dot", Settings.similarity):
    raise CheckpointError(f"{directory}: similarity {settings.similarity!r}; a SPLADE "
                          "model scores by dot products.")
  return (dataclasses.replace(settings, similarity="dot"),
          cfg.get("pooling_strategy", "max"), cfg.get("activation_function", "relu"))


DENSE_DIR, MASK_DIR, TOKEN_NORMALIZE_DIR = "1_Dense", "2_MultiVectorMask", "3_Normalize"
_DENSE = "sentence_transformers.base.modules.dense.Dense"
_MASK = "sentence_transformers.multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask"
_MULTI_VECTOR_MODULES = (_TRANSFORMER, (_DENSE,), (_MASK,), _NORMALIZE)
_IDENTITY = ("torch.nn.modules.linear.Identity", "torch.nn.Identity")


@dataclasses.dataclass(frozen=True)
class MultiVector:
  """What a `MultiVectorEncoder` folder adds to its transformers encoder: `settings`
  (prompts: the query / document markers; max_seq_length: the documents' length;
  lower-casing), the projection `dim` x hidden ([hidden, dim] `projection`, no bias),
  the queries' `query_length`, their `expansion` ('fixed' or ''), whether the encoder
  `attend`s to the expansion positions, and the documents' `skiplist_words`."""

  settings: Settings
  dim: int
  projection: Any  # [hidden, dim] float32
  query_length: int
  expansion: str
  attend: bool
  skiplist_words: list[str]


def write_multi_vector(directory: str, settings: Settings, model: MultiVector) -> None:
  """The sentence-transformers files of a multi-vector model in `directory`, which
  already holds the transformers encoder: a `MultiVectorEncoder` folder as
  sentence-transformers 6 writes one (Transformer with its query / document lengths and
  query expansion, Dense to token_embeddings without bias, MultiVectorMask with the
  skip list on documents, Normalize of token_embeddings; MaxSim)."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  names = (DENSE_DIR, MASK_DIR, TOKEN_NORMALIZE_DIR)
  _dump(os.path.join(directory, MODULES_FILE), [
      {"idx": 0, "name": "0", "path": "", "type": _ST_TRANSFORMER},
      *({"idx": i, "name": str(i), "path": d, "type": t}
        for i, (d, t) in enumerate(zip(names, (_DENSE, _MASK, _NORMALIZE[1])), 1))])
  for d in names:
    os.makedirs(os.path.join(directory, d), exist_ok=True)
  hidden = int(model.projection.shape[0])
  tokens = {"module_input_name": "token_embeddings", "module_output_name": "token_embeddings"}
  _dump(os.path.join(directory, DENSE_DIR, "config.json"), {
      "in_features": hidden, "out_features": model.dim, "bias": False,
      "activation_function": _IDENTITY[0], **tokens})
  save_file({"linear.weight": np.ascontiguousarray(np.asarray(model.projection, np.float32).T)},
            os.path.join(directory, DENSE_DIR, "model.safetensors"))
  _dump(os.path.join(directory, MASK_DIR, "config.json"), {
      "skiplist_words": list(model.skiplist_words), "skiplist_tasks": ["document"],
      "keep_only_token_ids": None})
  _dump(os.path.join(directory, TOKEN_NORMALIZE_DIR, "config.json"), tokens)
  _dump(os.path.join(directory, "sentence_bert_config.json"), {
      "transformer_task": "feature-extraction",
      "modality_config": {"text": {"method": "forward",
                                   "method_output_name": "last_hidden_state"}},
      "module_output_name": "token_embeddings",
      "max_seq_length": settings.max_seq_length, "do_lower_case": settings.do_lower_case,
      "query_length": model.query_length, "document_length": settings.max_seq_length,
      "query_expansion": ({"strategy": "fixed", "attend": model.attend, "token": None,
                           "length": model.query_length} if model.expansion else None)})
  _dump(os.path.join(directory, "config_sentence_transformers.json"), {
      "model_type": "MultiVectorEncoder",
      "prompts": {k: v for k, v in settings.prompts.items() if v},
      "default_prompt_name": None, "similarity_fn_name": "maxsim"})


def read_multi_vector(directory: str) -> MultiVector:
  """The `MultiVector` of a `MultiVectorEncoder` folder whose modules bertjax computes
  (a Transformer at the root, a Dense to token_embeddings without bias or activation,
  MultiVectorMask, Normalize: sentence-transformers 6's layout); a one-line
  CheckpointError naming what differs (PyLate's and Stanford's older layouts: load
  them once in sentence-transformers and save them again)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  modules = _read(os.path.join(directory, MODULES_FILE))
  kinds = [m.get("type", "") for m in modules]
  if (len(kinds) != 4 or modules[0].get("path", "")
      or any(k not in known for k, known in zip(kinds, _MULTI_VECTOR_MODULES))):
    raise CheckpointError(
        f"{directory}: modules {kinds} are not a Transformer at the folder's root, Dense, "
        "MultiVectorMask and Normalize (sentence-transformers 6's MultiVectorEncoder); "
        "load it with MultiVectorEncoder and save_pretrained it to convert older layouts.")
  path = lambda i, name: os.path.join(directory, modules[i]["path"], name)
  dense = _read(path(1, "config.json"))
  if dense.get("bias") or dense.get("activation_function", _IDENTITY[0]) not in _IDENTITY:
    raise CheckpointError(f"{directory}: its Dense has a bias or an activation; bertjax "
                          "projects without either, as ColBERT does.")
  weights = load_file(path(1, "model.safetensors"))
  kernel = next(v for k, v in weights.items() if k.endswith("weight"))
  mask = _read(path(2, "config.json"))
  if mask.get("keep_only_token_ids") or list(mask.get("skiplist_tasks", ["document"])) != [
      "document"]:
    raise CheckpointError(f"{directory}: its MultiVectorMask keeps only some token ids or "
                          "skips query tokens; bertjax skips document tokens only.")
  cfg = _read(os.path.join(directory, "sentence_bert_config.json"))
  expansion = cfg.get("query_expansion")
  if expansion and expansion.get("strategy", "fixed") != "fixed" or (
      expansion and expansion.get("token") not in (None, "[MASK]", "<mask>")):
    raise CheckpointError(f"{directory}: query_expansion {expansion}; bertjax expands "
                          "queries with the 'fixed' strategy and the mask token.")
  settings = read_settings_files(directory, pooling="mean", normalize=True)
  length = int(cfg.get("document_length") or settings.max_seq_length)
  query_length = int((expansion or {}).get("length") or cfg.get("query_length") or 32)
  return MultiVector(
      settings=dataclasses.replace(settings, max_seq_length=length, similarity="dot"),
      dim=int(kernel.shape[0]), projection=np.asarray(kernel, np.float32).T,
      query_length=query_length, expansion="fixed" if expansion else "",
      attend=bool((expansion or {}).get("attend", False)),
      skiplist_words=list(mask.get("skiplist_words") or []))


def is_multi_vector_folder(directory: str) -> bool:
  """Whether `directory` is a sentence-transformers `MultiVectorEncoder` folder (a
  MultiVectorMask among its modules, or its config says so)."""
  return _is_kind(directory, (_MASK,), "MultiVectorEncoder")


def _is_kind(directory: str, modules: tuple[str, ...], model_type: str) -> bool:
  """Whether `directory` is a sentence-transformers folder with one of `modules`, or
  whose config_sentence_transformers.json says `model_type`."""
  if not is_folder(directory):
    return False
  kinds = [m.get("type", "") for m in _read(os.path.join(directory, MODULES_FILE))]
  st_config = os.path.join(directory, "config_sentence_transformers.json")
  return any(k in modules for k in kinds) or (
      os.path.isfile(st_config) and _read(st_config).get("model_type") == model_type)


def is_folder(directory: str) -> bool:
  """Whether `directory` is a sentence-transformers folder (it has modules.json)."""
  return os.path.isfile(os.path.join(directory, MODULES_FILE))


def is_sparse_folder(directory: str) -> bool:
  """Whether `directory` is a sentence-transformers `SparseEncoder` folder (a
  SpladePooling among its modules, or its config says so)."""
  return _is_kind(directory, _SPLADES, "SparseEncoder")


def _read(path: str) -> Any:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise CheckpointError(f"{path} cannot be read ({e}): the sentence-transformers "
                          "folder is incomplete or corrupt.") from None


def _tokenizer_length(directory: str) -> int:
  """tokenizer_config.json's `model_max_length` where it is a length (transformers
  writes 1e30 for none), else 0: sentence-transformers 6 keeps a model's
  max_seq_length there, not in sentence_bert_config.json."""
  path = os.path.join(directory, "tokenizer_config.json")
  length = _read(path).get("model_max_length") if os.path.isfile(path) else None
  return int(length) if isinstance(length, (int, float)) and 0 < length < 1e9 else 0


def read(directory: str) -> Settings:
  """The `Settings` of a sentence-transformers folder whose modules bertjax computes
  (a Transformer at the root, a Pooling of one mode, an optional Normalize); a
  one-line CheckpointError naming any other module or setting."""
  modules = _read(os.path.join(directory, MODULES_FILE))
  kinds = [m.get("type", "") for m in modules]
  known = _TRANSFORMER + _POOLING + _NORMALIZE
  other = [k for k in kinds if k not in known]
  if other or not kinds or kinds[0] not in _TRANSFORMER or modules[0].get("path", ""):
    raise CheckpointError(
        f"{directory}: modules {kinds} are not a Transformer at the folder's root, then "
        "Pooling and an optional Normalize; bertjax computes only those (no Dense, "
        "no Router): start from its transformers model and train a pooling of your own.")
  settings: dict[str, Any] = {"normalize": any(k in _NORMALIZE for k in kinds)}
  pooling = next((m for m in modules if m["type"] in _POOLING), None)
  if pooling is not None:
    cfg = _read(os.path.join(directory, pooling["path"], "config.json"))
    modes = cfg.get("pooling_mode") or [mode for mode, key in POOLING_KEYS.items()
                                        if cfg.get(key)]
    modes = [modes] if isinstance(modes, str) else list(modes)
    if len(modes) != 1 or modes[0] not in POOLING_KEYS:
      raise CheckpointError(f"{directory}: pooling modes {modes}; bertjax pools with one "
                            f"of {list(POOLING_KEYS)}.")
    if not cfg.get("include_prompt", True):
      raise CheckpointError(f"{directory}: its pooling leaves the prompt's tokens out "
                            "(include_prompt false), which bertjax does not do.")
    settings["pooling"] = modes[0]
  return read_settings_files(directory, **settings)


def read_settings_files(directory: str, **settings) -> Settings:
  """`Settings(**settings)` with what the folder's sentence_bert_config.json (or its
  tokenizer's model_max_length) and config_sentence_transformers.json say: the length,
  lower-casing, prompts and similarity."""
  bert_config = os.path.join(directory, "sentence_bert_config.json")
  cfg = _read(bert_config) if os.path.isfile(bert_config) else {}
  settings["max_seq_length"] = int(cfg.get("max_seq_length") or _tokenizer_length(directory)
                                   or Settings.max_seq_length)
  settings["do_lower_case"] = bool(cfg.get("do_lower_case", False))
  st_config = os.path.join(directory, "config_sentence_transformers.json")
  if os.path.isfile(st_config):
    cfg = _read(st_config)
    settings["prompts"] = dict(cfg.get("prompts") or {})
    settings["similarity"] = cfg.get("similarity_fn_name") or Settings.similarity
  return Settings(**settings)
