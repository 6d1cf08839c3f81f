"""DeBERTa computes what transformers computes (float32, weights copied through
`bertjax.hf.deberta`): DebertaV2Model's hidden states and DebertaV2ForMaskedLM's
logits, and DebertaV2ForSequenceClassification / ForTokenClassification /
ForQuestionAnswering / ForMultipleChoice through bertjax's task heads, on padded rows
and on packed rows (each document against transformers on that document alone),
scanned and unscanned, for each variant of tests/deberta_helpers.py (v3: log buckets,
shared keys, normed relative embeddings; v2: absolute positions, token types, clipped
relative positions, own position projections, a narrower embedding; c2p alone);
gradients of every parameter on padded rows; full-size parameter counts equal Hugging
Face's (eval_shape / meta device: no memory).

    python -m pytest -s -n 0 tests/test_deberta_numerics.py  # prints the max |diff| per class
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.errors import ConfigError
from bertjax.hf import deberta as conv
from bertjax.model import deberta as db
from bertjax.tasks import base
from bertjax.tasks.classification import ClassifierHead
from bertjax.tasks.multiple_choice import ChoiceHead
from bertjax.tasks.squad import SpanHead
from bertjax.tasks.tagging import TaggingHead
from tests.deberta_helpers import (HF_VOCAB, VARIANTS, config_json, hf_config, hf_model,
                                   state)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 1e-5
T = 30  # Beyond the v3 variant's 4 exact buckets and the v2 variant's clip at 8.
DOCS = (12, 10, 6)  # A packed row's documents (+ 2 padding tokens: T).


def _ids(rng, shape):
  return rng.integers(4, HF_VOCAB, shape).astype(np.int32)


def _padded(seed):
  """ids, mask, token types [3, T]: one full row, the others padded."""
  rng = np.random.default_rng(seed)
  lengths = np.array([T, 17, 9])
  mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
  types = ((np.arange(T)[None] >= lengths[:, None] // 2) & (mask > 0)).astype(np.int32)
  return np.where(mask > 0, _ids(rng, (3, T)), 0), mask, types


def _packed(seed):
  """One packed row: ids, segment ids [1, T], and its documents' slices."""
  rng = np.random.default_rng(seed)
  ids, seg, spans, at = np.zeros((1, T), np.int32), np.zeros((1, T), np.int32), [], 0
  for s, n in enumerate(DOCS):
    ids[0, at:at + n], seg[0, at:at + n] = _ids(rng, n), s + 1
    spans.append(slice(at, at + n))
    at += n
  return ids, seg, spans


def _config(cfg, scan):
  return db.DebertaConfig.from_config({**cfg.to_dict(), "scan_layers": scan})


def _hf(model, ids, mask=None, types=None, **kw):
  t = lambda x: None if x is None else torch.as_tensor(np.asarray(x), dtype=torch.long)  # noqa: E731
  with torch.no_grad():
    return model(t(ids), attention_mask=t(mask), token_type_ids=t(types), **kw)


# ---- The encoder and the MLM head ---------------------------------------------------

# The v3 variant (log buckets, shared keys, normed relative embeddings: DebertaConfig's
# defaults) is every family's tiny DeBERTa: tests/test_family_conformance.py.
@pytest.fixture(scope="module", params=[v for v in VARIANTS if v != "v3"])
def mlm(request):
  model = hf_model("DebertaV2ForMaskedLM", request.param)
  cfg, params, _ = conv.load(config_json(model), state(model))
  return request.param, model, cfg, params


