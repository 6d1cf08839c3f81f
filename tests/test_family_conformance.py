"""Every registered family (`bertjax.model.FAMILIES`) and its conversion table
(`bertjax.hf.convert.TABLES`) under one suite: a family added next month is tested by
registering it. Each family's tiny config comes from the registry alone (`tiny_config`:
the shared sizes set on the family's own dataclass, a generic rule for the fields a
tiny model needs besides), and one session fixture per family holds its config, its
parameters (`_drawn` at the shapes `init_params` gives: no weight at its initial 0 or
1, which would hide a swapped or dropped one) and its rows, reused by every check:
one program per config and shape (float32, bfloat16, scanned; the task heads), no
compiled initialisation, no compiled optimizer. The checks:

1. init: every parameter carries logical axis names, one per dimension (the scanned
   layout's stack 'layers' first); the table's `check_shapes` takes them; the
   exported state dict has the keys and shapes of the transformers class the table
   names.
2. layouts: `to_layout` both ways exact; a `scan_layers` model on the scanned
   parameters gives the unscanned model's outputs, on padded and packed rows.
3. Hugging Face: params -> state dict -> params and state dict -> params -> state
   dict exact, the config.json read back the same config; the transformers class of
   `pretraining_model` on the exported state dict gives bertjax's hidden states and
   MLM logits in float32 (within ATOL of the largest magnitude). On disk: that model's
   `save_pretrained` folder reads back (`convert.load_hf`) as the same config and
   parameters, and bertjax's export written to a folder loads with
   `AutoModelForMaskedLM.from_pretrained` to the same logits.
4. FLOPs: `train_flops` against XLA's count of forward + backward (within 5%).
5. bfloat16 against float32 (every layer's hidden states and the logits, within
   BF16_BOUND, and really bfloat16).
6. packed rows (`segment_ids`, each document's positions from 0) against each
   document alone, in float32 and in bfloat16.
7. a train state saved by bertjax's `Checkpointer` restores bit for bit, and the
   update after it is the update without the checkpoint.
8. every fine-tuning task's head (`bertjax.tasks.TASKS`, and the feature-based tagger)
   builds and runs; where the table's TASK_CLASSES has a Hugging Face class, the
   exported model's outputs in transformers equal bertjax's.

    python -m pytest -s -n 0 tests/test_family_conformance.py  # prints each figure
"""

from __future__ import annotations

import dataclasses
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import tasks as tasks_lib
from bertjax.checkpoint import manager as ckpt_lib
from bertjax.errors import ConfigError
from bertjax.hf import convert, files, table as engine
from bertjax.model import FAMILIES, layers, stack
from bertjax.tasks import finetuned as finetuned_lib
from configs.finetune import glue, ner, rerank, span_ner, squad, swag

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NAMES = sorted(FAMILIES)

# The sizes every family's tiny config takes (those its dataclass has).
TINY = dict(vocab_size=128, hidden_size=32, num_layers=3, num_heads=4,
            intermediate_size=64, max_position_embeddings=512)
WINDOW = 4  # A windowed layer's half-width at most (`tiny_config`), well inside a row.
B, T = 3, 320  # Rows past 256 positions, where bfloat16 stops holding every integer.
LENGTHS = (T, 203, 17)  # The padded rows.
DOCS = (170, 90, 41)  # The documents of the packed rows.
PACKING = ((0, 1, 2), (2, 1), (1, 0))  # Each packed row's documents, in order.
NOISE = 0.15  # The parameters' spread (`_drawn`): peaked attention, norms off 1.
# Float32 against float32, relative to the largest magnitude: transformers (torch
# kernels) and bertjax's rows, packed or alone.
ATOL = 1e-5
PACKED_ATOL = 5e-6
# ||bf16 - fp32|| / ||fp32|| over the real positions (the worst layer's hidden states;
# the MLM logits): bfloat16's rounding, which a defect breaks. Measured here (CPU, XLA
# path): 0.006-0.010 for BERT, DeBERTa, ELECTRA, GTE, ModernBERT, NomicBERT; 0.012-0.014
# EuroBERT; 0.017-0.020 UltraBERT (packed rows the highest); rotary positions cast to
# bfloat16 give ModernBERT and EuroBERT 0.035-0.044. Loose: tests/test_bf16_numerics.py
# holds BERT and ModernBERT to 0.015 against transformers.
BF16_BOUND = 0.025
FLOPS_RTOL = 0.05
# The FLOPs check's sizes: large enough that the element-wise work XLA also counts
# (norms, softmax, activations) and the terms a family counts per batch rather than
# per token (DeBERTa's relative-embedding projections) stay small. Lowered only: no
# compile, no memory.
FLOPS = dict(vocab_size=1024, hidden_size=256, num_layers=3, num_heads=4,
             intermediate_size=1024, max_position_embeddings=256)
FLOPS_B, FLOPS_T, FLOPS_P = 32, 256, 32

# Each task of the registry (and the feature-based tagger) -> its recipe's task config.
TASK_CONFIGS = {
    "classification": lambda: glue.get_config("mnli").task,
    "tagging": lambda: ner.get_config().task,
    "tagging_features": lambda: ner.get_config("features").task,
    "squad": lambda: squad.get_config().task,
    "multiple_choice": lambda: swag.get_config().task,
    "span_ner": lambda: span_ner.get_config("attention").task,
    "rerank": lambda: rerank.get_config().task,
}
LABELS = ["a", "b", "c"]


