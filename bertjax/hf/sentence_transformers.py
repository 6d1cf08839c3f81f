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
`similarity_fn_name`). An inference-free SPLADE folder is one `Router` instead, each
route's modules in folders of their own (`write_inference_free`), the transformers
model in the document route's (`transformer_dir`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

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


# An inference-free SPLADE folder (sentence-transformers' Router.for_query_document):
# queries by SparseStaticEmbedding (a weight per vocabulary entry for each token a query
# holds), documents by the MLM Transformer and SpladePooling, each in a route's folder.
ROUTER = "sentence_transformers.base.modules.router.Router"
ROUTER_CONFIG = "router_config.json"
_STATIC = ("sentence_transformers.sparse_encoder.modules.sparse_static_embedding."
           "SparseStaticEmbedding",
           "sentence_transformers.sparse_encoder.models.SparseStaticEmbedding")
STATIC_DIR = "query_0_SparseStaticEmbedding"
ROUTED_TRANSFORMER_DIR, ROUTED_SPLADE_DIR = "document_0_MLMTransformer", "document_1_SpladePooling"


@dataclasses.dataclass(frozen=True)
class StaticQueries:
  """An inference-free SPLADE folder's query side: the [V] float32 `weights` of
  SparseStaticEmbedding and whether it was saved `frozen`."""

  weights: Any
  frozen: bool


def write_inference_free(directory: str, settings: Settings, vocab_size: int, pooling: str,
                         activation: str, queries: StaticQueries) -> None:
  """The sentence-transformers files of an inference-free SPLADE model in `directory`,
  whose `ROUTED_TRANSFORMER_DIR` already holds the transformers *ForMaskedLM model and
  its tokenizer: a `SparseEncoder` folder as sentence-transformers 6 saves a
  `Router.for_query_document` of SparseStaticEmbedding (its weights, the tokenizer with
  `model_max_length` the queries' length) and the Transformer then SpladePooling."""
  _dump(os.path.join(directory, MODULES_FILE),
        [{"idx": 0, "name": "0", "path": "", "type": ROUTER}])
  _dump(os.path.join(directory, ROUTER_CONFIG), {
      "types": {STATIC_DIR: _STATIC[0], ROUTED_TRANSFORMER_DIR: _ST_TRANSFORMER,
                ROUTED_SPLADE_DIR: _SPLADE},
      "structure": {"query": [STATIC_DIR],
                    "document": [ROUTED_TRANSFORMER_DIR, ROUTED_SPLADE_DIR]},
      "parameters": {"default_route": "document", "allow_empty_key": True,
                     "route_mappings": {}}})
  transformer = os.path.join(directory, ROUTED_TRANSFORMER_DIR)
  _dump(os.path.join(transformer, "sentence_bert_config.json"), {
      "transformer_task": "fill-mask", "max_seq_length": settings.max_seq_length,
      "do_lower_case": settings.do_lower_case})
  os.makedirs(os.path.join(directory, ROUTED_SPLADE_DIR), exist_ok=True)
  _dump(os.path.join(directory, ROUTED_SPLADE_DIR, "config.json"), {
      "pooling_strategy": pooling, "activation_function": activation,
      "embedding_dimension": vocab_size})
  static = os.path.join(directory, STATIC_DIR)
  os.makedirs(static, exist_ok=True)
  for name in os.listdir(transformer):  # The same tokenizer, cut at the queries' length.
    if name.startswith(("tokenizer", "vocab", "merges", "special_tokens", "sentencepiece",
                        "spm")):
      shutil.copy(os.path.join(transformer, name), os.path.join(static, name))
  tokenizer_config = os.path.join(static, "tokenizer_config.json")
  _dump(tokenizer_config, {**_read(tokenizer_config),
                           "model_max_length": settings.max_seq_length})
  _dump(os.path.join(static, "config.json"), {"frozen": bool(queries.frozen)})
  save_file({"weight": np.asarray(queries.weights, np.float32)},
            os.path.join(static, "model.safetensors"))
  _dump(os.path.join(directory, "config_sentence_transformers.json"), {
      "model_type": "SparseEncoder",
      "prompts": {k: v for k, v in settings.prompts.items() if v},
      "default_prompt_name": None, "similarity_fn_name": "dot"})


def _router(directory: str) -> dict | None:
  """The router_config.json of a folder whose only module is a Router, else None."""
  modules = _read(os.path.join(directory, MODULES_FILE))
  if len(modules) == 1 and modules[0].get("type") == ROUTER:
    return _read(os.path.join(directory, modules[0].get("path", ""), ROUTER_CONFIG))
  return None


