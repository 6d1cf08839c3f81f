"""The GTE and NomicBERT conversion tables (`bertjax.hf.gte`, `bertjax.hf.nomic_bert`):
config.json both ways (transformers 5's keys and the published remote-code ones, what
bertjax cannot represent refused in one line), state dicts both ways in both key
layouts (transformers' modules and the published one `save_pretrained` writes) for
every Hugging Face class, an export that the For<Task> classes load with equal outputs
(the MLM's, a `save_pretrained` folder in and AutoModelForMaskedLM out:
tests/test_family_conformance.py), and the tokenizers through bertjax's tokenizer
kinds."""

import dataclasses
import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax.errors import CheckpointError
from bertjax.hf import convert, files, gte as gte_table, nomic_bert as nomic_table
from bertjax.model import family_of, gte, nomic_bert
from tests.gte_helpers import CLASSES, FAMILIES, PAD, VOCAB, hf_model, state
from tests.helpers import hf_outputs, load_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TABLES = {"gte": gte_table, "nomic_bert": nomic_table}
HEADS = ["ForMaskedLM", "Model", "ForSequenceClassification", "ForTokenClassification"]
T = 16


def _ids(seed=0):
  rng = np.random.default_rng(seed)
  mask = (np.arange(T)[None] < np.array([[T], [9]])).astype(np.int32)
  return np.where(mask > 0, rng.integers(3, VOCAB, (2, T)), PAD).astype(np.int32), mask


# ---- config.json ------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_config_round_trip_through_transformers(family):
  table = TABLES[family]
  extra = {"head_dim": 10} if family == "nomic_bert" else {}
  cfg = family_of(family).config(
      vocab_size=64, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=48,
      pad_token_id=3, type_vocab_size=0 if family == "gte" else 2, layer_norm_eps=1e-6,
      hidden_act="gelu_pytorch_tanh", dropout_rate=0.05, attention_dropout_rate=0.02,
      classifier_dropout_rate=0.3, rope_theta=5e4, rope_type="linear", rope_factor=2.0,
      max_position_embeddings=1024, **extra)
  hf = table.hf_config(cfg)
  assert table.model_config_from_hf(hf) == cfg
  theirs = getattr(transformers, f"{CLASSES[family]}Config")(**hf)
  assert theirs.rope_parameters == {"rope_type": "linear", "rope_theta": 5e4, "factor": 2.0}
  assert table.model_config_from_hf(theirs.to_dict()) == cfg
  # A classifier's config.json gives the encoder its pooler.
  with_pooler = table.hf_config(cfg, f"{CLASSES[family]}ForSequenceClassification")
  assert table.model_config_from_hf(with_pooler).pooler


def test_published_gte_configs():
  """Alibaba-NLP's remote-code config.json (model_type 'new', rope_theta and rope_scaling
  at the top): mGTE's sizes read; the 'ntk' scaling of gte-*-en-v1.5 is refused."""
  new = dict(model_type="new", architectures=["NewModel"], vocab_size=250048,
             hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
             intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
             attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12,
             layer_norm_type="layer_norm", logn_attention_scale=False,
             max_position_embeddings=8192, pad_token_id=1, position_embedding_type="rope",
             rope_scaling=None, rope_theta=160000, type_vocab_size=1, pack_qkv=True,
             unpad_inputs=False, classifier_dropout=0.0)
  assert gte_table.model_config_from_hf(new) == gte.GteConfig(classifier_dropout_rate=0.0)
  assert gte_table.model_config_from_hf(dict(model_type="gte")) == gte.GteConfig()
  for bad, match in ((dict(rope_scaling={"type": "ntk", "factor": 2.0}), "'ntk'"),
                     (dict(logn_attention_scale=True), "logn_attention_scale"),
                     (dict(layer_norm_type="rms_norm"), "layer_norm_type"),
                     (dict(position_embedding_type="absolute"), "position_embedding_type"),
                     (dict(hidden_act="swiglu"), "hidden_act"),
                     (dict(head_dim=32), "head_dim"), (dict(model_type="bert"), "model_type")):
    with pytest.raises(CheckpointError, match=match) as e:
      gte_table.model_config_from_hf({**new, **bad})
    assert "\n" not in str(e.value)


