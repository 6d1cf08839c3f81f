"""The engine every family's Hugging Face table runs on: a table lists each bertjax
parameter as an `Entry` (bertjax path, Hugging Face key, kind), and `read` / `write`
move a state dict through it, both ways, with the checks every family needs (a key
the checkpoint lacks, a decoder untied from the embedding, a shape the config does
not imply). A family's table module (`bert.py`, `modernbert.py`) keeps only its
mapping, its config.json translation and its task classes.

Kinds: Hugging Face stores Linear weights [out, in]; bertjax stores kernels [in, out]
at their true shapes (heads and fused projections split out). E hidden, N heads,
D head size, M intermediate size (the config's):

  copy       the same array (embeddings, norms, biases of [out] vectors)
  dense      [out, in] <-> [in, out]
  qkv        a query / key / value [N*D, E] <-> [E, N, D]
  qkv_bias   [N*D] <-> [N, D]
  kv         a grouped-query key / value [K*D, E] <-> [E, K, D] (K key / value heads)
  kv_bias    [K*D] <-> [K, D]
  attn_out   the attention output [E, N*D] <-> [N, D, E]
  wqkv       the fused query|key|value [3*N*D, E] <-> [E, 3, N, D]
  wqkv_bias  [3*N*D] <-> [3, N, D]
  wi         a fused GLU input [2*M, E] (input half, then gate half) <-> [E, 2, M]
  wi_bias    [2*M] <-> [2, M]
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from bertjax.errors import CheckpointError


class Entry(NamedTuple):
  path: tuple[str, ...]  # into the bertjax params tree
  key: str  # the Hugging Face state-dict key
  kind: str  # a key of the module docstring's kinds


def _shapes(config) -> dict[str, tuple[int, ...]]:
  """The bertjax shape of each kind that splits an axis (their trailing dims)."""
  n, d, m = config.num_heads, config.head_dim, config.intermediate_size
  k = config.num_kv_heads
  return {"qkv": (n, d), "qkv_bias": (n, d), "kv": (k, d), "kv_bias": (k, d),
          "attn_out": (n, d), "wqkv": (3, n, d),
          "wqkv_bias": (3, n, d), "wi": (2, m), "wi_bias": (2, m)}


def to_bertjax(kind: str, w: np.ndarray, config) -> np.ndarray:
  """A Hugging Face array of `kind` in bertjax's layout (sizes from `config`)."""
  if kind == "copy":
    return w
  if kind == "dense":
    return w.T
  split = _shapes(config).get(kind)
  if split is None:
    raise ValueError(f"unknown parameter kind {kind!r}")
  if kind.endswith("_bias"):
    return w.reshape(split)
  if kind == "attn_out":  # [E, N*D] -> [N, D, E]
    return w.T.reshape(*split, w.shape[0])
  return w.T.reshape(w.shape[1], *split)  # [F*E', E] -> [E, *split]


def to_hf(kind: str, w: np.ndarray) -> np.ndarray:
  """The inverse of `to_bertjax`."""
  if kind == "copy":
    return w
  if kind == "dense":
    return w.T
  if kind.endswith("_bias"):
    return w.reshape(-1)
  if kind == "attn_out":  # [N, D, E] -> [E, N*D]
    return w.reshape(-1, w.shape[-1]).T
  if kind in ("qkv", "kv", "wqkv", "wi"):  # [E, *split] -> [prod(split), E]
    return w.reshape(w.shape[0], -1).T
  raise ValueError(f"unknown parameter kind {kind!r}")


def read_fields(hf: dict[str, Any], keys: dict[str, str], defaults: Any) -> dict[str, Any]:
  """{bertjax field: its config.json value} for `keys` (bertjax field -> config.json
  key, a family's one list of the fields both directions share); a key absent or null
  takes `defaults`' attribute of the field: the family's config dataclass where its
  defaults are its Hugging Face class's (so each default is written once), else an
  object holding the Hugging Face class's."""
  return {field: getattr(defaults, field) if hf.get(key) is None else hf[key]
          for field, key in keys.items()}


def write_fields(config: Any, keys: dict[str, str]) -> dict[str, Any]:
  """The config.json entries of `config`'s fields `keys` (as `read_fields`)."""
  return {key: getattr(config, field) for field, key in keys.items()}