def _routes(directory: str) -> tuple[list[str], list[str]] | None:
  """(query, document) module folders of an inference-free SPLADE folder: a Router whose
  query route is SparseStaticEmbedding and whose document route is an MLM Transformer
  then SpladePooling; None for a folder without a Router; a one-line CheckpointError
  for a Router of anything else."""
  router = _router(directory)
  if router is None:
    return None
  types, routes = router.get("types", {}), router.get("structure", {})
  query, document = routes.get("query", []), routes.get("document", [])
  kinds = ([types.get(m, "") for m in query], [types.get(m, "") for m in document])
  if (len(query) != 1 or kinds[0][0] not in _STATIC or len(document) != 2
      or kinds[1][0] not in _MLM_TRANSFORMER or kinds[1][1] not in _SPLADES
      or set(routes) != {"query", "document"} or router.get("parameters", {}).get(
          "route_mappings")):
    raise CheckpointError(
        f"{directory}: its Router's routes {routes} ({kinds}) are not SparseStaticEmbedding "
        "for queries and an MLM Transformer then SpladePooling for documents; bertjax "
        "computes only that Router (inference-free SPLADE).")
  return query, document


def transformer_dir(directory: str) -> str:
  """Where the transformers model of a sentence-transformers folder is: the document
  route's folder of an inference-free SPLADE folder, else `directory` itself."""
  routes = _routes(directory) if is_folder(directory) else None
  return directory if routes is None else os.path.join(directory, routes[1][0])


def read_static_queries(directory: str) -> StaticQueries | None:
  """The query side of an inference-free SPLADE folder (None for another folder): its
  SparseStaticEmbedding's weights (model.safetensors; a module that points to an IDF
  json instead is refused in one line) and `frozen`."""
  routes = _routes(directory) if is_folder(directory) else None
  if routes is None:
    return None
  static = os.path.join(directory, routes[0][0])
  cfg = _read(os.path.join(static, "config.json"))
  weights = os.path.join(static, "model.safetensors")
  if not os.path.isfile(weights):
    raise CheckpointError(
        f"{static} has no model.safetensors (its config: {cfg}); load the folder once in "
        "sentence-transformers and save it (SparseEncoder(path).save_pretrained(new)), "
        "which writes its weights there.")
  return StaticQueries(load_file(weights)["weight"], bool(cfg.get("frozen", False)))


def read_sparse(directory: str) -> tuple[Settings, str, str]:
  """(its `Settings`, SpladePooling's pooling_strategy, activation_function) of a
  `SparseEncoder` folder whose modules bertjax computes (an MLM Transformer at the
  folder's root, then SpladePooling; or the inference-free Router of `_routes`, whose
  query side `read_static_queries` reads); a one-line CheckpointError naming any other
  module (another Router, SparseStaticEmbedding alone, a SparseAutoEncoder)."""
  routes = _routes(directory)
  if routes is not None:
    splade = os.path.join(directory, routes[1][1])
    settings = read_settings_files(directory, os.path.join(directory, routes[1][0]),
                                   pooling="mean", normalize=False)
  else:
    modules = _read(os.path.join(directory, MODULES_FILE))
    kinds = [m.get("type", "") for m in modules]
    if (len(kinds) != 2 or kinds[0] not in _MLM_TRANSFORMER or modules[0].get("path", "")
        or kinds[1] not in _SPLADES):
      raise CheckpointError(
          f"{directory}: modules {kinds} are not an MLM Transformer at the folder's root, "
          "then SpladePooling, nor an inference-free Router; bertjax computes only those "
          "(no SparseAutoEncoder): start from its transformers model.")
    splade = os.path.join(directory, modules[1]["path"])
    settings = read_settings_files(directory, pooling="mean", normalize=False)
  cfg = _read(os.path.join(splade, "config.json"))
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


def read_settings_files(directory: str, transformer: str = "", **settings) -> Settings:
  """`Settings(**settings)` with what the folder's sentence_bert_config.json (or its
  tokenizer's model_max_length; both in `transformer`, the Transformer's folder, where
  given) and config_sentence_transformers.json say: the length, lower-casing, prompts
  and similarity."""
  transformer = transformer or directory
  bert_config = os.path.join(transformer, "sentence_bert_config.json")
  cfg = _read(bert_config) if os.path.isfile(bert_config) else {}
  settings["max_seq_length"] = int(cfg.get("max_seq_length") or _tokenizer_length(transformer)
                                   or Settings.max_seq_length)
  settings["do_lower_case"] = bool(cfg.get("do_lower_case", False))
  st_config = os.path.join(directory, "config_sentence_transformers.json")
  if os.path.isfile(st_config):
    cfg = _read(st_config)
    settings["prompts"] = dict(cfg.get("prompts") or {})
    settings["similarity"] = cfg.get("similarity_fn_name") or Settings.similarity
  return Settings(**settings)