def test_published_nomic_configs():
  """nomic-ai's remote-code config.json (nomic-embed-text-v1.5's keys) reads; its
  switches bertjax cannot represent are refused in one line."""
  remote = dict(model_type="nomic_bert", activation_function="swiglu", causal=False,
                n_embd=768, n_head=12, n_inner=3072, n_layer=12, n_positions=8192,
                layer_norm_epsilon=1e-12, rotary_emb_base=1000, rotary_emb_fraction=1.0,
                rotary_emb_interleaved=False, rotary_scaling_factor=None, prenorm=False,
                qkv_proj_bias=False, mlp_fc1_bias=False, mlp_fc2_bias=False,
                use_rms_norm=False, type_vocab_size=2, vocab_size=30528, pad_token_id=0)
  assert nomic_table.model_config_from_hf(remote) == nomic_bert.NomicBertConfig(
      max_position_embeddings=8192, head_dim=64)
  for bad in (dict(rotary_emb_fraction=0.5), dict(rotary_emb_interleaved=True),
              dict(rotary_scaling_factor=2.0), dict(prenorm=True), dict(use_rms_norm=True),
              dict(qkv_proj_bias=True), dict(activation_function="gelu"),
              dict(rope_parameters={"rope_type": "yarn", "factor": 4.0})):
    with pytest.raises(CheckpointError) as e:
      nomic_table.model_config_from_hf({**remote, **bad})
    assert "\n" not in str(e.value), bad


# ---- state dicts ------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("head", HEADS)
def test_state_dict_round_trip_both_layouts(tmp_path, family, head):
  """transformers' modules' keys -> bertjax -> the same keys, and the published layout
  (what save_pretrained wrote) -> bertjax -> the same file, exactly, from either params
  layout."""
  table = TABLES[family]
  model = hf_model(family, head, num_labels=3)
  model.save_pretrained(str(tmp_path))
  with open(tmp_path / "config.json") as f:
    hf = json.load(f)
  saved = files.read_state_dict(str(tmp_path))
  current = state(model)
  cfg, params, task = table.load(hf, saved)
  assert ("mlm" in params) == (head == "ForMaskedLM") and ("head" in params) == (task is not None)
  _, params2, _ = table.load(hf, current)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    np.testing.assert_array_equal(a, b)
  if family == "gte" and head == "ForMaskedLM":  # Alibaba-NLP's NewForMaskedLM: 'new.'
    renamed = {("new." + k[4:] if k.startswith("gte.") else k): v for k, v in saved.items()}
    _, params3, _ = table.load(dict(hf, model_type="new"), renamed)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params3)):
      np.testing.assert_array_equal(a, b)
  for scan in (False, True):
    layout = family_of(cfg).to_layout(params, scan)
    back = table.params_to_hf(layout, cfg, task)
    assert sorted(back) == sorted(current), head
    for k, v in current.items():
      np.testing.assert_array_equal(back[k], v, err_msg=k)
    legacy = table.params_to_hf(layout, cfg, task, legacy=True)
    assert sorted(legacy) == sorted(saved), head
    for k, v in saved.items():
      np.testing.assert_array_equal(legacy[k], v, err_msg=k)