# ---- The tiny config, from the registry alone ---------------------------------------

def _default(field: dataclasses.Field):
  return None if field.default is dataclasses.MISSING else field.default


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def tiny_config(family, sizes: dict | None = None, **overrides):
  """`family.config` at `sizes` (TINY's by default; those its dataclass has), float32,
  and by generic rules: key / value heads half the query heads where the dataclass
  has the field (grouped-query attention); every other `*_size` wider than the hidden
  size at half of it (ELECTRA's embedding, UltraBERT's prediction head); every
  `*_token_id` outside the vocabulary inside it (0 for the padding); and every windowed
  layer narrowed to a half-width of at most 2 WINDOW by the one int field that moves
  `config.windows` (ModernBERT's local_attention, UltraBERT's sliding_window)."""
  sizes = {**TINY, **(sizes or {})}
  fields = {f.name: f for f in dataclasses.fields(family.config)}
  kw = {k: v for k, v in sizes.items() if k in fields}
  hidden, vocab = kw["hidden_size"], kw["vocab_size"]
  if "num_kv_heads" in fields:
    kw["num_kv_heads"] = kw["num_heads"] // 2
  special = 1
  for name, field in fields.items():
    value = _default(field)
    if name in kw or not _is_int(value):
      continue
    if name.endswith("_size") and value > hidden:
      kw[name] = hidden // 2
    elif name.endswith("_token_id") and value >= vocab:
      kw[name] = 0 if name == "pad_token_id" else special
      special += name != "pad_token_id"
  kw.update(dtype=jnp.float32, param_dtype=jnp.float32, **overrides)
  config = family.config(**kw)
  if all(w is None for w in config.windows):
    return config
  for name, field in fields.items():
    if name in kw or not _is_int(_default(field)):
      continue
    for value in (2 * WINDOW, WINDOW):
      try:
        narrowed = dataclasses.replace(config, **{name: value})
      except (ConfigError, ValueError, TypeError):
        continue
      windows = [w for w in narrowed.windows if w is not None]
      if narrowed.windows != config.windows and windows and max(windows) <= 2 * WINDOW:
        return narrowed
  return config


# ---- The family's fixture: one config, one set of parameters, rows -----------------