def _ours(cfg, params, scan, **inputs):
  """Hidden states [L+1, B, T, E] and MLM logits of the pretraining model."""
  cfg = _config(cfg, scan)
  model = db.FAMILY.pretraining(cfg)
  params = db.FAMILY.to_layout(params, scan)
  hidden = model.apply({"params": params}, method=lambda m: m.encoder(
      inputs["input_ids"], inputs.get("attention_mask"), inputs.get("token_type_ids"),
      segment_ids=inputs.get("segment_ids"), output_hidden_states=True))["hidden_states"]
  logits = model.apply({"params": params}, **inputs)["mlm_logits"]
  return np.asarray(hidden), np.asarray(logits)


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True], ids=["unscanned", "scanned"])
def test_encoder_and_mlm_match_hf_padded_and_packed(mlm, scan):
  """Padded rows (token types too where the variant embeds them): every layer's hidden
  states (DebertaV2Model's, also loaded bare) and the logits; a packed row: each
  document's equal to the document alone (relative positions and the bias kept inside
  it, absolute positions restarting)."""
  variant, model, cfg, params = mlm
  ids, mask, types = _padded(0)
  hidden, logits = _ours(cfg, params, scan, input_ids=ids, attention_mask=mask,
                         token_type_ids=types)
  ref = _hf(model, ids, mask, types, output_hidden_states=True)
  real = mask.astype(bool)
  ref_hidden = np.stack([h.numpy() for h in ref.hidden_states])
  dh = np.abs(hidden - ref_hidden)[:, real].max()
  dl = np.abs(logits - ref.logits.numpy())[real].max()
  bare = {k.removeprefix("deberta."): v for k, v in state(model).items()
          if k.startswith("deberta.")}
  bare_params = conv.params_from_hf(bare, cfg)
  assert set(bare_params) == {"encoder"}
  bare_hidden, _ = _ours(cfg, {**params, **bare_params}, scan, input_ids=ids,
                         attention_mask=mask, token_type_ids=types)
  np.testing.assert_array_equal(bare_hidden, hidden)

  ids, seg, spans = _packed(1)
  hidden, logits = _ours(cfg, params, scan, input_ids=ids, attention_mask=(seg > 0) * 1,
                         segment_ids=seg)
  dph = dpl = 0.0
  for span in spans:
    ref = _hf(model, ids[:, span], output_hidden_states=True)
    ref_hidden = np.stack([h.numpy() for h in ref.hidden_states])
    dph = max(dph, np.abs(hidden[:, :, span] - ref_hidden).max())
    dpl = max(dpl, np.abs(logits[:, span] - ref.logits.numpy()).max())
  print(f"\n{variant} scan={scan}: DebertaV2Model hidden padded {dh:.1e} packed {dph:.1e}; "
        f"DebertaV2ForMaskedLM logits padded {dl:.1e} packed {dpl:.1e}")
  assert max(dh, dl, dph, dpl) < ATOL


def test_relative_offsets_are_transformers_relative_positions():
  """`relative_offsets` read at i - j is transformers' `build_relative_position` (log
  buckets or plain) shifted by the span and clipped, as its c2p gathers it, for
  v3-base's buckets at 512 and 2,048 tokens and for the variants'; `skew` puts row a's
  entry b - a + T - 1 at (a, b)."""
  from transformers.models.deberta_v2 import modeling_deberta_v2 as ref  # pylint: disable=g-import-not-at-top
  for length, buckets, max_position in ((512, 256, 512), (2048, 256, 512), (T, 8, 64),
                                        (T, -1, 8), (T, 16, 32)):
    x = torch.zeros(1, length, 1)
    rel = ref.build_relative_position(x, x, bucket_size=buckets,
                                      max_position=max_position)[0].numpy()
    span = buckets if buckets > 0 else max_position
    pos = np.arange(length)
    np.testing.assert_array_equal(
        db.relative_offsets(length, buckets, max_position)[
            pos[:, None] - pos[None, :] + length - 1],
        np.clip(rel + span, 0, 2 * span - 1))
  x = np.arange(2 * 5 * 9).reshape(2, 5, 9)
  want = np.stack([[[x[n, a, b - a + 4] for b in range(5)] for a in range(5)]
                   for n in range(2)])
  np.testing.assert_array_equal(np.asarray(db.skew(jnp.asarray(x))), want)


# ---- The fine-tuning classes --------------------------------------------------------

