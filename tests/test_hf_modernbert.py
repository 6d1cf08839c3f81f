"""The ModernBERT conversion table: config.json variants (ModernBERT, Ettin, mmBERT,
transformers 4.x and 5.x keys) and state dicts both ways, every Hugging Face class (a
save_pretrained folder in, AutoModelForMaskedLM out: tests/test_family_conformance.py)."""

import json

import numpy as np
import pytest

from bertjax.hf import files, modernbert as conv
from bertjax.errors import CheckpointError
from bertjax.model import modernbert as mb

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
             num_attention_heads=4, global_attn_every_n_layers=3, local_attention=8,
             global_rope_theta=160_000.0, local_rope_theta=10_000.0, pad_token_id=0,
             bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
# Every optional bias on (and the MLM decoder's off).
BIASES = dict(attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True,
              decoder_bias=False)
CLASSES = ["ModernBertForMaskedLM", "ModernBertModel",
           *(cls for cls, _ in conv.TASK_CLASSES.values())]
TASKS = {cls: task for task, (cls, _) in conv.TASK_CLASSES.items()}
T = 20


def _model(cls, **kw):
  torch.manual_seed(0)
  config = transformers.ModernBertConfig(**SMALL, **kw, attn_implementation="eager")
  model = getattr(transformers, cls)(config)
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn(p.shape, generator=gen))
  return model.eval()


def _state(model):
  return {k: v.detach().numpy() for k, v in model.state_dict().items()}


# ---- config.json ------------------------------------------------------------------

def test_config_round_trip_through_transformers():
  cfg = mb.ModernBertConfig(vocab_size=64, hidden_size=32, num_layers=5, num_heads=4,
                            intermediate_size=48, pad_token_id=3,
                            global_attn_every_n_layers=2, local_attention=16,
                            global_rope_theta=80_000.0, local_rope_theta=5_000.0,
                            classifier_pooling="mean", norm_eps=1e-6, **BIASES)
  hf = conv.hf_config(cfg)
  assert conv.model_config_from_hf(hf) == cfg
  theirs = transformers.ModernBertConfig(**hf)
  assert theirs.layer_types == list(cfg.layer_types)
  assert theirs.sliding_window == cfg.window == 8
  assert theirs.rope_parameters["full_attention"]["rope_theta"] == 80_000.0
  assert theirs.rope_parameters["sliding_attention"]["rope_theta"] == 5_000.0
  assert conv.model_config_from_hf(theirs.to_dict()) == cfg


@pytest.mark.parametrize("variant", ["legacy", "v5", "sliding_window", "flat_rope"])
def test_config_variants(variant):
  """Ettin / mmBERT config.json (4.x keys), transformers 5 (layer_types,
  rope_parameters), `sliding_window` (half the window, winning as in transformers)."""
  base = dict(model_type="modernbert", vocab_size=256000, hidden_size=384,
              intermediate_size=1152, num_hidden_layers=22, num_attention_heads=6,
              pad_token_id=0)
  if variant == "legacy":  # mmBERT-small-like
    hf = dict(base, global_attn_every_n_layers=3, global_rope_theta=160000.0,
              local_rope_theta=160000.0, local_attention=128)
    want = (3, 128, 160000.0, 160000.0)
  elif variant == "v5":
    hf = dict(base, layer_types=["full_attention" if i % 4 == 0 else "sliding_attention"
                                 for i in range(22)],
              rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "default",
                                                     "rope_theta": 1e4}},
              global_attn_every_n_layers=3, local_attention=64)
    want = (4, 64, 1e6, 1e4)  # layer_types win over the stale legacy key
  elif variant == "sliding_window":
    hf = dict(base, local_attention=128, sliding_window=32)
    want = (3, 64, 160000.0, 10000.0)
  else:
    hf = dict(base, rope_parameters={"rope_type": "default", "rope_theta": 5e4})
    want = (3, 128, 5e4, 5e4)
  cfg = conv.model_config_from_hf(hf)
  assert (cfg.global_attn_every_n_layers, cfg.local_attention, cfg.global_rope_theta,
          cfg.local_rope_theta) == want
  if variant != "flat_rope":  # transformers 5 itself reads the others the same way
    theirs = transformers.ModernBertConfig(**hf)
    assert theirs.layer_types == list(cfg.layer_types)
    assert theirs.local_attention == cfg.local_attention
    assert [theirs.rope_parameters[k]["rope_theta"] for k in
            ("full_attention", "sliding_attention")] == list(want[2:])