def _rows(docs, config):
  """[B, T] ids, mask, token_type_ids, segment_ids and position_ids of rows packed
  with `docs` (each row a list of documents' ids, right-padded): each document's
  second half of token type 1 (where the family embeds two), positions from 0 in each
  document, as the data pipeline gives them, past the family's `position_offset`."""
  ids = np.full((len(docs), T), config.pad_token_id, np.int32)
  types, seg, pos = (np.zeros((len(docs), T), np.int32) for _ in range(3))
  for r, row in enumerate(docs):
    at = 0
    for k, doc in enumerate(row):
      n = len(doc)
      ids[r, at:at + n], seg[r, at:at + n], pos[r, at:at + n] = doc, k + 1, np.arange(n)
      types[r, at + n // 2:at + n] = int(config.type_vocab_size > 1)
      at += n
  return ids, (seg > 0).astype(np.int32), types, seg, pos + config.position_offset


def _tokens(rng, n, config):
  """n random ids of the vocabulary, never the padding id (nor ids 0-3: specials)."""
  ids = rng.integers(4, config.vocab_size, n).astype(np.int32)
  return np.where(ids == config.pad_token_id, 4, ids)


def _drawn(shapes, seed: int):
  """Parameters of `shapes` (a tree of `jax.ShapeDtypeStruct`: what an initialisation
  gives, traced, never compiled: drawing the initialisers compiles for seconds), drawn
  in numpy: NOISE x a standard normal, and 1 + that for every norm's 'scale'. Random
  init leaves norms at 1 and biases at 0, which would hide a swapped or dropped one;
  NOISE peaks the attention, where positions matter. (How each family initialises:
  its own tests.)"""
  rng = np.random.default_rng(seed)

  def draw(path, x):
    w = NOISE * rng.standard_normal(x.shape).astype(np.float32)
    return w + 1.0 if getattr(path[-1], "key", None) == "scale" else w

  return jax.tree_util.tree_map_with_path(draw, shapes)


class _Tokenizer(types.SimpleNamespace):
  """The special ids a table writes into config.json, as a tokenizer gives them."""


def _tokenizer(config):
  specials = [i for i in range(1, 8) if i != config.pad_token_id]
  return _Tokenizer(pad_id=config.pad_token_id, cls_id=specials[0], sep_id=specials[1],
                    mask_id=specials[2], unk_id=specials[3], bos_id=specials[0],
                    eos_id=specials[1])


KIND = "wordpiece"  # The tokenizer kind export is told (BERT: model_type 'bert').


def _forward(module, ids, mask, token_type_ids, segment_ids, position_ids):
  """A PreTraining's every layer's hidden states [L+1, B, T, E] and MLM logits at
  every position [B, T, V], float32."""
  out = module.encoder(ids, mask, token_type_ids, position_ids, segment_ids,
                       output_hidden_states=True)
  return (out["hidden_states"].astype(jnp.float32),
          module.mlm(out, module.encoder).astype(jnp.float32))


@dataclasses.dataclass
class Tiny:
  """A family's tiny model and rows, shared by every check (module docstring)."""

  name: str
  family: object
  table: object
  config: object
  boxed: dict  # `init_params`' abstract output: ShapeDtypeStructs in nn.Partitioned
  params: dict  # float32 numpy, unscanned: the pretraining model of `config`
  # Each [B, T] ids, mask, token_type_ids, segment_ids, position_ids (`_rows`; the
  # model is given all five: one program per config serves every set of rows).
  padded: tuple  # one document of LENGTHS a row
  alone: tuple  # each of DOCS alone in a row
  packed: tuple  # DOCS packed as PACKING says
  spans: list  # (row, slice, doc) of every packed document
  _applies: dict = dataclasses.field(default_factory=dict)
  _outputs: dict = dataclasses.field(default_factory=dict)

  def variant(self, **overrides):
    return dataclasses.replace(self.config, **overrides)

  def apply(self, config, params, *rows):
    """(hidden states, logits) float32 numpy of `config`'s model on rows; one jitted
    function per config (rows of one shape: it compiles once)."""
    key = repr(config)
    if key not in self._applies:
      model = self.family.pretraining(config)
      self._applies[key] = jax.jit(lambda p, *a: model.apply({"params": p}, *a,
                                                             method=_forward))
    return tuple(np.asarray(x) for x in self._applies[key](params, *rows))

  def outputs(self, dtype: str, rows: str):
    """The unscanned model's outputs in 'float32' / 'bfloat16' on 'padded', 'alone'
    or 'packed' rows, computed once."""
    if (dtype, rows) not in self._outputs:
      config = self.variant(dtype=jnp.dtype(dtype).type)
      self._outputs[dtype, rows] = self.apply(config, self.params, *getattr(self, rows))
    return self._outputs[dtype, rows]


def _tiny(name: str) -> Tiny:
  family = FAMILIES[name]
  table = convert.family_table(name)
  config = tiny_config(family)
  boxed = jax.eval_shape(family.pretraining(config).init_params, jax.random.key(0))
  params = _drawn(nn.unbox(boxed), 1)
  rng = np.random.default_rng(2)
  padded = _rows([[_tokens(rng, n, config)] for n in LENGTHS], config)
  docs = [_tokens(rng, n, config) for n in DOCS]
  alone = _rows([[doc] for doc in docs], config)
  packed = _rows([[docs[d] for d in order] for order in PACKING], config)
  spans = []
  for r, order in enumerate(PACKING):
    starts = np.cumsum((0,) + tuple(DOCS[d] for d in order))
    spans += [(r, slice(starts[k], starts[k + 1]), d) for k, d in enumerate(order)]
  return Tiny(name, family, table, config, boxed, params, padded, alone, packed, spans)


_TINY: dict[str, Tiny] = {}


@pytest.fixture(scope="session", params=NAMES)
def tiny(request) -> Tiny:
  if request.param not in _TINY:
    _TINY[request.param] = _tiny(request.param)
  return _TINY[request.param]


def _relative_max(ours, ref) -> float:
  """max |ours - ref| / max |ref|."""
  return float(np.abs(np.asarray(ours) - ref).max() / np.abs(ref).max())


def _relative_norm(ours, ref) -> float:
  """||ours - ref|| / ||ref||."""
  return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


# ---- Hugging Face --------------------------------------------------------------

def _tied(model) -> dict[str, str]:
  """{key: the key it shares its tensor with} of a transformers model's state dict
  (the MLM decoder tied to the embedding, its bias to the head's)."""
  first, tied = {}, {}
  for k, v in model.state_dict(keep_vars=True).items():
    tied[k] = first.setdefault(v.data_ptr(), k)
  return {k: v for k, v in tied.items() if k != v}


def _hf_model(hf_json: dict, state: dict):
  """The transformers class `hf_json` names (architectures[0]), built from it (eager
  attention), `state` loaded into it (a bare model's keys without the base model's
  prefix, as `from_pretrained` reads them): every key of the model but those tied to
  another (which a tied export may leave out), every shape, no key more; eval mode."""
  hf_json = dict(hf_json)
  config = transformers.AutoConfig.for_model(hf_json.pop("model_type"), **hf_json)
  config._attn_implementation = "eager"  # pylint: disable=protected-access
  model = getattr(transformers, hf_json["architectures"][0])(config)
  tied = _tied(model)
  prefix = f"{model.base_model_prefix}."
  if not hasattr(model, model.base_model_prefix) and all(k.startswith(prefix) for k in state):
    state = {k[len(prefix):]: v for k, v in state.items()}  # A bare model, as from_pretrained
  missing, unexpected = model.load_state_dict(
      {k: torch.from_numpy(np.array(v)) for k, v in state.items()}, strict=False)
  assert not unexpected, unexpected
  assert all(k in tied and tied[k] in state for k in missing), (missing, tied)
  return model.eval()


def _hf_run(model, ids, mask, types=None, **kw):
  """The transformers model on [B, T] (or [B, C, T]) ids and mask, and the token types
  where the family embeds them (`types` None: none given)."""
  if types is not None:
    kw["token_type_ids"] = torch.as_tensor(np.asarray(types), dtype=torch.long)
  with torch.no_grad():
    return model(torch.as_tensor(np.asarray(ids), dtype=torch.long),
                 attention_mask=torch.as_tensor(np.asarray(mask), dtype=torch.long), **kw)


def _exported(tiny: Tiny):
  """(config, params, (config.json, state dict), transformers model) of the model
  transformers pretrains `tiny.config` with (the table's `pretraining_model`: its class
  and heads), holding the tiny params; made once."""
  if "exported" not in tiny._outputs:  # pylint: disable=protected-access
    _, config = tiny.table.pretraining_model(tiny.config)
    heads = set(tiny.family.config_heads(config))
    params = {k: v for k, v in tiny.params.items() if k == "encoder" or k in heads}
    if not config.pooler:
      params["encoder"] = {k: v for k, v in params["encoder"].items() if k != "pooler"}
    hf_json, state = tiny.table.export_pretrained(params, config, _tokenizer(config), KIND)
    tiny._outputs["exported"] = (  # pylint: disable=protected-access
        config, params, (hf_json, state), _hf_model(hf_json, state))
  return tiny._outputs["exported"]  # pylint: disable=protected-access


# ---- 0. The registry ---------------------------------------------------------------

def test_every_family_has_a_table_and_every_table_a_family():
  """Each registered family converts through exactly one table of TABLES and each
  table converts a registered family: the Hugging Face checks run for every family."""
  tables = [t.FAMILY for t in convert.TABLES]
  assert sorted(tables) == NAMES, (tables, NAMES)


def test_tiny_configs_are_tiny_and_their_windows_inside_the_rows(tiny):
  """The generic shrink reached every size (no int field of the config above the tiny
  context, TINY's max_position_embeddings: a full-size vocabulary, width or token id
  left over), and a windowed family's windowed layers see part of each row only."""
  for name, value in dataclasses.asdict(tiny.config).items():
    if _is_int(value):
      assert value <= TINY["max_position_embeddings"], (name, value)
  windows = [w for w in tiny.config.windows if w is not None]
  assert not windows or max(windows) <= 2 * WINDOW < min(LENGTHS), tiny.config.windows


# ---- 1. Initialisation -------------------------------------------------------------

@pytest.mark.parametrize("scan", [False, True], ids=["unscanned", "scanned"])
def test_init_has_logical_axes_and_the_tables_shapes(tiny, scan):
  """Every parameter of `init_params` is boxed with one logical axis name per
  dimension (None: replicated, e.g. a fused q|k|v axis; at least one named; scanned:
  the stacked blocks' 'layers' first), its shapes are the
  unscanned init's in that layout, `check_shapes` takes them, and the exported state
  dict holds exactly the keys and shapes of the transformers class the table names
  (`hf.state_dict()`, the tied decoder's copy included)."""
  boxed = tiny.boxed if not scan else jax.eval_shape(
      tiny.family.pretraining(tiny.variant(scan_layers=True)).init_params, jax.random.key(0))
  leaves = jax.tree_util.tree_leaves_with_path(
      boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  for path, leaf in leaves:
    name = jax.tree_util.keystr(path)
    assert isinstance(leaf, nn.Partitioned), f"{name} has no logical axis names"
    assert len(leaf.names) == leaf.value.ndim, (name, leaf.names, leaf.value.shape)
    assert all(n is None or isinstance(n, str) for n in leaf.names), (name, leaf.names)
    assert any(isinstance(n, str) for n in leaf.names) or not leaf.names, (name, leaf.names)
    if "'layers'" in name.split("]")[1]:
      assert leaf.names[0] == "layers", (name, leaf.names)
  shapes = jax.tree.map(lambda x: x.shape, nn.unbox(boxed))
  expected = jax.tree.map(np.shape, tiny.family.to_layout(tiny.params, scan))
  assert shapes == expected
  engine.check_shapes(tiny.params, tiny.config)
  if scan:
    return
  _, _, (_, state), hf = _exported(tiny)
  tied = _tied(hf)
  theirs = {k: tuple(v.shape) for k, v in hf.state_dict().items()
            if k in state or tied.get(k) not in state}
  assert {k: v.shape for k, v in state.items()} == theirs


# ---- 2. Layouts --------------------------------------------------------------------

def test_layouts_are_exact_and_scan_gives_the_same_outputs(tiny):
  """`to_layout` scanned and back is the identity (exact), and the scan_layers model
  on the scanned parameters gives the unscanned model's hidden states (every layer)
  and MLM logits, on padded and on packed rows (float32, within PACKED_ATOL of the
  largest magnitude)."""
  scanned = tiny.family.to_layout(tiny.params, True)
  assert "layers" in scanned["encoder"]
  back = tiny.family.to_layout(scanned, False)
  assert jax.tree.structure(back) == jax.tree.structure(tiny.params)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(tiny.params)):
    np.testing.assert_array_equal(a, b)
  assert tiny.family.to_layout(scanned, True) is scanned
  worst = 0.0
  for rows in ("padded", "packed"):
    real = getattr(tiny, rows)[1].astype(bool)
    ours = tiny.apply(tiny.variant(scan_layers=True), scanned, *getattr(tiny, rows))
    ref = tiny.outputs("float32", rows)
    worst = max(worst, _relative_max(ours[0][:, real], ref[0][:, real]),
                _relative_max(ours[1][real], ref[1][real]))
  print(f"{tiny.name} scanned vs unscanned: {worst:.1e}")
  assert worst < PACKED_ATOL


# ---- 3. Hugging Face ---------------------------------------------------------------

def test_hf_round_trip_is_exact_and_transformers_gives_the_logits(tiny):
  """params -> the table's state dict -> params and the state dict back are exact
  (from either layout; and the encoder alone, the bare class), the config.json reads
  back as the config; transformers' class of `pretraining_model` with that state
  dict gives bertjax's hidden states (every layer's; the bare class too) and MLM logits in float32 on the padded rows and on the packed rows'
  documents alone (within ATOL of the largest magnitude, real positions). bertjax is
  given the rows' segment_ids and position_ids (one program for every check);
  without them (the defaults), each task head's check below compares it."""
  config, params, (hf_json, state), hf = _exported(tiny)
  back_config, back, task = tiny.table.load(hf_json, state)
  assert task is None
  assert jax.tree.structure(back) == jax.tree.structure(params)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(back), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
  assert back_config == config, [(f.name, getattr(back_config, f.name), getattr(config, f.name))
                                 for f in dataclasses.fields(config)
                                 if getattr(back_config, f.name) != getattr(config, f.name)]
  again_json, again = tiny.table.export_pretrained(back, back_config, _tokenizer(config), KIND)
  assert again_json == hf_json and again.keys() == state.keys()
  scanned = tiny.table.export_pretrained(tiny.family.to_layout(params, True), config,
                                         _tokenizer(config), KIND)[1]
  bare_json, bare = tiny.table.export_pretrained({"encoder": params["encoder"]}, config,
                                                 _tokenizer(config), KIND)
  bare_back = tiny.table.load(bare_json, bare)[1]
  assert jax.tree.structure(bare_back) == jax.tree.structure({"encoder": params["encoder"]})
  for a, b in zip(jax.tree.leaves(bare_back), jax.tree.leaves(params["encoder"])):
    np.testing.assert_array_equal(a, b)
  for k in state:
    np.testing.assert_array_equal(again[k], state[k], err_msg=k)
    np.testing.assert_array_equal(scanned[k], state[k], err_msg=f"{k} (scanned layout)")
  worst = {"hidden": 0.0, "logits": 0.0, "bare": 0.0}
  bare_hf = _hf_model(bare_json, bare)
  for rows in ("padded", "alone"):  # `alone`: the packed rows' documents
    ids, mask, types, _, _ = getattr(tiny, rows)
    out = _hf_run(hf, ids, mask, types if config.type_vocab_size else None,
                  output_hidden_states=True)
    theirs = (out.logits if "logits" in out else out.prediction_logits).numpy()
    hidden, logits = tiny.apply(config, params, *getattr(tiny, rows))
    real = mask.astype(bool)
    assert len(out.hidden_states) == len(hidden), (len(out.hidden_states), len(hidden))
    worst["hidden"] = max([worst["hidden"]] + [
        _relative_max(ours[real], h.numpy()[real]) for ours, h in zip(hidden, out.hidden_states)])
    worst["logits"] = max(worst["logits"], _relative_max(logits[real], theirs[real]))
    out = _hf_run(bare_hf, ids, mask, types if config.type_vocab_size else None,
                  output_hidden_states=True)
    assert len(out.hidden_states) == len(hidden), (len(out.hidden_states), len(hidden))
    worst["bare"] = max([worst["bare"]] + [
        _relative_max(ours[real], h.numpy()[real]) for ours, h in zip(hidden, out.hidden_states)])
  print(f"{tiny.name} {hf_json['architectures'][0]}: hidden states {worst['hidden']:.1e}, "
        f"MLM logits {worst['logits']:.1e}; {bare_json['architectures'][0]}: hidden states "
        f"{worst['bare']:.1e}")
  assert max(worst.values()) < ATOL


def test_save_pretrained_reads_back_and_the_export_loads_from_disk(tiny, tmp_path):
  """The transformers model of `pretraining_model` (check 3's) saved by
  `save_pretrained` (its names on disk: UltraBERT's 'ultrabert.' / 'cls.', GTE's
  published layout; a tied decoder left out) reads back through `convert.load_hf` as
  the config and the parameters exactly; bertjax's export of them (from the scanned
  layout) written by `files.write` loads with `AutoModelForMaskedLM.from_pretrained`
  (the class config.json's model_type maps to) missing no key, and gives the saved
  model's MLM logits on the padded rows (within ATOL of the largest magnitude)."""
  config, params, _, hf = _exported(tiny)
  hf.save_pretrained(str(tmp_path / "hf"))
  back_config, back = convert.load_hf(str(tmp_path / "hf"))
  assert back_config == config
  assert jax.tree.structure(back) == jax.tree.structure(params)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(back), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
  hf_json, state = tiny.table.export_pretrained(tiny.family.to_layout(back, True), config,
                                                _tokenizer(config), KIND)
  files.write(str(tmp_path / "out"), hf_json, state)
  loaded, info = transformers.AutoModelForMaskedLM.from_pretrained(
      str(tmp_path / "out"), attn_implementation="eager", output_loading_info=True)
  assert not info["missing_keys"], info["missing_keys"]
  ids, mask, types, _, _ = tiny.padded
  types = types if config.type_vocab_size else None
  ref, out = _hf_run(hf, ids, mask, types), _hf_run(loaded.eval(), ids, mask, types)
  ref = (ref.logits if "logits" in ref else ref.prediction_logits).numpy()
  real = mask.astype(bool)
  diff = _relative_max(out.logits.numpy()[real], ref[real])
  print(f"{tiny.name} {type(loaded).__name__} from disk: {diff:.1e}")
  assert diff < ATOL


# ---- 4. FLOPs ------------------------------------------------------------------

def test_train_flops_agree_with_xla(tiny):
  """`family.train_flops` of one step against XLA's count of the gradient of a loss
  reading every pretraining head's logits (forward + backward, lowered at FLOPS'
  sizes with the XLA attention path, never compiled), within FLOPS_RTOL. The XLA path
  scores every pair of a windowed layer and masks it: the pairs it masks,
  12 B E (T^2 - pairs) FLOPs each layer, are added to the family's count; off the
  CPU so is the absolute position table's one-hot matmul, 4 B T rows E."""
  config = tiny_config(tiny.family, FLOPS, attention_impl="xla")
  model = tiny.family.pretraining(config)
  params = jax.eval_shape(lambda: nn.unbox(model.init_params(jax.random.key(0))))
  ids = jax.ShapeDtypeStruct((FLOPS_B, FLOPS_T), jnp.int32)
  positions = jax.ShapeDtypeStruct((FLOPS_B, FLOPS_P), jnp.int32)

  def loss(p, ids, positions):
    out = model.apply({"params": p}, ids, masked_lm_positions=positions)
    return sum(jnp.sum(v) for v in out.values())

  xla = jax.jit(jax.grad(loss)).lower(params, ids, positions).cost_analysis()["flops"]
  ours = tiny.family.train_flops(config, FLOPS_B, FLOPS_T, FLOPS_P)
  masked = sum(FLOPS_T ** 2 - stack.attention_pairs(FLOPS_T, w) for w in config.windows)
  expected = ours["total"] + 12.0 * FLOPS_B * config.hidden_size * masked
  if jax.default_backend() != "cpu":  # Off the CPU absolute positions are a one-hot
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):  # matmul (layers.Embed)
      rows = leaf.shape[0]
      if ("position_embeddings" in jax.tree_util.keystr(path)
          and rows <= layers.POSITION_ONE_HOT_ROWS):
        expected += 4.0 * FLOPS_B * FLOPS_T * rows * leaf.shape[1]
  print(f"{tiny.name} FLOPs: XLA {xla:.4g}, train_flops {expected:.4g} "
        f"({xla / expected - 1:+.2%})")
  assert abs(xla - expected) / expected < FLOPS_RTOL


