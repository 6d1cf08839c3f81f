"""EuroBERT and UltraBERT (which is EuroBERT's blocks with sliding layers and a
two-layer MLM head) beyond tests/test_family_conformance.py (every family's hidden states
and logits against transformers on padded and packed rows, scanned, bf16; a
save_pretrained folder in, AutoModelForMaskedLM out): gradients of every parameter
equal torch's (float32, weights through the families' conversion tables, padded and
packed rows); full-size parameter counts equal transformers'. And EuroBERT's own
conversion cases (config.json variants, every class both ways, biased and tied, the
fine-tuned heads). UltraBERT's own: test_ultrabert.py."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.errors import CheckpointError, ConfigError
from bertjax.hf import convert, eurobert as conv, files
from bertjax.model import eurobert as eb, family_of
from tests import eurobert_helpers as h

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

T = 24  # > 2 * 4 + 1: UltraBERT's sliding layers see part of each row.
RTOL = 1e-4  # of the largest magnitude (the bar; measured ~1e-6)


@pytest.fixture(scope="module", params=h.FAMILIES)
def mlm(request):
  """(family, transformers MLM, config, params) of each family's tiny encoder."""
  model = h.hf_model(request.param)
  cfg, params, task = h.load(model)
  assert task is None and cfg.family == request.param
  return request.param, model, cfg, params


def _ids(rng, shape):
  return rng.integers(3, h.VOCAB, shape).astype(np.int32)


def _padded(rng):
  lengths = [T, 17, 9]
  mask = (np.arange(T)[None] < np.array(lengths)[:, None]).astype(np.int32)
  return np.where(mask > 0, _ids(rng, (3, T)), 0), mask


def _packed(rng):
  docs = [_ids(rng, (n,)) for n in (11, 8, 4)]  # + one padding token: T = 24
  ids, seg, pos = (np.zeros((1, T), np.int32) for _ in range(3))
  at = 0
  for s, doc in enumerate(docs):
    ids[0, at:at + len(doc)], seg[0, at:at + len(doc)] = doc, s + 1
    pos[0, at:at + len(doc)] = np.arange(len(doc))
    at += len(doc)
  return docs, ids, seg, pos


# ---- Gradients --------------------------------------------------------------------

def _hf_grads(model, rows) -> dict[str, np.ndarray]:
  """The summed cross-entropy's gradient of every state-dict entry; rows: (ids [1, t],
  mask or None, labels [1, t], -100 unlabelled)."""
  model.zero_grad(set_to_none=True)
  for ids, mask, labels in rows:
    logits = model(torch.as_tensor(ids, dtype=torch.long),
                   attention_mask=None if mask is None else torch.as_tensor(mask)).logits
    torch.nn.functional.cross_entropy(
        logits.reshape(-1, h.VOCAB), torch.as_tensor(labels, dtype=torch.long).reshape(-1),
        ignore_index=-100, reduction="sum").backward()
  return {k: (np.zeros(p.shape, np.float32) if p.grad is None else p.grad.numpy().copy())
          for k, p in model.state_dict(keep_vars=True).items()}


def _grad_diff(model, cfg, params, ids, mask, labels, segment_ids, rows) -> float:
  net = family_of(cfg).pretraining(cfg)

  def loss(p):
    logits = net.apply({"params": p}, jnp.asarray(ids), jnp.asarray(mask),
                       segment_ids=segment_ids)["mlm_logits"]
    logp = jax.nn.log_softmax(logits)
    picked = jnp.take_along_axis(logp, jnp.asarray(np.maximum(labels, 0))[..., None], -1)
    return -jnp.sum(jnp.where(jnp.asarray(labels >= 0), picked[..., 0], 0.0))

  grads = jax.jit(jax.grad(loss))(params)
  hf = model.config.to_dict()
  _, ref, _ = convert.table_of(hf).load(hf, _hf_grads(model, rows))
  assert jax.tree.structure(ref) == jax.tree.structure(grads)
  worst = 0.0
  for (path, g), r in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref)):
    scale = float(np.abs(r).max())
    assert scale > 0, jax.tree_util.keystr(path)  # every parameter has a gradient
    diff = float(np.abs(np.asarray(g) - r).max()) / scale
    assert diff < RTOL, (jax.tree_util.keystr(path), diff)
    worst = max(worst, diff)
  return worst