@pytest.mark.parametrize("bad,match", [
    (dict(model_type="bert"), "model_type='bert'"),
    (dict(layer_types=["full_attention", "sliding_attention", "full_attention",
                       "full_attention"]), "layer_types"),
    (dict(rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0}}),
     "rope_type='linear'"),
    (dict(hidden_activation="swiglu"), "hidden_activation='swiglu'"),
])
def test_config_errors_are_one_line(bad, match):
  hf = {**dict(model_type="modernbert", num_hidden_layers=4, hidden_size=32,
               num_attention_heads=4, vocab_size=64, pad_token_id=0), **bad}
  with pytest.raises(CheckpointError, match=match) as e:
    conv.model_config_from_hf(hf)
  assert "\n" not in str(e.value)


# ---- state dicts ------------------------------------------------------------------

@pytest.mark.parametrize("biases", [False, True], ids=["no_bias", "biases"])
@pytest.mark.parametrize("cls", CLASSES)
def test_state_dict_round_trip(cls, biases):
  """Hugging Face -> bertjax -> Hugging Face gives back every tensor exactly."""
  model = _model(cls, num_labels=3, **(BIASES if biases else {}))
  state = _state(model)
  cfg = conv.model_config_from_hf(model.config.to_dict())
  task = TASKS.get(cls)
  params = conv.params_from_hf(state, cfg, task)
  assert ("mlm" in params) == (cls == "ModernBertForMaskedLM")
  assert ("head" in params) == (task is not None)
  for scan in (False, True):
    back = conv.params_to_hf(mb.FAMILY.to_layout(params, scan), cfg, task)
    assert sorted(back) == sorted(state), cls
    for k, v in state.items():
      np.testing.assert_array_equal(back[k], v, err_msg=k)


def test_checkpoint_errors():
  model = _model("ModernBertForMaskedLM")
  cfg = conv.model_config_from_hf(model.config.to_dict())
  state = _state(model)
  untied = dict(state, **{"decoder.weight": state["decoder.weight"] + 1})
  with pytest.raises(CheckpointError, match="ties them"):
    conv.params_from_hf(untied, cfg)
  with pytest.raises(CheckpointError, match="lacks 'model.final_norm.weight'"):
    conv.params_from_hf({k: v for k, v in state.items() if "final_norm" not in k}, cfg)
  seq = _state(_model("ModernBertForSequenceClassification"))
  with pytest.raises(CheckpointError, match="name its task"):
    conv.params_from_hf(seq, cfg)
  with pytest.raises(CheckpointError, match="'span_ner'"):
    conv.param_table(cfg, task="span_ner")


def _logits(model, ids, mask):
  with torch.no_grad():
    out = model(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
  return out.logits.numpy() if hasattr(out, "logits") else out.start_logits.numpy()


def _load(directory, **overrides):
  """`conv.load` of a Hugging Face directory."""
  with open(directory / "config.json") as f:
    return conv.load(json.load(f), files.read_state_dict(str(directory)), **overrides)


def _save(directory, params, cfg, task=None, labels=None) -> str:
  """`conv.export` written as a Hugging Face directory; returns its class."""
  hf_config, state = conv.export(params, cfg, task, labels)
  files.write(str(directory), hf_config, state)
  return hf_config["architectures"][0]


@pytest.mark.parametrize("cls", [cls for cls, _ in conv.TASK_CLASSES.values()])
def test_finetuned_classes_export(tmp_path, cls):
  """A task model's params (as from `load_hf`) export to the same Hugging Face class
  with the same outputs; labels are named in config.json."""
  model = _model(cls, num_labels=2 if "Question" in cls else 3)
  model.save_pretrained(str(tmp_path / "hf"))
  cfg, params, task = _load(tmp_path / "hf")
  assert task == TASKS[cls]
  labels = ["a", "b", "c"] if task in ("classification", "tagging") else None
  assert _save(tmp_path / "out", params, cfg, task, labels) == cls
  with open(tmp_path / "out" / "config.json") as f:
    written = json.load(f)
  if labels:
    assert written["id2label"] == {"0": "a", "1": "b", "2": "c"}
  back = getattr(transformers, cls).from_pretrained(
      str(tmp_path / "out"), attn_implementation="eager").eval()
  ids = np.random.default_rng(0).integers(3, 64, (2, 3, T) if "Choice" in cls else (2, T))
  mask = np.ones_like(ids)
  np.testing.assert_allclose(_logits(back, ids, mask), _logits(model, ids, mask),
                             atol=1e-6)