# ---- 5. bfloat16 -------------------------------------------------------------------

def _bf16_errors(ours, ref, real) -> tuple[float, float]:
  """(the worst layer's, the logits') relative error over the real positions."""
  hidden = max(_relative_norm(ours[0][k][real], ref[0][k][real]) for k in range(len(ref[0])))
  return hidden, _relative_norm(ours[1][real], ref[1][real])


def test_bf16_is_float32_within_bf16_rounding(tiny):
  """bfloat16 activations (float32 weights) against float32 on the padded rows:
  every layer's hidden states and the MLM logits within BF16_BOUND, and above 1e-4
  (really bfloat16)."""
  real = tiny.padded[1].astype(bool)
  errors = _bf16_errors(tiny.outputs("bfloat16", "padded"),
                        tiny.outputs("float32", "padded"), real)
  print(f"{tiny.name} bf16 padded: hidden {errors[0]:.4f}, logits {errors[1]:.4f}")
  for err in errors:
    assert 1e-4 < err < BF16_BOUND, errors


# ---- 6. Packed rows ----------------------------------------------------------------

def _documents(tiny: Tiny, outputs):
  """[L+1, n, E] hidden states and [n, V] logits of each packed document of `outputs`
  (on the packed rows), in `tiny.spans` order."""
  hidden, logits = outputs
  return [(hidden[:, r, s], logits[r, s]) for r, s, _ in tiny.spans]