# Hugging Face class -> (bertjax head, task name, its outputs).
HEADS = {
    "DebertaV2ForSequenceClassification": (lambda c: ClassifierHead(c, 3), "classification"),
    "DebertaV2ForTokenClassification": (lambda c: TaggingHead(c, 3), "tagging"),
    "DebertaV2ForQuestionAnswering": (SpanHead, "squad"),
    "DebertaV2ForMultipleChoice": (ChoiceHead, "multiple_choice"),
}


def _outputs(out: dict) -> np.ndarray:
  if "start_logits" in out:
    return np.stack([np.asarray(out["start_logits"]), np.asarray(out["end_logits"])], -1)
  return np.asarray(out["logits"])


def _hf_outputs(out) -> np.ndarray:
  if hasattr(out, "start_logits"):
    return np.stack([out.start_logits.numpy(), out.end_logits.numpy()], -1)
  return out.logits.numpy()


@pytest.mark.slow
@pytest.mark.parametrize("cls,variant", [  # v3's multiple choice (padded rows only):
    pytest.param(c, v, id=f"{c}-{v}")      # tests/test_family_conformance.py
    for v in ("v3", "v2") for c in HEADS if (c, v) != ("DebertaV2ForMultipleChoice", "v3")])
def test_task_classes_match_hf(cls, variant):
  """bertjax's task head on the family's `task_features` (the ContextPooler, the
  heads' dropout off in eval) equals the Hugging Face class on padded rows and, but
  for multiple choice, on a packed row (sequence classification: each example's
  logits from the encoder's slots; tagging and QA per token, each document alone)."""
  make, task = HEADS[cls]
  model = hf_model(cls, variant, num_labels=3 if task != "squad" else 2)
  cfg, params, found = conv.load(config_json(model), state(model))
  assert found == task
  ours = base.FinetuneModel(cfg, make(cfg))
  apply = lambda b: _outputs(jax.jit(ours.apply)({"params": params}, b))  # noqa: E731
  ids, mask, types = _padded(2)
  if task == "multiple_choice":  # [B, C, T]: 2 questions of 3 choices
    ids, mask, types = (np.stack([x, x[::-1]]) for x in (ids, mask, types))
  got = apply({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
  ref = _hf_outputs(_hf(model, ids, mask, types))
  real = mask.astype(bool) if task in ("tagging", "squad") else slice(None)
  diff = np.abs(got - ref)[real].max()
  packed = 0.0
  if task != "multiple_choice":
    ids, seg, spans = _packed(3)
    pos = np.concatenate([np.arange(n) for n in DOCS] + [np.zeros(T - sum(DOCS), int)])
    batch = {"input_ids": ids, "attention_mask": (seg > 0) * 1,
             "token_type_ids": np.zeros_like(ids), "segment_ids": seg,
             "position_ids": pos[None].astype(np.int32)}
    if task == "classification":
      batch["cls_positions"] = np.array([[s.start for s in spans]], np.int32)
    got = apply(batch)
    for k, span in enumerate(spans):
      ref = _hf_outputs(_hf(model, ids[:, span]))
      mine = got[:, k] if task == "classification" else got[:, span]
      packed = max(packed, np.abs(mine - ref).max())
  print(f"\n{variant} {cls}: padded {diff:.1e} packed {packed:.1e}")
  assert diff < ATOL and packed < ATOL


# ---- Gradients -------------------------------------------------------------------

def _hf_grads(model, loss_of) -> dict[str, np.ndarray]:
  model.zero_grad(set_to_none=True)
  loss_of(model).backward()
  return {k: (np.zeros(p.shape, np.float32) if p.grad is None else p.grad.numpy().copy())
          for k, p in model.state_dict(keep_vars=True).items()}


def _zero_gradient(name: str, cfg) -> bool:
  """Whether a parameter's true gradient is 0: a term q_i . b adds the same score to every
  key of query i, which the softmax cancels. b: the key projections' bias in the
  content and c2p scores (only p2c, k_j . Qr, reads the key bias against something that
  varies with j) and, without p2c, the relative embeddings' LayerNorm bias."""
  return "pos_key_proj']['bias" in name or ("p2c" not in cfg.pos_att_type and (
      "key_proj']['bias" in name or "rel_norm']['bias" in name))


def _compare_grads(model, ours, theirs_state) -> float:
  """The largest difference of `ours` from transformers' gradients (mapped through the
  table), each relative to that gradient's largest magnitude (asserted < 1e-4); those
  whose true gradient is 0 (`_zero_gradient`) below 1e-6 of the largest on both sides."""
  cfg, theirs, _ = conv.load(config_json(model), theirs_state)
  assert jax.tree.structure(theirs) == jax.tree.structure(ours)
  largest = max(float(np.abs(h).max()) for h in jax.tree.leaves(theirs))
  worst = 0.0
  for (path, g), h in zip(jax.tree_util.tree_leaves_with_path(ours), jax.tree.leaves(theirs)):
    name, scale = jax.tree_util.keystr(path), float(np.abs(h).max())
    if _zero_gradient(name, cfg):  # both sides' are rounding
      assert max(scale, float(np.abs(g).max())) < 1e-6 * largest, name
      continue
    assert scale > 0, name  # Every parameter has a gradient.
    diff = float(np.abs(np.asarray(g) - h).max()) / scale
    assert diff < 1e-4, (name, diff)
    worst = max(worst, diff)
  return worst


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_mlm_gradients_match_hf(variant):
  """The summed MLM cross-entropy at labelled real positions of padded rows: torch's
  gradient of every parameter (mapped into our tree by the same table) against
  `jax.grad` of ours."""
  model = hf_model("DebertaV2ForMaskedLM", variant)
  cfg, params, _ = conv.load(config_json(model), state(model))
  ids, mask, types = _padded(4)
  rng = np.random.default_rng(5)
  labels = np.where((mask > 0) & (rng.random(ids.shape) < 0.4),
                    rng.integers(4, HF_VOCAB, ids.shape), -100)
  net = db.FAMILY.pretraining(cfg)

  def loss(p):
    logits = net.apply({"params": p}, ids, mask, types)["mlm_logits"]
    logp = jax.nn.log_softmax(logits)
    picked = jnp.take_along_axis(logp, np.maximum(labels, 0)[..., None], -1)[..., 0]
    return -jnp.sum(jnp.where(labels >= 0, picked, 0.0))

  def hf_loss(m):
    logits = m(torch.as_tensor(ids).long(), attention_mask=torch.as_tensor(mask).long(),
               token_type_ids=torch.as_tensor(types).long()).logits
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, HF_VOCAB), torch.as_tensor(labels).long().reshape(-1),
        ignore_index=-100, reduction="sum")

  worst = _compare_grads(model, jax.jit(jax.grad(loss))(params), _hf_grads(model, hf_loss))
  print(f"\n{variant} DebertaV2ForMaskedLM gradients: {worst:.1e} of each one's scale")


