"""UltraBERT's own cases (its gradients and parameter counts are test_eurobert.py's,
parametrised over both families; its numerics against transformers, bfloat16 and a
save_pretrained folder in, AutoModelForMaskedLM out, tests/test_family_conformance.py's):
sliding layers that really are local, any `layer_types` pattern scanned as unscanned,
the config.json variants (transformers 5's, the remote code's attention_windows /
per-layer rope_theta), every class both ways, and the fine-tuned heads (sequence
classification 'cls' / 'mean', tagging, span QA) equal to transformers' UltrabertFor*."""

import jax
import numpy as np
import pytest

from bertjax.errors import CheckpointError, ConfigError
from bertjax.hf import files, ultrabert as conv
from bertjax.model import ultrabert as ub
from tests import eurobert_helpers as h

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

T = 24


@pytest.fixture(scope="module")
def mlm():
  model = h.hf_model("ultrabert")
  cfg, params, _ = h.load(model)
  return model, cfg, params


def _ids(rng, shape):
  return rng.integers(3, h.VOCAB, shape).astype(np.int32)


def test_sliding_layers_are_local_and_any_pattern_scans(mlm):
  """At T = 24 the radius (4) matters: widening it changes the logits. A pattern that is
  not periodic (full, sliding, full) scans to the unscanned outputs (the layer kind by
  `lax.cond` on the traced index) and matches transformers."""
  model, cfg, params = mlm
  assert cfg.layer_types == ("sliding_attention", "sliding_attention", "full_attention")
  assert cfg.windows == (4, 4, None)
  ids = _ids(np.random.default_rng(0), (2, T))
  _, narrow = h.ours(cfg, params, input_ids=ids)
  wide = ub.UltraBertConfig.from_config({**cfg.to_dict(), "sliding_window": T})
  assert np.abs(h.ours(wide, params, input_ids=ids)[1] - narrow).max() > 1e-3
  types = ["full_attention", "sliding_attention", "full_attention"]
  other = h.hf_model("ultrabert", layer_types=types)
  cfg, params, _ = h.load(other)
  assert cfg.layer_types == tuple(types)
  _, ref = h.theirs(other, ids)
  unscanned, scanned = (h.ours(cfg, params, scan, input_ids=ids)[1] for scan in (False, True))
  assert np.abs(unscanned - ref).max() < 1e-5 and np.abs(scanned - ref).max() < 1e-5


@pytest.mark.parametrize("variant", ["v5", "remote_code", "bare", "flat_rope"])
def test_config_variants(variant):
  """transformers 5's keys, the remote code's (attention_windows per layer, rope_theta
  per layer: the last of each kind), none (transformers' defaults), one rope for both
  kinds; each read as transformers reads it."""
  base = dict(model_type="ultrabert", hidden_size=64, num_attention_heads=4,
              num_hidden_layers=4, intermediate_size=96, vocab_size=100)
  if variant == "v5":
    hf = dict(base, layer_types=["full_attention", "sliding_attention"] * 2, sliding_window=64,
              rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "default",
                                                     "rope_theta": 1e4}})
  elif variant == "remote_code":
    hf = dict(base, attention_windows=[128, 128, 0, 128], rope_theta=[1e4, 2e4, 3e6, 5e4])
  elif variant == "bare":
    hf = dict(model_type="ultrabert")
  else:
    hf = dict(base, rope_parameters={"rope_type": "default", "rope_theta": 5e4})
  cfg = conv.model_config_from_hf(hf)
  if variant == "flat_rope":
    assert cfg.full_rope_theta == cfg.sliding_rope_theta == 5e4
    return
  theirs = transformers.UltrabertConfig(**{k: v for k, v in hf.items() if k != "model_type"})
  assert list(cfg.layer_types) == theirs.layer_types
  assert cfg.sliding_window == theirs.sliding_window
  assert [cfg.full_rope_theta, cfg.sliding_rope_theta] == [
      theirs.rope_parameters[k]["rope_theta"] for k in ("full_attention", "sliding_attention")]
  if variant == "remote_code":
    assert (cfg.full_rope_theta, cfg.sliding_rope_theta) == (3e6, 5e4)