def test_packed_rows_are_each_document_alone(tiny):
  """Each document of a packed row (`segment_ids`; positions restarting at 0 in each,
  as the data pipeline gives them) has, in float32, the hidden states of every layer
  and the MLM logits it has alone in a row (within PACKED_ATOL of the largest
  magnitude); in bfloat16 it stays within BF16_BOUND of itself alone in float32."""
  ref_hidden, ref_logits = tiny.outputs("float32", "alone")
  worst = {"float32": 0.0, "bfloat16": 0.0}
  for dtype in worst:
    docs = _documents(tiny, tiny.outputs(dtype, "packed"))
    for (hidden, logits), (_, _, d) in zip(docs, tiny.spans):
      n = DOCS[d]
      ref = (ref_hidden[:, d, :n], ref_logits[d, :n])
      if dtype == "float32":
        err = max(_relative_max(hidden, ref[0]), _relative_max(logits, ref[1]))
      else:
        err = max(_bf16_errors((hidden[:, None], logits[None]),
                               (ref[0][:, None], ref[1][None]), np.ones((1, n), bool)))
      worst[dtype] = max(worst[dtype], err)
  print(f"{tiny.name} packed vs alone: float32 {worst['float32']:.1e}, "
        f"bfloat16 {worst['bfloat16']:.4f}")
  assert worst["float32"] < PACKED_ATOL
  assert 1e-4 < worst["bfloat16"] < BF16_BOUND