@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoint_errors(family):
  table = TABLES[family]
  model = hf_model(family)
  cfg, _, _ = table.load(model.config.to_dict(), state(model))
  current = state(model)
  decoder = {"gte": "lm_head.decoder.weight", "nomic_bert": "cls.predictions.decoder.weight"}
  untied = dict(current, **{decoder[family]: current[decoder[family]] + 1})
  with pytest.raises(CheckpointError, match="differs from the word embeddings"):
    table.params_from_hf(untied, cfg)
  lacking = {k: v for k, v in current.items() if "layers.1.mlp.up_proj" not in k}
  with pytest.raises(CheckpointError, match="lacks") as e:
    table.params_from_hf(lacking, cfg)
  assert "\n" not in str(e.value)
  seq = hf_model(family, "ForSequenceClassification")
  with pytest.raises(CheckpointError, match="name its task"):
    table.params_from_hf(state(seq), cfg)
  with pytest.raises(CheckpointError, match="'squad'"):
    table.param_table(cfg, "", task="squad")
  with pytest.raises(CheckpointError, match="'squad' model has no Hugging Face"):
    convert.check_exportable("squad", family)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("head", ["ForSequenceClassification", "ForTokenClassification"])
def test_finetuned_classes_export(tmp_path, family, head):
  """A task model's params export to the same class with the same logits (labels named
  in config.json); a classification head whose pooler is the head's own (fine-tuned
  from an encoder without one) exports to the same keys."""
  table, cls = TABLES[family], CLASSES[family] + head
  model = hf_model(family, head, num_labels=3)
  model.save_pretrained(str(tmp_path / "hf"))
  with open(tmp_path / "hf" / "config.json") as f:
    cfg, params, task = table.load(json.load(f), files.read_state_dict(str(tmp_path / "hf")))
  variants = [(cfg, params)]
  if task == "classification":  # the pooler moved into the head, the encoder without
    enc = {k: v for k, v in params["encoder"].items() if k != "pooler"}
    variants.append((dataclasses.replace(cfg, pooler=False),
                     dict(params, encoder=enc, head=dict(params["head"],
                                                         pooler=params["encoder"]["pooler"]))))
  ids, mask = _ids(1)
  ref = hf_outputs(model, ids, mask).logits.numpy()
  for k, (c, p) in enumerate(variants):
    hf_config, written = table.export(p, c, task, ["a", "b", "c"])
    assert hf_config["architectures"] == [cls] and hf_config["id2label"]["2"] == "c"
    files.write(str(tmp_path / f"out{k}"), hf_config, written)
    back = load_hf(str(tmp_path / f"out{k}"))
    np.testing.assert_allclose(hf_outputs(back, ids, mask).logits.numpy(), ref, atol=1e-6)


TEXTS = ["The quick brown fox jumps over the lazy dog.", "A tuple is immutable; a list is not!",
         "search_query: what is a tuple"]


@pytest.mark.parametrize("family,kind", [("gte", "sentencepiece"), ("gte", "wordpiece"),
                                         ("nomic_bert", "wordpiece")])
def test_tokenizers_both_ways(tmp_path, family, kind):
  """The family's kinds of tokenizer (mGTE: XLM-R's SentencePiece; gte-*-en-v1.5 and
  NomicBERT: bert-base-uncased's WordPiece): bertjax's written by `save_hf` beside the
  weights give transformers' AutoTokenizer bertjax's ids, and the folder transformers
  saves from it loads back into bertjax with the same ids."""
  from bertjax.data import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  tok = tok_lib.train_tokenizer(TEXTS * 20, kind, vocab_size=120, lowercase=kind == "wordpiece")
  cfg = family_of(family).config(vocab_size=tok.vocab_size, hidden_size=16, num_layers=1,
                                 num_heads=2, intermediate_size=16, pad_token_id=tok.pad_id)
  params = family_of(family).pretraining(cfg).init_params(jax.random.key(0))
  folder = str(tmp_path / "hf")
  assert convert.save_hf(folder, jax.tree.map(np.asarray, nn.unbox(params)), cfg, tok) == family
  theirs = transformers.AutoTokenizer.from_pretrained(folder)
  ours = [tok.build_inputs(tok.tokenize(t))[0] for t in TEXTS]
  assert [theirs(t)["input_ids"] for t in TEXTS] == [list(x) for x in ours]
  theirs.save_pretrained(str(tmp_path / "saved"))
  back = tok_lib.load_tokenizer(str(tmp_path / "saved"))
  assert [back.build_inputs(back.tokenize(t))[0] for t in TEXTS] == ours