def _labels(rng, ids, real):
  chosen = real & (rng.random(ids.shape) < 0.35)
  return np.where(chosen, rng.integers(3, h.VOCAB, ids.shape), -100).astype(np.int32)


def test_gradients_match_hf_on_padded_and_packed_rows(mlm):
  family, model, cfg, params = mlm
  rng = np.random.default_rng(2)
  ids, mask = _padded(rng)
  labels = _labels(rng, ids, mask > 0)
  padded = _grad_diff(model, cfg, params, ids, mask, labels, None,
                      [(ids[i:i + 1], mask[i:i + 1], labels[i:i + 1]) for i in range(3)])
  docs, ids, seg, _ = _packed(rng)
  labels = _labels(rng, ids, seg > 0)
  bounds = np.cumsum([0] + [len(d) for d in docs])
  packed = _grad_diff(model, cfg, params, ids, (seg > 0).astype(np.int32), labels,
                      jnp.asarray(seg), [(ids[:, a:b], None, labels[:, a:b])
                                         for a, b in zip(bounds[:-1], bounds[1:])])
  print(f"{family} gradients: padded {padded:.1e}, packed {packed:.1e} of the largest")


# ---- Full-size parameter counts ---------------------------------------------------

SIZES = {  # transformers config sizes (EuroBERT-210m's; a grouped-query variant, biases)
    "eurobert_210m": ("eurobert", dict(rope_parameters={"rope_type": "default",
                                                         "rope_theta": 250_000.0})),
    "eurobert_gqa_biases": ("eurobert", dict(num_attention_heads=18, num_key_value_heads=6,
                                             hidden_size=1152, num_hidden_layers=4,
                                             attention_bias=True, mlp_bias=True)),
    "ultrabert_768": ("ultrabert", dict(hidden_size=768, num_attention_heads=12,
                                        intermediate_size=1152, num_hidden_layers=6)),
}


@pytest.mark.parametrize("size", list(SIZES))
def test_full_size_parameter_counts_equal_hf(size):
  family, sizes = SIZES[size]
  cls = h.HF_FAMILY[family]
  hf_config = getattr(transformers, cls[0])(**sizes)
  table = convert.table_of(hf_config.to_dict())
  cfg = table.model_config_from_hf(hf_config.to_dict(), scan_layers=True)
  boxed = jax.eval_shape(family_of(cfg).pretraining(cfg).init_params, jax.random.key(0))
  for leaf in jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned)):
    assert isinstance(leaf, nn.Partitioned) and len(leaf.names) == leaf.value.ndim
  count = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
  with torch.device("meta"):
    hf_model = getattr(transformers, cls[1])(hf_config)
  hf_count = lambda m: sum(p.numel() for p in m.parameters())
  params = nn.unbox(boxed)
  assert count(params["encoder"]) == hf_count(hf_model.model)
  assert count(params) == hf_count(hf_model)


# ---- EuroBERT's conversion table --------------------------------------------------

BIASES = dict(attention_bias=True, mlp_bias=True)
CLASSES = ["EuroBertForMaskedLM", "EuroBertModel",
           *(cls for cls, _ in conv.TASK_CLASSES.values())]
TASKS = {cls: task for task, (cls, _) in conv.TASK_CLASSES.items()}