def task_of(hf: dict[str, Any], task_classes: dict[str, tuple[str, str]]) -> str | None:
  """The bertjax task of a config.json's `architectures` by a family's `task_classes`
  (bertjax task -> (Hugging Face class, head name)); None: a pretraining or bare class."""
  archs = hf.get("architectures") or []
  return next((task for task, (cls, _) in task_classes.items() if cls in archs), None)


def encoder_prefix(state_dict: dict, embedding_key: str, what: str) -> str:
  """What precedes the encoder's keys ('bert.', 'model.', '' for a bare encoder): the
  prefix of the key ending in `embedding_key`; `what` names the encoder in the error."""
  for key in state_dict:
    if key.endswith(embedding_key):
      return key[:-len(embedding_key)]
  raise CheckpointError(f"the checkpoint has no '*{embedding_key}': not a {what} encoder.")


def check_tied(state_dict: dict, decoder_keys: Sequence[str], embedding_key: str,
               what: str = "the word embeddings") -> None:
  """CheckpointError when an MLM decoder differs from the token embedding: bertjax
  ties them, so such a checkpoint cannot be represented."""
  for key in decoder_keys:
    if key in state_dict and not np.array_equal(state_dict[key], state_dict[embedding_key]):
      raise CheckpointError(f"{key} differs from {what}; bertjax ties them "
                            "(tie_word_embeddings=true).")


def exact_key(state_dict: dict, key: str) -> np.ndarray:
  """The state dict's array at `key`, or a one-line CheckpointError."""
  if key not in state_dict:
    raise CheckpointError(f"the checkpoint lacks {key!r}; it does not match its "
                          "config.json.")
  return state_dict[key]


def label_config(labels: Sequence[str] | None, outputs: int) -> dict[str, dict]:
  """config.json's id2label / label2id of a classifier with `outputs` rows, named by
  `labels` (default LABEL_i), or a one-line CheckpointError when they differ in
  number."""
  names = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(outputs)]
  if len(names) != outputs:
    raise CheckpointError(f"{len(names)} labels for a classifier with {outputs} outputs.")
  return {"id2label": {str(i): l for i, l in enumerate(names)},
          "label2id": {l: i for i, l in enumerate(names)}}


def task_config(task) -> tuple[dict[str, str], list[str] | None]:
  """A fine-tuned `task`'s config.json problem_type ({} where it has none) and the names
  of its classifier's outputs (None: Hugging Face's defaults)."""
  extra = ({"problem_type": "regression"} if task.regression else
           {"problem_type": "single_label_classification"}
           if task.name == "classification" else {})
  labels = (["LABEL_0"] if task.regression else list(task.labels)
            if task.name in ("classification", "tagging") else None)
  return extra, labels


def readers(config_from_hf: Callable[..., Any], task_of: Callable[[dict], str | None],
            params_from_hf: Callable[[dict, Any, str | None], dict]
            ) -> tuple[Callable, Callable]:
  """A family's (`check_supported`, `load`), as `hf.convert` calls them, from its
  `config_from_hf(config.json, **overrides)` (which refuses what bertjax cannot
  represent), `task_of(config.json)` and `params_from_hf(state dict, config, task)`."""

  def check_supported(hf: dict[str, Any]) -> None:
    """CheckpointError unless bertjax can represent the Hugging Face model (its config
    is read whole, every variant check included)."""
    config_from_hf(hf)

  def load(hf: dict[str, Any], state_dict: dict[str, np.ndarray], **overrides
           ) -> tuple[Any, dict, str | None]:
    """(config, params, task) of a Hugging Face config.json and its weights; task from
    its `architectures` (None for the bare model or its MLM), whose head is then in
    params['head']."""
    config = config_from_hf(hf, **overrides)
    task = task_of(hf)
    return config, params_from_hf(state_dict, config, task), task

  return check_supported, load


def exporters(export: Callable[..., tuple[dict[str, Any], dict[str, np.ndarray]]],
              token_ids: Callable[[Any], dict[str, int]]) -> tuple[Callable, Callable]:
  """A family's (`export_pretrained`, `export_finetuned`), as `hf.convert` calls them,
  from its `export(params, config, task, labels, extra)` -> (config.json, state dict)
  and `token_ids(tokenizer)`, the special ids its config.json names."""

  def export_pretrained(params: dict, config, tokenizer, tokenizer_kind: str):
    """(config.json, state dict) of the Hugging Face model holding `params` (its
    pretraining heads, else the bare encoder)."""
    del tokenizer_kind
    return export(params, config, extra=token_ids(tokenizer))

  def export_finetuned(finetuned, tokenizer_kind: str):
    """(config.json with the labels and problem type, state dict) of the *For<Task>
    model of a fine-tuned model (`bertjax.tasks.finetuned.load_finetuned`)."""
    del tokenizer_kind
    problem, labels = task_config(finetuned.task)
    return export(finetuned.params, finetuned.model, finetuned.task.name, labels,
                  {**token_ids(finetuned.tokenizer), **problem})

  return export_pretrained, export_finetuned