# ---- 7. Checkpoints ----------------------------------------------------------------

def _adamw_step(state: dict) -> dict:
  """One AdamW update (numpy, float32: no program to compile) of a train state
  {'step', 'params', 'opt_state': {'mu', 'nu'}}, the gradient a fixed function of the
  parameters (the family's part of a checkpoint is its tree)."""
  lr, b1, b2, eps, decay = 1e-3, 0.9, 0.999, 1e-8, 0.01
  count = int(state["step"]) + 1
  f = lambda x: np.float32(x)  # noqa: E731
  new = {"step": np.int32(count), "params": {}, "opt_state": {"mu": {}, "nu": {}}}
  leaves = [jax.tree.leaves(state[k]) for k in ("params",)] + [
      jax.tree.leaves(state["opt_state"][k]) for k in ("mu", "nu")]
  out = [[], [], []]
  for p, mu, nu in zip(*leaves):
    p, mu, nu = (np.asarray(x, np.float32) for x in (p, mu, nu))
    g = np.cos(p * f(count))
    mu, nu = f(b1) * mu + f(1 - b1) * g, f(b2) * nu + f(1 - b2) * g * g
    update = (mu / f(1 - b1 ** count)) / (np.sqrt(nu / f(1 - b2 ** count)) + f(eps))
    for o, x in zip(out, (p - f(lr) * (update + f(decay) * p), mu, nu)):
      o.append(x)
  tree = jax.tree.structure(state["params"])
  new["params"] = jax.tree.unflatten(tree, out[0])
  new["opt_state"] = {"mu": jax.tree.unflatten(tree, out[1]),
                      "nu": jax.tree.unflatten(tree, out[2])}
  return new