@pytest.mark.slow
def test_sequence_classification_gradients_match_hf():
  """The same for DebertaV2ForSequenceClassification's cross-entropy (v3): the
  ContextPooler and the classifier too."""
  model = hf_model("DebertaV2ForSequenceClassification", "v3", num_labels=3)
  cfg, params, _ = conv.load(config_json(model), state(model))
  ids, mask, types = _padded(6)
  labels = np.array([0, 2, 1])
  ours = base.FinetuneModel(cfg, ClassifierHead(cfg, 3))

  def loss(p):
    logits = ours.apply({"params": p}, {"input_ids": ids, "attention_mask": mask,
                                        "token_type_ids": types})["logits"]
    return -jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

  def hf_loss(m):
    logits = m(torch.as_tensor(ids).long(), attention_mask=torch.as_tensor(mask).long(),
               token_type_ids=torch.as_tensor(types).long()).logits
    return torch.nn.functional.cross_entropy(logits, torch.as_tensor(labels),
                                             reduction="sum")

  worst = _compare_grads(model, jax.jit(jax.grad(loss))(params), _hf_grads(model, hf_loss))
  print(f"\nv3 DebertaV2ForSequenceClassification gradients: {worst:.1e} of each one's scale")


# ---- Full-size parameter counts ---------------------------------------------------