def read(state_dict: dict[str, np.ndarray], table: Sequence[Entry], config,
         lookup: Callable[[dict, str], np.ndarray] = exact_key) -> dict:
  """bertjax params (nested dict of float32 numpy arrays, unscanned) of a Hugging Face
  state dict through `table`; `lookup(state_dict, key)` finds each key (a family's
  legacy names), a key it lacks a CheckpointError. Pretraining parameters (all but a
  task's 'head') are checked against the shapes `config` implies."""
  params: dict = {}
  for entry in table:
    w = np.asarray(lookup(state_dict, entry.key), dtype=np.float32)
    node = params
    for name in entry.path[:-1]:
      node = node.setdefault(name, {})
    node[entry.path[-1]] = to_bertjax(entry.kind, w, config)
  check_shapes({k: v for k, v in params.items() if k != "head"}, config)
  return params


def write(params: dict, table: Sequence[Entry]) -> dict[str, np.ndarray]:
  """A Hugging Face state dict (float32 numpy) of bertjax `params` (unscanned) through
  `table`."""
  state = {}
  for entry in table:
    node = params
    for name in entry.path:
      node = node[name]
    state[entry.key] = np.ascontiguousarray(to_hf(entry.kind, np.asarray(node, np.float32)))
  return state


def unscanned(params: dict, config) -> dict:
  """`params` in the unscanned layout (what the tables list), from either layout."""
  from bertjax import model as model_lib  # pylint: disable=g-import-not-at-top
  return model_lib.family_of(config).to_layout(params, False)


def params_to_hf(params: dict, config, param_table: Callable[..., list[Entry]],
                 prefix: str, task: str | None = None, embedding: str = "",
                 tied: Sequence[str] = ()) -> dict[str, np.ndarray]:
  """A Hugging Face state dict (float32 numpy) of `params` (either layout) through a
  family's `param_table(config, prefix, mlm, task)`: its For* classes' keys, the encoder
  under `prefix`, when `params` has 'mlm' (and there is no `task`) or with a `task`,
  else the bare encoder's (no prefix). With the MLM head, each key of `tied` (a decoder
  Hugging Face ties) holds a copy of the token embedding (the key `embedding` after the
  prefix)."""
  params = unscanned(params, config)
  mlm = task is None and "mlm" in params
  prefix = prefix if mlm or task else ""
  state = write(params, param_table(config, prefix, mlm, task))
  for key in tied if mlm else ():
    state[key] = state[prefix + embedding].copy()
  return state


def exported(hf_config: Callable[..., dict], config, architecture: str,
             state: dict[str, np.ndarray], labels: Sequence[str] | None = None,
             extra: dict | None = None, classifier: str | None = None
             ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(config.json, `state`) of the Hugging Face `architecture` holding a family's export:
  `hf_config(config, architecture, extra)`, where a task head's `classifier` (its key in
  `state`; None: a model without one) adds the id2label / label2id of its rows, named
  by `labels` (`label_config`), ahead of `extra`."""
  if classifier is not None:
    extra = {**label_config(labels, state[classifier].shape[0]), **(extra or {})}
  return hf_config(config, architecture, extra), state


def check_shapes(params: dict, config) -> None:
  """CheckpointError naming the first parameter whose shape is not the one the
  pretraining model of `config` (unscanned, every head it has) gives it."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  from bertjax import model as model_lib  # pylint: disable=g-import-not-at-top

  config = dataclasses.replace(config, scan_layers=False)
  model = model_lib.family_of(config).pretraining(config)
  expected = jax.eval_shape(lambda: nn.unbox(model.init_params(jax.random.key(0))))
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    want: Any = expected
    for k in path:
      want = want.get(k.key) if isinstance(want, dict) else None
    name = "/".join(k.key for k in path)
    if want is None:
      raise CheckpointError(f"parameter {name} is not one the config implies.")
    if tuple(leaf.shape) != tuple(want.shape):
      raise CheckpointError(f"parameter {name} has shape {leaf.shape}, the config implies "
                            f"{want.shape}.")