def test_config_round_trip_through_transformers():
  cfg = eb.EuroBertConfig(vocab_size=64, hidden_size=48, num_layers=5, num_heads=6,
                          num_kv_heads=2, head_dim=16, intermediate_size=40, pad_token_id=3,
                          rope_theta=50_000.0, rope_type="linear", rope_factor=2.0,
                          classifier_pooling="cls", rms_norm_eps=1e-6,
                          tie_word_embeddings=True, **BIASES)
  hf = conv.hf_config(cfg)
  assert conv.model_config_from_hf(hf) == cfg
  theirs = transformers.EuroBertConfig(**hf)
  assert theirs.classifier_pooling == "bos" and theirs.head_dim == 16
  assert theirs.rope_parameters == {"rope_type": "linear", "rope_theta": 50_000.0,
                                    "factor": 2.0}
  assert conv.model_config_from_hf(theirs.to_dict()) == cfg


@pytest.mark.parametrize("variant", ["published", "v5", "bare"])
def test_config_variants(variant):
  """EuroBERT-210m's config.json (4.x keys: rope_theta, rope_scaling null, its remote
  code's clf_pooling), transformers 5's rope_parameters, and a bare config.json
  (transformers' defaults: theta 10,000, 'late')."""
  base = dict(model_type="eurobert", hidden_size=768, num_attention_heads=12,
              num_hidden_layers=12, intermediate_size=3072, vocab_size=128256)
  hf = {"published": dict(base, rope_theta=250000, rope_scaling=None, clf_pooling="bos",
                          num_key_value_heads=12, pad_token_id=128001, mask_token_id=128002),
        "v5": dict(base, rope_parameters={"rope_type": "default", "rope_theta": 250000.0},
                   classifier_pooling="mean"),
        "bare": dict(model_type="eurobert")}[variant]
  cfg = conv.model_config_from_hf(hf)
  theirs = transformers.EuroBertConfig(**{k: v for k, v in hf.items() if k != "model_type"})
  assert cfg.rope_theta == theirs.rope_parameters["rope_theta"]
  assert cfg.num_kv_heads == theirs.num_key_value_heads and cfg.head_dim == theirs.head_dim
  assert {"cls": "bos"}.get(cfg.classifier_pooling, cfg.classifier_pooling) == (
      theirs.classifier_pooling)
  if variant == "published":
    assert cfg == eb.EuroBertConfig()  # the dataclass defaults are EuroBERT-210m's


@pytest.mark.parametrize("bad,match", [
    (dict(model_type="llama"), "model_type='llama'"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}), "yarn"),
    (dict(hidden_act="swiglu"), "hidden_act='swiglu'"),
    (dict(classifier_pooling="max"), "classifier_pooling='max'"),
])
def test_config_errors_are_one_line(bad, match):
  hf = {**dict(model_type="eurobert", num_hidden_layers=2, hidden_size=32,
               num_attention_heads=4, vocab_size=64, pad_token_id=0), **bad}
  with pytest.raises(CheckpointError, match=match) as e:
    conv.model_config_from_hf(hf)
  assert "\n" not in str(e.value)
  for bad in (dict(num_kv_heads=3), dict(head_dim=7), dict(classifier_pooling="bos"),
              dict(hidden_act="swish"), dict(rope_type="yarn")):
    with pytest.raises(ConfigError) as e:
      eb.EuroBertConfig(**{**dict(vocab_size=64, hidden_size=32, num_heads=4,
                                  pad_token_id=0), **bad})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("biases", [False, True], ids=["no_bias", "biases"])
@pytest.mark.parametrize("cls", CLASSES)
def test_state_dict_round_trip(cls, biases, tied):
  """transformers -> bertjax -> transformers gives back every tensor exactly."""
  model = h.hf_model("eurobert", cls, num_labels=3, tie_word_embeddings=tied,
                     **(BIASES if biases else {}))
  state = h.state(model)
  cfg = conv.model_config_from_hf(model.config.to_dict())
  task = TASKS.get(cls)
  params = conv.params_from_hf(state, cfg, task)
  assert ("mlm" in params) == (cls == "EuroBertForMaskedLM")  # {}: tied, no bias
  for scan in (False, True):
    back = conv.params_to_hf(eb.FAMILY.to_layout(params, scan), cfg, task)
    assert sorted(back) == sorted(state), cls
    for k, v in state.items():
      np.testing.assert_array_equal(back[k], v, err_msg=k)


