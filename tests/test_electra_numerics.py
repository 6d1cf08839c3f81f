"""ELECTRA computes what transformers computes (float32, random weights moved off their
initial values and copied through `bertjax.hf.electra`): `ElectraForPreTraining`
(the discriminator) and `ElectraForMaskedLM` (the generator), hidden states and
logits, on padded rows and on packed rows (each document against transformers on it
alone, positions restarting per document as BERT's pipeline gives them), scanned and
unscanned, with an embedding size below the hidden size (projected) and equal to it;
gradients on padded rows; full-size parameter counts of the released discriminators
and generators equal Hugging Face's (eval_shape / meta device: no memory), and the
recipes' sections build exactly those."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import model as model_lib
from bertjax.errors import ConfigError
from bertjax.hf import electra as conv
from bertjax.model import electra as el
from configs import electra_base, electra_large, electra_small, electra_tiny
from tests.helpers import perturb

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 1e-5
T, VOCAB = 16, 64
NETWORKS = {"discriminator": ("ElectraForPreTraining", "rtd"),
            "generator": ("ElectraForMaskedLM", "mlm")}
EMBEDDING = {"projected": 16, "unprojected": 32}  # hidden size 32
# The fast tier checks the discriminator with a projected embedding (padded rows
# unscanned, packed rows scanned, gradients); the other networks and layouts are slow.
FAST = ("discriminator", "projected")
SLOW = pytest.mark.slow


def _scans(fast: bool):
  """[False, True] (unscanned, scanned) with the other one marked slow."""
  return [pytest.param(scan, id=name, marks=() if scan == fast else SLOW)
          for scan, name in ((False, "unscanned"), (True, "scanned"))]


def _state(model):
  return {k: v.detach().numpy() for k, v in model.state_dict().items()}


NETWORK_PARAMS = [pytest.param((n, e), id=f"{n}-{e}", marks=() if (n, e) == FAST else SLOW)
                  for n in NETWORKS for e in EMBEDDING]
# The generator with a projected embedding is every family's tiny ELECTRA
# (tests/test_family_conformance.py: its padded and packed rows against transformers).
NOT_CONFORMANCE = [p for p in NETWORK_PARAMS if p.id != "generator-projected"]


@pytest.fixture(scope="module", params=NETWORK_PARAMS)
def network(request):
  """(transformers model, our config, our params, head name) of one network."""
  name, embedding = request.param
  cls, head = NETWORKS[name]
  config = transformers.ElectraConfig(
      vocab_size=VOCAB, embedding_size=EMBEDDING[embedding], hidden_size=32,
      num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
      max_position_embeddings=T + 8, attn_implementation="eager")
  torch.manual_seed(0)
  model = perturb(getattr(transformers, cls)(config))
  cfg, params, task = conv.load(dict(config.to_dict(), architectures=[cls]), _state(model))
  assert task is None and set(params) == {"encoder", head} and cfg.rtd == (head == "rtd")
  return model, cfg, params, head


def _ours(cfg, params, head, scan, ids, mask, **inputs):
  """(hidden states [L+1, B, T, E], the head's logits) of our model."""
  cfg = el.ElectraConfig.from_config({**cfg.to_dict(), "scan_layers": scan})
  model = el.FAMILY.pretraining(cfg, (head,))
  params = el.FAMILY.to_layout(params, scan)
  # Jitted: one compiled program each, not an eager dispatch of every op.
  hidden = jax.jit(lambda p, i: model.apply({"params": p}, ids, mask, method=lambda m, *a: (
      m.encoder(*a, output_hidden_states=True, **i))))(params, inputs)["hidden_states"]
  logits = jax.jit(lambda p, i: model.apply({"params": p}, ids, mask, **i))(
      params, inputs)[f"{head}_logits"]
  return np.asarray(hidden), np.asarray(logits)


def _hf(model, ids, mask=None):
  with torch.no_grad():
    out = model(torch.as_tensor(ids, dtype=torch.long),
                attention_mask=None if mask is None else torch.as_tensor(mask),
                output_hidden_states=True)
  return np.stack([h.numpy() for h in out.hidden_states]), out.logits.numpy()


def _ids(rng, shape):
  return rng.integers(3, VOCAB, shape).astype(np.int32)


@pytest.mark.parametrize("network", NOT_CONFORMANCE, indirect=True)
@pytest.mark.parametrize("scan", _scans(False))
def test_padded_rows_match_hf(network, scan):
  model, cfg, params, head = network
  lengths = [T, 11, 4]
  mask = (np.arange(T)[None] < np.array(lengths)[:, None]).astype(np.int32)
  ids = np.where(mask > 0, _ids(np.random.default_rng(0), (3, T)), 0)
  hidden, logits = _ours(cfg, params, head, scan, ids, mask)
  ref_hidden, ref_logits = _hf(model, ids, mask)
  real = mask.astype(bool)
  dh = np.abs(hidden - ref_hidden)[:, real].max()
  dl = np.abs(logits - ref_logits)[real].max()
  print(f"padded {head} D={cfg.embedding_size} scan={scan}: max |dh|={dh:.2e} "
        f"max |dlogits|={dl:.2e}")
  assert dh < ATOL and dl < ATOL


@pytest.mark.parametrize("network", NOT_CONFORMANCE, indirect=True)
@pytest.mark.parametrize("scan", _scans(True))
def test_packed_rows_match_each_document_alone(network, scan):
  """Three documents in one row (+ padding): no attention across them, positions and
  token types as BERT's packing gives them (positions from 0 in each document)."""
  model, cfg, params, head = network
  rng = np.random.default_rng(1)
  docs = [_ids(rng, (n,)) for n in (7, 5, 3)]  # + one padding token: T = 16
  ids, seg, pos = (np.zeros((1, T), np.int32) for _ in range(3))
  at = 0
  for s, doc in enumerate(docs):
    ids[0, at:at + len(doc)], seg[0, at:at + len(doc)] = doc, s + 1
    pos[0, at:at + len(doc)] = np.arange(len(doc))
    at += len(doc)
  hidden, logits = _ours(cfg, params, head, scan, ids, (seg > 0).astype(np.int32),
                         segment_ids=seg, position_ids=pos)
  dh = dl = 0.0
  at = 0
  for doc in docs:
    ref_hidden, ref_logits = _hf(model, doc[None])
    span = slice(at, at + len(doc))
    dh = max(dh, np.abs(hidden[:, 0, span] - ref_hidden[:, 0]).max())
    dl = max(dl, np.abs(logits[0, span] - ref_logits[0]).max())
    at += len(doc)
  print(f"packed {head} D={cfg.embedding_size} scan={scan}: max |dh|={dh:.2e} "
        f"max |dlogits|={dl:.2e}")
  assert dh < ATOL and dl < ATOL


def _loss(head, logits, labels, mask):
  """Summed over the real tokens: cross-entropy (the generator's, at labelled positions)
  or binary cross-entropy (the discriminator's); `labels` [B, T]."""
  if head == "mlm":
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), jnp.maximum(labels, 0)[..., None],
                                 -1)[..., 0]
    return -jnp.sum(jnp.where(labels >= 0, picked, 0.0))
  xent = jnp.logaddexp(0.0, logits) - labels * logits
  return jnp.sum(xent * mask)