def test_checkpoint_restores_bit_for_bit_and_resumes(tiny, tmp_path):
  """A train state of the family's parameters (params, AdamW's moments, step) after
  one update, saved by bertjax's `Checkpointer` and restored onto the same
  shardings, is the state bit for bit (values and dtypes), and the next update from
  it is the next update from the state kept."""
  zeros = jax.tree.map(np.zeros_like, tiny.params)
  state = jax.device_put(_adamw_step({"step": np.int32(0), "params": tiny.params,
                                      "opt_state": {"mu": zeros, "nu": zeros}}))
  ckpt = ckpt_lib.Checkpointer(str(tmp_path))
  ckpt.save(1, state, None, force=True)
  ckpt.wait()
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        state)
  restored = ckpt.restore(1, target)
  ckpt.close()
  assert jax.tree.structure(restored) == jax.tree.structure(state)
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
    assert a.dtype == b.dtype and a.sharding == b.sharding
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for a, b in zip(jax.tree.leaves(_adamw_step(restored)), jax.tree.leaves(_adamw_step(state))):
    np.testing.assert_array_equal(a, b)


# ---- 7b. Sparse retrievers ---------------------------------------------------------

def test_splade_vectors_pool_the_families_mlm_logits(tiny):
  """The family's SPLADE model (`sparse.SpladeModel`, its MLM head a chunk of 64 tokens
  at a time in a scan) on the pretraining model's encoder and MLM head gives
  sentence-transformers' SpladePooling of that model's MLM logits (check 3 holds those
  logits to transformers'; tests/test_sparse.py the pooling to sentence-transformers')."""
  from bertjax.tasks import sparse  # pylint: disable=g-import-not-at-top
  if "mlm" not in tiny.params:
    pytest.skip(f"{tiny.name}'s pretraining model has no MLM head")
  ids, mask = tiny.padded[:2]
  params = {k: tiny.params[k] for k in ("encoder", "mlm")}
  model = tiny.family.pretraining(tiny.config, ("mlm",))
  logits = jax.jit(model.apply)({"params": params}, ids, mask)["mlm_logits"]
  want = sparse.pool(sparse.splade_weights(logits, mask, "relu"), "max")
  got = jax.jit(sparse.SpladeModel(tiny.config, chunk_size=64).apply)(
      {"params": params}, ids, mask)
  diff = _relative_max(np.asarray(got), np.asarray(want))
  print(f"{tiny.name} SPLADE vectors, chunked: {diff:.1e}")
  assert diff < ATOL and np.count_nonzero(got) == np.count_nonzero(want)


# ---- 8. Fine-tuning heads ----------------------------------------------------------

def test_task_configs_cover_every_task():
  """TASK_CONFIGS names a config for every task of the registry: a task added to
  bertjax.tasks.TASKS is tested for every family below."""
  assert set(tasks_lib.TASKS) <= set(TASK_CONFIGS), sorted(set(tasks_lib.TASKS) - set(TASK_CONFIGS))


def _task(name: str):
  task_cfg = TASK_CONFIGS[name]()
  if name == "tagging_features":
    task_cfg.tagger = "linear"  # The frozen features are the family's; one compile less.
  task = tasks_lib.get_task(task_cfg.name)(task_cfg, None, T)
  if task.name in ("classification", "tagging", "span_ner"):
    task.labels = LABELS
  return task


def _task_batch(name: str, tiny: Tiny) -> dict:
  """The padded rows' ids, mask and token types, no segment_ids or position_ids (the
  encoder's defaults, as fine-tuning's unpacked batches), [B, T]; multiple choice: one question
  of B choices, [1, B, T]; rerank: one group of B (query, document) pairs, [1, B, T];
  for span NER, two spans a row."""
  ids, mask, types, _, _ = tiny.padded
  batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
  if name in ("multiple_choice", "rerank"):
    return {k: v[None] for k, v in batch.items()}
  if name == "span_ner":
    batch["span_start"] = np.array([[0, 5]] * B, np.int32)
    batch["span_end"] = np.array([[3, 9]] * B, np.int32)
  return batch