def test_checkpoint_errors():
  model = h.hf_model("eurobert", tie_word_embeddings=True)
  cfg = conv.model_config_from_hf(model.config.to_dict())
  state = h.state(model)
  untied = dict(state, **{"lm_head.weight": state["lm_head.weight"] + 1})
  with pytest.raises(CheckpointError, match="ties them"):
    conv.params_from_hf(untied, cfg)
  with pytest.raises(CheckpointError, match="lacks 'model.norm.weight'"):
    conv.params_from_hf({k: v for k, v in state.items() if k != "model.norm.weight"}, cfg)
  with pytest.raises(CheckpointError, match="'squad' model has no Hugging Face EuroBERT"):
    conv.param_table(cfg, task="squad")


def _logits(model, ids, mask):
  with torch.no_grad():
    return model(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask)).logits.numpy()


@pytest.mark.parametrize("pooling", ["bos", "mean", "late"])
def test_task_heads_equal_transformers(pooling, tmp_path):
  """`task_features` + `output_layer` of a bertjax task head (classification with each
  pooling; tagging) on EuroBertFor*'s weights give their logits; the params export
  back to the same class (labels in config.json) with the same outputs."""
  from bertjax.tasks import base, get_task  # pylint: disable=g-import-not-at-top
  from configs.finetune import glue, ner  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  ids, mask = _padded(rng)
  cases = [("EuroBertForSequenceClassification", glue.get_config("mnli").task)]
  if pooling == "late":
    cases.append(("EuroBertForTokenClassification", ner.get_config().task))
  for cls, task_cfg in cases:
    model = h.hf_model("eurobert", cls, num_labels=3, classifier_pooling=pooling)
    task = get_task(task_cfg.name)(task_cfg, None, T)
    task.labels = ["a", "b", "c"]
    assert conv.task_of({"architectures": [cls]}) == task.name
    cfg = conv.model_config_from_hf(model.config.to_dict())
    params = conv.params_from_hf(h.state(model), cfg, task.name)
    net = base.FinetuneModel(cfg, task.head(cfg))
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    mine = np.asarray(jax.jit(net.apply)({"params": params}, batch)["logits"])
    ref = _logits(model, ids, mask)
    real = mask.astype(bool) if task.name == "tagging" else slice(None)
    assert np.abs(mine - ref)[real].max() < 1e-5, (cls, pooling)
    hf, state = conv.export(params, cfg, task.name, task.labels)
    files.write(str(tmp_path / cls), hf, state)
    assert hf["id2label"] == {"0": "a", "1": "b", "2": "c"}
    back = getattr(transformers, cls).from_pretrained(
        str(tmp_path / cls), attn_implementation="eager").eval()
    assert back.config.classifier_pooling == pooling
    np.testing.assert_allclose(_logits(back, ids, mask), ref, atol=1e-6)


def test_packed_classification_needs_cls_or_mean_pooling():
  """'late' pools after the head's dense: packed examples' slots cannot give it."""
  from bertjax.model import stack  # pylint: disable=g-import-not-at-top
  cfg = eb.EuroBertConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=4,
                          intermediate_size=48, pad_token_id=0)
  encoder = stack.Encoder(cfg, eb.FAMILY)
  out = {"last_hidden_state": jnp.zeros((1, 4, 32))}
  batch = {"cls_positions": jnp.zeros((1, 2), jnp.int32),
           "segment_ids": jnp.ones((1, 4), jnp.int32), "attention_mask": jnp.ones((1, 4))}
  with pytest.raises(ConfigError, match="classifier_pooling='late'") as e:
    encoder.slots(out, batch)
  assert "\n" not in str(e.value)