def test_gradients_equal_transformers(network):
  """Every parameter's gradient of the head's summed loss on padded rows, torch's
  mapped through the same table as the weights, within 1e-4 of that gradient's
  largest magnitude (at least 1e-3 of the network's largest: the attention key
  biases' gradients are zero in exact arithmetic, rounding noise of ~1e-10 on both
  sides)."""
  model, cfg, params, head = network
  rng = np.random.default_rng(2)
  mask = (np.arange(T)[None] < np.array([[T], [9]])).astype(np.int32)
  ids = np.where(mask > 0, _ids(rng, (2, T)), 0)
  labels = (np.where(rng.random((2, T)) < 0.3, ids, -100) if head == "mlm"
            else rng.integers(0, 2, (2, T)))
  labels = np.where(mask > 0, labels, -100 if head == "mlm" else 0)
  net = el.FAMILY.pretraining(cfg, (head,))
  ours = jax.jit(jax.grad(lambda p: _loss(head, net.apply({"params": p}, ids, mask)[
      f"{head}_logits"], jnp.asarray(labels), jnp.asarray(mask))))(params)
  model.zero_grad(set_to_none=True)
  out = model(torch.as_tensor(ids, dtype=torch.long), attention_mask=torch.as_tensor(mask))
  if head == "mlm":
    loss = torch.nn.functional.cross_entropy(
        out.logits.reshape(-1, VOCAB), torch.as_tensor(labels, dtype=torch.long).reshape(-1),
        ignore_index=-100, reduction="sum")
  else:
    loss = (torch.nn.functional.binary_cross_entropy_with_logits(
        out.logits, torch.as_tensor(labels, dtype=torch.float32), reduction="none")
            * torch.as_tensor(mask)).sum()
  loss.backward()
  grads = {k: p.grad.numpy().copy() for k, p in model.state_dict(keep_vars=True).items()}
  _, theirs, _ = conv.load(dict(model.config.to_dict(),
                                architectures=[NETWORKS["discriminator" if head == "rtd"
                                                        else "generator"][0]]), grads)
  assert jax.tree.structure(theirs) == jax.tree.structure(ours)
  floor = 1e-3 * max(float(np.abs(b).max()) for b in jax.tree.leaves(theirs))
  worst = max(float(np.abs(np.asarray(a) - b).max() / max(np.abs(b).max(), floor))
              for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)))
  print(f"gradients {head} D={cfg.embedding_size}: worst relative diff {worst:.2e}")
  assert worst < 1e-4


# ---- Full-size parameter counts ---------------------------------------------------