def test_config_round_trip_and_errors():
  cfg = ub.UltraBertConfig(vocab_size=64, hidden_size=32, num_layers=4, num_heads=4,
                           num_kv_heads=1, intermediate_size=40, pad_token_id=3,
                           layer_types=("full_attention",) * 3 + ("sliding_attention",),
                           sliding_window=16, full_rope_theta=1e5, sliding_rope_theta=1e3,
                           prediction_head_size=24, classifier_pooling="mean",
                           classifier_dropout=0.1, tie_word_embeddings=True)
  hf = conv.hf_config(cfg)
  assert conv.model_config_from_hf(hf) == cfg
  theirs = transformers.UltrabertConfig(**hf)
  assert conv.model_config_from_hf(theirs.to_dict()) == cfg
  for bad, match in ((dict(model_type="eurobert"), "model_type='eurobert'"),
                     (dict(rope_parameters={"full_attention": {"rope_type": "linear",
                                                               "rope_theta": 1e4,
                                                               "factor": 2.0},
                                            "sliding_attention": {"rope_theta": 1e4}}),
                      "rope_type='linear'"),
                     (dict(classifier_pooling="late"), "classifier_pooling='late'")):
    with pytest.raises(CheckpointError, match=match) as e:
      conv.model_config_from_hf({**dict(model_type="ultrabert", num_hidden_layers=2,
                                        hidden_size=32, num_attention_heads=4), **bad})
    assert "\n" not in str(e.value)
  for bad in (dict(layer_types=("full_attention",)), dict(layer_types=("local",) * 3),
              dict(sliding_window=0), dict(classifier_pooling="late")):
    with pytest.raises(ConfigError) as e:
      ub.UltraBertConfig(**{**dict(vocab_size=64, hidden_size=32, num_layers=3,
                                   num_heads=4, pad_token_id=0), **bad})
    assert "\n" not in str(e.value)
  cfg = ub.UltraBertConfig(vocab_size=64, hidden_size=32, num_layers=3, num_heads=4,
                           pad_token_id=0, sliding_window=64)
  with pytest.raises(ConfigError, match="sliding_window=64 spans 129 tokens"):
    ub.phase_inputs(cfg, [128, 64])


CLASSES = ["UltrabertForMaskedLM", "UltrabertModel",
           *(cls for cls, _ in conv.TASK_CLASSES.values())]
TASKS = {cls: task for task, (cls, _) in conv.TASK_CLASSES.items()}


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("cls", CLASSES)
def test_state_dict_round_trip(cls, tied):
  model = h.hf_model("ultrabert", cls, num_labels=3, tie_word_embeddings=tied,
                     attention_bias=True, mlp_bias=True)
  state = h.state(model)
  cfg = conv.model_config_from_hf(model.config.to_dict())
  task = TASKS.get(cls)
  params = conv.params_from_hf(state, cfg, task)
  assert ("mlm" in params) == (cls == "UltrabertForMaskedLM")
  for scan in (False, True):
    back = conv.params_to_hf(ub.FAMILY.to_layout(params, scan), cfg, task)
    assert sorted(back) == sorted(state), cls
    for k, v in state.items():
      np.testing.assert_array_equal(back[k], v, err_msg=k)


def _outputs(model, ids, mask):
  with torch.no_grad():
    out = model(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
  if hasattr(out, "start_logits"):
    return np.stack([out.start_logits.numpy(), out.end_logits.numpy()], -1)
  return out.logits.numpy()


def _padded(rng):
  mask = (np.arange(T)[None] < np.array([[T], [13], [20]])).astype(np.int32)
  return np.where(mask > 0, _ids(rng, (3, T)), 0), mask


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_task_heads_equal_transformers(pooling, tmp_path):
  """bertjax's task heads (classification with each pooling; tagging and span QA once)
  on UltrabertFor*'s weights give their outputs, and export back to the same class."""
  from bertjax.tasks import base, get_task  # pylint: disable=g-import-not-at-top
  from configs.finetune import glue, ner, squad  # pylint: disable=g-import-not-at-top
  ids, mask = _padded(np.random.default_rng(2))
  cases = [("UltrabertForSequenceClassification", glue.get_config("mnli").task)]
  if pooling == "cls":
    cases += [("UltrabertForTokenClassification", ner.get_config().task),
              ("UltrabertForQuestionAnswering", squad.get_config().task)]
  for cls, task_cfg in cases:
    model = h.hf_model("ultrabert", cls, num_labels=3, classifier_pooling=pooling)
    task = get_task(task_cfg.name)(task_cfg, None, T)
    task.labels = ["a", "b", "c"] if task.name != "squad" else []
    cfg = conv.model_config_from_hf(model.config.to_dict())
    params = conv.params_from_hf(h.state(model), cfg, task.name)
    net = base.FinetuneModel(cfg, task.head(cfg))
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    out = jax.jit(net.apply)({"params": params}, batch)
    mine = (np.stack([out["start_logits"], out["end_logits"]], -1) if task.name == "squad"
            else np.asarray(out["logits"]))
    ref = _outputs(model, ids, mask)
    real = mask.astype(bool) if task.name != "classification" else slice(None)
    assert np.abs(mine - ref)[real].max() < 1e-5, (cls, pooling)
    hf, state = conv.export(params, cfg, task.name, task.labels or None)
    files.write(str(tmp_path / cls), hf, state)
    back = getattr(transformers, cls).from_pretrained(
        str(tmp_path / cls), attn_implementation="eager").eval()
    np.testing.assert_allclose(_outputs(back, ids, mask), ref, atol=1e-6)