# DeBERTa-v3-base / -large config.json (microsoft/deberta-v3-*), as configs/ hold them.
V3_SIZES = {"base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                         intermediate_size=3072),
            "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                          intermediate_size=4096)}
V3_CONFIG = dict(model_type="deberta-v2", vocab_size=128100, hidden_act="gelu",
                 max_position_embeddings=512, type_vocab_size=0, layer_norm_eps=1e-7,
                 relative_attention=True, max_relative_positions=-1, position_buckets=256,
                 norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type="p2c|c2p",
                 position_biased_input=False, pad_token_id=0)


@pytest.mark.slow
@pytest.mark.parametrize("size", list(V3_SIZES))
def test_full_size_parameter_counts_equal_hf(size):
  """DeBERTa-v3-base / -large from configs/deberta_v3_{size}.py (eval_shape, scanned
  and unscanned, every parameter with one logical axis name per dimension) against
  transformers' DebertaV2Model and DebertaV2ForMaskedLM from the released config.json
  (meta device), and that config.json read by the table gives the recipe's model."""
  import importlib  # pylint: disable=g-import-not-at-top
  from bertjax import model as model_lib  # pylint: disable=g-import-not-at-top
  recipe = importlib.import_module(f"configs.deberta_v3_{size}").get_config()
  hf_json = {**V3_CONFIG, **V3_SIZES[size]}
  ours_cfg = model_lib.config_from(recipe.model)
  fields = ("attention_impl", "scan_layers", "remat_policy", "dtype", "param_dtype",
            "dropout_rate", "attention_dropout_rate", "cls_dropout")
  keep = {f: getattr(ours_cfg, f) for f in fields}
  assert conv.model_config_from_hf(hf_json, **keep) == ours_cfg
  count = lambda tree: sum(x.size for x in jax.tree.leaves(tree))  # noqa: E731
  counts = []
  for scan in (False, True):
    boxed = jax.eval_shape(db.FAMILY.pretraining(_config(ours_cfg, scan)).init_params,
                           jax.random.key(0))
    for leaf in jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned)):
      assert isinstance(leaf, nn.Partitioned) and len(leaf.names) == leaf.value.ndim
    params = nn.unbox(boxed)
    counts.append((count(params["encoder"]), count(params)))
  with torch.device("meta"):
    hf = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(**hf_json))
  hf_count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731 (tied once)
  print(f"\ndeberta-v3-{size}: encoder ours {counts[0][0]:,} HF {hf_count(hf.deberta):,}; "
        f"with the MLM head ours {counts[0][1]:,} HF {hf_count(hf):,}")
  assert counts[0] == counts[1] == (hf_count(hf.deberta), hf_count(hf))


def test_config_errors_are_one_line():
  """A kernel that cannot take the score bias, unknown relative-attention kinds, norms
  or activations: one line each naming the field."""
  small = dict(vocab_size=64, hidden_size=32, num_heads=4, intermediate_size=48)
  for bad, match in ((dict(attention_impl="splash"), "attention_impl='splash' takes no "
                      "attention score bias"),
                     (dict(attention_impl="cudnn"), "takes no attention score bias"),
                     (dict(pos_att_type=("c2p", "p2p")), "pos_att_type"),
                     (dict(norm_rel_ebd="rms"), "norm_rel_ebd='rms'"),
                     (dict(hidden_act="swish"), "hidden_act='swish'"),
                     (dict(num_heads=5), "not divisible")):
    with pytest.raises(ConfigError, match=match) as e:
      db.DebertaConfig(**{**small, **bad})
    assert "\n" not in str(e.value)
  # Without relative attention no bias rides along: a kernel may serve.
  assert db.DebertaConfig(**small, relative_attention=False,
                          attention_impl="splash").attention_impl == "splash"
  with pytest.raises(ConfigError, match="family"):
    db.DebertaConfig.from_config({"family": "bert"})
  assert hf_config("v3").model_type == "deberta-v2"