class _Heads(nn.Module):
  """Every task's head over one pass of the family's encoder, fed as
  `base.FinetuneModel` feeds each (the encoder's output with the rows'
  'attention_mask'; every layer's states for the feature-based head; multiple choice's
  [1, C, T] rows flattened to the encoder's [C, T]): params 'encoder' (the pretraining
  model's) and one tree per task."""

  config: object
  tasks: dict

  def setup(self):
    self.encoder = FAMILIES[self.config.family].encoder(self.config)
    for name, task in self.tasks.items():
      setattr(self, name, task.head(self.config))

  def __call__(self, batches: dict, out=None) -> dict:
    """batches: {task: its batch}; `out` (at initialisation): the encoder's output."""
    rows = batches["classification"]
    if out is None:
      out = self.encoder(rows["input_ids"], rows["attention_mask"], rows["token_type_ids"],
                         output_hidden_states=True)
      out = dict(out, attention_mask=rows["attention_mask"])
    result = {}
    for name in self.tasks:
      head_out = jax.lax.stop_gradient(out) if self.tasks[name].feature_based else out
      result[name] = getattr(self, name)(head_out, batches[name], True)
    return result


@pytest.fixture(scope="session")
def heads(tiny):
  """{task: (task, batch, params, outputs)}: every task's head on the family's tiny
  encoder (its params: the pretraining model's 'encoder'; each head's `_drawn` at the
  shapes its initialisation gives on the encoder's output), applied in one jitted
  program."""
  if "heads" not in tiny._outputs:  # pylint: disable=protected-access
    names = list(TASK_CONFIGS)
    made = {n: _task(n) for n in names}
    model = _Heads(tiny.config, made)
    batches = {n: _task_batch(n, tiny) for n in names}
    rows = batches["classification"]
    out = jax.eval_shape(lambda p: dict(tiny.family.encoder(tiny.config).apply(
        {"params": p}, rows["input_ids"], rows["attention_mask"], rows["token_type_ids"],
        output_hidden_states=True), attention_mask=rows["attention_mask"]),
                         tiny.params["encoder"])
    drawn = _drawn(jax.eval_shape(lambda key, b, o: nn.unbox(model.init(key, b, o)["params"]),
                                  jax.random.key(4), batches, out), 5)
    params = {"encoder": tiny.params["encoder"], **{n: drawn[n] for n in names}}
    outputs = jax.device_get(jax.jit(lambda p, b: model.apply({"params": p}, b))(
        params, batches))
    tiny._outputs["heads"] = {  # pylint: disable=protected-access
        n: (made[n], batches[n], {"encoder": params["encoder"], "head": params[n]},
            outputs[n]) for n in names}
  return tiny._outputs["heads"]  # pylint: disable=protected-access


def _logits(task, outputs) -> np.ndarray:
  if task.name == "squad":
    return np.stack([outputs["start_logits"], outputs["end_logits"]], -1)
  return np.asarray(outputs["logits"])


@pytest.mark.parametrize("name", list(TASK_CONFIGS))
def test_task_head_runs_and_exports_to_transformers(tiny, heads, name):
  """The task's head builds on the family's encoder and gives finite outputs of its
  shape; where the table's TASK_CLASSES has the task, the exported *For<Task>
  (`export_finetuned`, from either layout: the same state dict) names its labels and
  in transformers gives the same
  outputs on the same rows (real positions; within ATOL of the largest magnitude)."""
  task, batch, params, outputs = heads[name]
  ours = _logits(task, outputs)
  rows = {"multiple_choice": (1, B), "squad": (B, T, 2), "span_ner": (B, 2, 3),
          "tagging": (B, T, 3), "tagging_features": (B, T, 3), "classification": (B, 3),
          "rerank": (1, B, 1)}
  assert ours.shape == rows[name] and np.isfinite(ours).all(), ours.shape
  if task.feature_based or task.name not in tiny.table.TASK_CLASSES:
    return
  done = finetuned_lib.Finetuned(config=None, task=task, model=tiny.config,
                                 params=params, tokenizer=_tokenizer(tiny.config))
  hf_json, state = tiny.table.export_finetuned(done, KIND)
  if task.name in ("classification", "tagging"):
    assert hf_json["id2label"] == dict(enumerate(LABELS)) or hf_json["id2label"] == {
        str(i): label for i, label in enumerate(LABELS)}, hf_json.get("id2label")
  scanned = tiny.table.export_finetuned(dataclasses.replace(
      done, params=tiny.family.to_layout(params, True)), KIND)[1]
  assert scanned.keys() == state.keys()
  for k in state:
    np.testing.assert_array_equal(scanned[k], state[k], err_msg=k)
  out = _hf_run(_hf_model(hf_json, state), batch["input_ids"], batch["attention_mask"],
                batch["token_type_ids"] if tiny.config.type_vocab_size else None)
  theirs = (np.stack([out.start_logits.numpy(), out.end_logits.numpy()], -1)
            if task.name == "squad" else out.logits.numpy())
  if task.name in ("tagging", "squad"):  # per token: the real ones
    real = batch["attention_mask"].astype(bool)
    ours, theirs = ours[real], theirs[real]
  diff = _relative_max(ours, theirs)
  print(f"{tiny.name} {hf_json['architectures'][0]}: {diff:.1e}")
  assert diff < ATOL