# The released checkpoints' config.json sizes (google/electra-{small,base,large}-
# {discriminator,generator}; vocabulary 30522, 512 positions, 2 token types: the
# ElectraConfig defaults). The released small generator is as wide as its discriminator
# (google-research/electra's README: "we did not use a small generator for that model").
RELEASED = {
    "small-discriminator": dict(embedding_size=128, hidden_size=256, num_hidden_layers=12,
                                num_attention_heads=4, intermediate_size=1024),
    "small-generator": dict(embedding_size=128, hidden_size=256, num_hidden_layers=12,
                            num_attention_heads=4, intermediate_size=1024),
    "base-discriminator": dict(embedding_size=768, hidden_size=768, num_hidden_layers=12,
                               num_attention_heads=12, intermediate_size=3072),
    "base-generator": dict(embedding_size=768, hidden_size=256, num_hidden_layers=12,
                           num_attention_heads=4, intermediate_size=1024),
    "large-discriminator": dict(embedding_size=1024, hidden_size=1024,
                                num_hidden_layers=24, num_attention_heads=16,
                                intermediate_size=4096),
    "large-generator": dict(embedding_size=1024, hidden_size=256, num_hidden_layers=24,
                            num_attention_heads=4, intermediate_size=1024),
}
RECIPES = {"small": electra_small, "base": electra_base, "large": electra_large}


def _count(tree) -> int:
  return sum(x.size for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("name", list(RELEASED))
@pytest.mark.parametrize("scan", _scans(True))  # Unscanned: 2-5 s each.
def test_full_size_parameter_counts_equal_hf(name, scan):
  size, network = name.split("-")
  cls, head = NETWORKS[network]
  hf_config = transformers.ElectraConfig(**RELEASED[name])
  cfg = el.ElectraConfig.from_config({**conv.model_config_from_hf(
      hf_config.to_dict(), rtd=head == "rtd").to_dict(), "scan_layers": scan})
  boxed = jax.eval_shape(el.FAMILY.pretraining(cfg, (head,)).init_params,
                         jax.random.key(0))
  for leaf in jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned)):
    assert isinstance(leaf, nn.Partitioned) and len(leaf.names) == leaf.value.ndim
  params = nn.unbox(boxed)
  with torch.device("meta"):
    hf_model = getattr(transformers, cls)(hf_config)
  hf_count = lambda m: sum(p.numel() for p in m.parameters())  # the tied decoder once
  print(f"electra-{name}: encoder ours {_count(params['encoder']):,} HF "
        f"{hf_count(hf_model.electra):,}; with its head ours {_count(params):,} HF "
        f"{hf_count(hf_model):,}")
  assert _count(params["encoder"]) == hf_count(hf_model.electra)
  assert _count(params) == hf_count(hf_model)


@pytest.mark.parametrize("size", [pytest.param(s, marks=SLOW) if s == "large" else s
                                  for s in RECIPES])
def test_recipes_build_the_released_networks(size):
  """Each recipe's config.model is the released discriminator (with its 'rtd' head);
  its generator (`generator_config` of config.generator) is Table 6's size, which for
  base and large is the released generator; the small recipe's generator is the
  paper's 1/4 (the released one is full width, see RELEASED)."""
  c = RECIPES[size].get_config()
  disc = model_lib.config_from(c.model)
  assert isinstance(disc, el.ElectraConfig) and disc.rtd
  # The network, in the platform's compute dtype (the recipe's '': bf16 on a GPU).
  hf = lambda name, **kw: dataclasses.replace(conv.model_config_from_hf(
      transformers.ElectraConfig(**RELEASED[name]).to_dict(), **kw), dtype=disc.dtype)
  assert disc == hf(f"{size}-discriminator", rtd=True)
  gen = el.generator_config(disc, c.generator)
  if size == "small":
    assert (gen.hidden_size, gen.num_heads, gen.intermediate_size) == (64, 1, 256)
  else:
    assert gen == hf(f"{size}-generator")
  shapes = lambda cfg: jax.tree.map(lambda x: x.shape, jax.eval_shape(
      el.FAMILY.pretraining(cfg).init_params, jax.random.key(0))["encoder"]["embeddings"])
  tied = ("word_embeddings", "position_embeddings", "token_type_embeddings", "LayerNorm")
  assert ({k: v for k, v in nn.unbox(shapes(disc)).items() if k in tied}
          == {k: v for k, v in nn.unbox(shapes(gen)).items() if k in tied})


def test_generator_sizes_and_config_errors_are_one_line():
  disc = model_lib.config_from(electra_tiny.get_config().model)
  for sizes, match in ((dict(hidden_size=2 * disc.hidden_size), "exceeds the discriminator"),
                       (dict(vocab_size=10), "sets only")):
    with pytest.raises(ConfigError, match=match) as e:
      el.generator_config(disc, sizes)
    assert "\n" not in str(e.value)
  for bad in (dict(embedding_size=0), dict(num_heads=5), dict(summary_dropout=1.0),
              dict(classifier_dropout_rate=-0.1)):
    with pytest.raises(ConfigError):
      el.ElectraConfig(**bad)
  with pytest.raises(ConfigError, match="'electra' family's fields"):
    model_lib.config_from({"family": "bert", "embedding_size": 128})
