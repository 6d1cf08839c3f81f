"""Replaced-token detection ('rtd', bertjax/objectives/rtd.py): the corrupted rows and
their labels (samples written at the real predictions only, a sample equal to the
original is original, padding never replaced), Gumbel sampling at the softmax's
frequencies, the shared embeddings (ELECTRA's one array in the tree; DeBERTa-v3's GDES:
the generator's table plus the discriminator's residual, gradients disentangled), the loss and metrics as
ELECTRA defines them, the FLOPs of both networks, the one-line errors; a row's samples
drawn from its own key (the same in any micro-batch, on any device), so that gradient
accumulation over packed rows equals one step of the whole batch; then a tiny
pair pretrained on 8 CPU devices: resumed bit for bit after SIGTERMs, with gradient
accumulation and packed rows, exported as ElectraForPreTraining and ElectraForMaskedLM
that transformers loads and that predict as bertjax does, and fill_mask with the
generator."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax import convert as convert_cli, objectives as objectives_lib
from bertjax.checkpoint import workdir as workdir_lib
from bertjax.checkpoint.pretrained import load_pretrained
from bertjax.errors import ConfigError
from bertjax.model import family_of
from bertjax.objectives import rtd
from bertjax.train import pretrain
from tests import faults
from tests.helpers import synthetic_batch, tiny_config
from tests.rtd_helpers import rtd_config

STEPS = 20
pytestmark = pytest.mark.usefixtures("shared_trainers")  # reruns share one step


def test_corrupt_writes_samples_at_real_predictions_only():
  """A generator certain of one token per prediction: the original row (masks undone)
  gets it at the real predictions; a padding prediction (weight 0, at position 0)
  writes nothing; the labels are 1 where the token changed, 0 where the sample is
  the original or the position is padding."""
  batch = {"input_ids": jnp.array([[2, 9, 5, 9, 3, 0]]),  # 9 = [MASK]
           "attention_mask": jnp.array([[1, 1, 1, 1, 1, 0]]),
           "masked_lm_positions": jnp.array([[1, 3, 0]]),
           "masked_lm_ids": jnp.array([[7, 4, 0]]),
           "masked_lm_weights": jnp.array([[1.0, 1.0, 0.0]])}
  wanted = jnp.array([[7, 8, 6]])  # position 1 keeps its original 7; 3 gets 8
  logits = 100.0 * jax.nn.one_hot(wanted, 12)
  ids, labels = rtd.corrupt(batch, logits, jax.random.key(0))
  np.testing.assert_array_equal(ids, [[2, 7, 5, 8, 3, 0]])
  np.testing.assert_array_equal(labels, [[0, 0, 0, 1, 0, 0]])


def test_gumbel_samples_follow_the_softmax():
  """jax.random.categorical (Gumbel-max, ELECTRA's sample_from_softmax at temperature
  1) draws each token at its softmax probability, and no gradient flows through it."""
  probs = jnp.array([0.6, 0.3, 0.1, 0.0])
  logits = jnp.log(jnp.maximum(probs, 1e-30))[None, None]  # [1, 1, 4]
  batch = {"input_ids": jnp.zeros((1, 2), jnp.int32), "attention_mask": jnp.ones((1, 2)),
           "masked_lm_positions": jnp.array([[1]]), "masked_lm_ids": jnp.array([[3]]),
           "masked_lm_weights": jnp.ones((1, 1))}
  draws = jax.vmap(lambda k: rtd.corrupt(batch, logits, k)[0][0, 1])(
      jax.random.split(jax.random.key(1), 20000))
  np.testing.assert_allclose(np.bincount(np.asarray(draws), minlength=4) / 20000, probs,
                             atol=0.015)
  grad = jax.grad(lambda l: rtd.corrupt(batch, l, jax.random.key(0))[0].sum().astype(
      jnp.float32))(logits)
  assert not np.any(np.asarray(grad))


def _networks(config=None):
  objectives = objectives_lib.check(config or rtd_config())
  return objectives, objectives.networks


@pytest.mark.slow
def test_one_tree_with_the_embeddings_shared():
  """{'discriminator', 'generator'}: the generator holds no word, position or token-type
  table nor their LayerNorm, only its own projection; assembled it reads the
  discriminator's arrays, and its MLM head decodes with that word table."""
  _, networks = _networks()
  params = nn.unbox(jax.jit(networks.init)(jax.random.key(0)))
  assert sorted(params) == ["discriminator", "generator"]
  assert sorted(params["generator"]["encoder"]["embeddings"]) == ["embeddings_project"]
  assert sorted(params["generator"]) == ["encoder", "mlm"]
  assert sorted(params["discriminator"]) == ["encoder", "rtd"]
  gen = networks.member("generator").params(params)["encoder"]["embeddings"]
  for name in rtd.TIED:
    assert gen[name] is params["discriminator"]["encoder"]["embeddings"][name]
  # A gradient of the generator's loss reaches the shared table.
  batch = synthetic_batch(rtd_config(), 4)
  objectives = objectives_lib.from_config(rtd_config())
  grads = jax.jit(jax.grad(lambda p: objectives.loss(objectives.sums(p, batch, None),
                                                     objectives.counts(batch))))(params)
  word = grads["discriminator"]["encoder"]["embeddings"]["word_embeddings"]["embedding"]
  assert np.abs(np.asarray(word)).sum() > 0


def gdes_config():
  """The tiny DeBERTa-v3 (tests/deberta_helpers.py) with 'rtd': a generator of half its
  depth, GDES (the family's sharing)."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from tests import deberta_helpers  # pylint: disable=g-import-not-at-top
  c = tiny_config()
  c.model = deberta_helpers.model_section()
  c.objectives = ("rtd",)
  c.generator = ml_collections.ConfigDict({"num_layers": 1})
  return c


@pytest.mark.slow
def test_gdes_shares_the_generators_table_with_a_residual():
  """DeBERTa-v3's sharing: the generator owns the word table; the discriminator holds a
  zero residual and reads stop_gradient(generator's) + residual, so its loss trains
  the residual and never the generator (whose loss never reaches the residual);
  exported, the discriminator's table is the sum."""
  config = gdes_config()
  objectives, networks = _networks(config)
  assert rtd.embedding_sharing(config, "deberta") == "gdes"
  assert networks.member("generator").config.num_layers == 1
  params = nn.unbox(jax.jit(networks.init)(jax.random.key(0)))
  word = lambda tree: tree["encoder"]["embeddings"]["word_embeddings"]["embedding"]
  assert not np.any(np.asarray(word(params["discriminator"])))
  params = jax.tree.map(lambda x: x + 0.01, params)  # a residual off zero
  np.testing.assert_allclose(
      word(networks.member("discriminator").params(params)),
      word(params["generator"]) + word(params["discriminator"]), rtol=1e-6)
  assert word(networks.member("generator").params(params)) is word(params["generator"])
  batch = synthetic_batch(config, 4)
  counts = objectives.counts(batch)
  part = lambda key: jax.jit(jax.grad(lambda p: objectives.sums(p, batch, None)[key] / counts[
      "rtd" if key.startswith("rtd") else "generator"]))(params)
  disc_grads, gen_grads = part("rtd_weighted_loss"), part("generator_loss")
  assert not any(np.any(np.asarray(g)) for g in jax.tree.leaves(disc_grads["generator"]))
  assert np.abs(np.asarray(word(disc_grads["discriminator"]))).sum() > 0
  assert not np.any(np.asarray(word(gen_grads["discriminator"])))
  assert np.abs(np.asarray(word(gen_grads["generator"]))).sum() > 0


def test_loss_and_metrics_are_electras():
  """loss = the generator's mean cross-entropy + 50 x the mean BCE over non-padding
  tokens; precision and recall of 'replaced' and the replaced fraction by hand."""
  objectives, networks = _networks()
  params = nn.unbox(jax.jit(networks.init)(jax.random.key(0)))
  batch = synthetic_batch(rtd_config(), 4)
  out = jax.jit(lambda p, b: networks.forward(p, b, None))(params, batch)
  sums = jax.jit(lambda p, b: objectives.sums(p, b, None))(params, batch)
  counts = objectives.counts(batch)
  w, real = batch["masked_lm_weights"], batch["attention_mask"].astype(np.float32)
  xent = optax.softmax_cross_entropy_with_integer_labels(out["mlm_logits"],
                                                         batch["masked_lm_ids"])
  gen = float((xent * w).sum() / w.sum())
  labels = np.asarray(out["rtd_labels"])
  bce = float((optax.sigmoid_binary_cross_entropy(out["rtd_logits"], labels) * real).sum()
              / real.sum())
  np.testing.assert_allclose(objectives.loss(sums, counts), gen + 50 * bce, rtol=1e-5)
  pred = (np.asarray(out["rtd_logits"]) > 0) * real
  m = objectives.metrics(sums, counts)
  tp = (pred * labels).sum()
  np.testing.assert_allclose(m["rtd_precision"], tp / max(pred.sum(), 1), rtol=1e-6)
  np.testing.assert_allclose(m["rtd_recall"], tp / max(labels.sum(), 1), rtol=1e-6)
  np.testing.assert_allclose(m["replaced_fraction"], labels.sum() / real.sum(), rtol=1e-6)
  np.testing.assert_allclose(m["rtd_accuracy"], ((pred == labels) * real).sum() / real.sum(),
                             rtol=1e-6)
  assert labels.sum() > 0 and not np.any(labels * (1 - real))



def test_held_out_filler_rows_count_nothing():
  """A held-out batch's last rows may be fillers (`example_weights` 0: row 0 again, its
  [MASK]s in place but no prediction): they add nothing to any sum or count, so the
  metrics of 2 real rows + 2 fillers are those of the 2 rows alone. (Counted, the
  fillers' [MASK]s read as original tokens made a held-out precision of 0.10 where
  training's was 0.95.)"""
  objectives, networks = _networks()
  params = nn.unbox(jax.jit(networks.init)(jax.random.key(0)))
  batch = synthetic_batch(rtd_config(), 4)
  filler = {k: np.concatenate([v[:2], v[:1], v[:1]]) for k, v in batch.items()}
  filler["masked_lm_weights"][2:] = 0
  filler["example_weights"] = np.asarray([1, 1, 0, 0], np.float32)
  alone = {k: v[:2] for k, v in batch.items()}
  sums = jax.jit(lambda p, b: objectives.sums(p, b, None))
  got, want = sums(params, filler), sums(params, alone)
  assert sorted(got) == sorted(want)
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
  for k, v in objectives.counts(alone).items():
    np.testing.assert_allclose(objectives.counts(filler)[k], v)
  labels = np.asarray(networks.forward(params, filler, None)["rtd_labels"])
  assert labels[:2].sum() > 0 and not labels[2:].any()

def test_flops_count_both_networks():
  """The step's FLOPs: the generator's (its MLM head at P predictions) plus the
  discriminator's at every position (no MLM head; its detector per token)."""
  objectives, _ = _networks()
  B, T, P = 8, 16, 4
  family = family_of(objectives.model)
  gen = family.train_flops(objectives.networks.member("generator").config, B, T, P)
  disc = family.train_flops(objectives.model, B, T, 0)
  assert disc["mlm_head"] == 0
  assert objectives.train_flops(B, T, P)["total"] == gen["total"] + disc["total"]


@pytest.mark.parametrize("change, message", [
    ("bert", r"the 'rtd' objective .* reads the 'rtd' head, which the 'bert' family does "
             r"not have"),
    ("wide", r"config.generator.hidden_size=64 exceeds the discriminator's "
             r"config.model.hidden_size=32"),
    ("no_generator", r"the 'rtd' objective needs config.generator"),
    ("with_mlm", r"'rtd' trains its own generator .* give config.objectives=\('rtd',\) "
                 r"alone"),
    ("lambda", r"config.rtd.discriminator_weight=0.0 must be positive"),
    ("sharing", r"config.rtd.embedding_sharing='all': use 'tied'"),
])
def test_errors_are_one_line(change, message):
  if change == "bert":
    config = tiny_config()
    config.objectives = ("rtd",)
  else:
    config = rtd_config()
    if change == "wide":
      config.generator.hidden_size = 64
    elif change == "no_generator":
      del config.generator
    elif change == "with_mlm":
      config.objectives = ("mlm", "rtd")
    elif change == "sharing":
      config.rtd.embedding_sharing = "all"
    else:
      config.rtd.discriminator_weight = 0.0
  with pytest.raises(ConfigError, match=message) as e:
    pretrain.check_config(config)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_a_rows_samples_depend_on_its_index_alone(impl):
  """`corrupt` with the step's row keys (`objectives.base.row_keys`): the rows of each strided
  micro-batch (rows i, i + A, ...: gradient accumulation's) are corrupted as in the
  whole batch, also from an RBG step key (whose bits under vmap would come from the
  first row's key alone); on the 8-device mesh, rows sharded over 'data', the same
  rows as on one device, with no collective in the program (each device draws its own
  rows' noise)."""
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  from bertjax.train import step as step_lib  # pylint: disable=g-import-not-at-top
  batch = {k: jnp.asarray(v) for k, v in synthetic_batch(rtd_config(), 16).items()}
  logits = jax.random.normal(jax.random.key(3), (16, 4, 400)) * 0.5  # [B, P, V]
  key = jax.random.key(7, impl=impl)

  def corrupted(b, l, rows):
    return rtd.corrupt(b, l, step_lib.row_keys(key, rows))[0]

  rows = jnp.arange(16)
  whole = np.asarray(jax.jit(corrupted)(batch, logits, rows))
  for accum in (2, 4):
    for i in range(accum):
      part = jax.jit(corrupted)({k: v[i::accum] for k, v in batch.items()},
                                logits[i::accum], rows[i::accum])
      np.testing.assert_array_equal(part, whole[i::accum], err_msg=f"{accum} {i}")
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  data = lambda x: jax.device_put(x, NamedSharding(mesh, PartitionSpec("data")))  # noqa: E731
  with jax.set_mesh(mesh):
    sharded = jax.jit(lambda b, l: corrupted(b, l, jnp.arange(16)),
                      out_shardings=NamedSharding(mesh, PartitionSpec("data")))
    args = (jax.tree.map(data, batch), data(logits))
    np.testing.assert_array_equal(sharded(*args), whole)
    text = sharded.lower(*args).compile().as_text()
  for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute"):
    assert op not in text, op


def _packed_batch(config, rows: int, seed: int) -> dict:
  """`rows` packed rows (synthetic_batch's ids): two or three documents a row
  (`segment_ids` 1.., 0 on padding; `position_ids` restarting in each), one segment."""
  batch = synthetic_batch(config, rows, seed)
  rng = np.random.default_rng(seed)
  real = batch["attention_mask"].sum(1)
  T = batch["input_ids"].shape[1]
  segments = np.zeros_like(batch["input_ids"])
  positions = np.zeros_like(batch["input_ids"])
  for r, n in enumerate(real):
    cuts = np.sort(rng.choice(np.arange(2, n - 1), rng.integers(1, 3), replace=False))
    starts = np.concatenate([[0], cuts])
    for k, (a, b) in enumerate(zip(starts, [*cuts, n])):
      segments[r, a:b], positions[r, a:b] = k + 1, np.arange(b - a)
  assert T == segments.shape[1] and (segments.max(1) >= 2).all()
  batch.update(segment_ids=segments, position_ids=positions,
               token_type_ids=np.zeros_like(segments))
  return batch


def _steps(config, batches, params=None):
  """Steps of the jitted train step on the 8-device mesh from the seed's initial state
  (its parameters `params` where given, copied: the step donates them): (each step's
  metrics, the initial and the final parameters), on the host."""
  from bertjax.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  t = state_lib.build_trainer(config)
  params = t.init_params(config) if params is None else params
  state = t.init_state(config, jax.tree.map(jnp.copy, params))
  metrics = []
  with jax.set_mesh(t.mesh), nn.logical_axis_rules(t.rules):
    for batch in batches:
      state, m = t.train_step(state, mesh_lib.put_batch(batch, t.batch_sharding))
      metrics.append(jax.device_get({k: v for k, v in m.items() if k != "window"}))
  return metrics, params, jax.device_get(state.params)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["electra", "deberta"])
def test_accumulated_packed_rows_equal_one_batch(family):
  """Gradient accumulation over 2 and 4 micro-batches of packed rows equals one step of
  the whole batch (32 rows on the 8-device mesh: 4 rows a device; at 4 micro-batches,
  1): the generator's samples of a row are drawn from its own key (the step's key and
  the row's index in the batch, `objectives.base.row_keys`), so every micro-batch corrupts its rows
  as the whole batch does. Two steps (the schedule's first has a learning rate of 0; the
  second's Adam update weighs both steps' gradients): every metric (losses, replaced
  fraction, grad norm) to 1e-6 relative (+1e-7), every parameter to 1e-6 relative + 5e-8
  absolute: float32 sums in another order (measured on the CPU: metrics 2.2e-7;
  parameters 1 ulp, and 6.7e-9 on DeBERTa's residual table, whose small gradients Adam
  divides by their own size; 5e-8 is 1e-4 of the learning rate, the size of a
  parameter's move). Another sample in one row moves its tokens' rows by about the
  learning rate; per-micro-batch keys failed at the first step's grad norm (2e-3
  relative). No dropout: its masks are drawn per micro-batch (a micro-batch's shape, its
  own key)."""
  config = rtd_config(batch_size=32) if family == "electra" else gdes_config()
  config.train.batch_size = 32
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  batches = [_packed_batch(config, 32, seed) for seed in (0, 1)]
  whole, initial, params = _steps(config, batches)
  assert 0 < whole[0]["replaced_fraction"] < 0.5
  for accum in (2, 4):
    config.train.grad_accum_steps = accum
    got, _, got_params = _steps(config, batches, initial)
    for step, (a, b) in enumerate(zip(got, whole)):
      for k in b:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7,
                                   err_msg=f"{family} accum={accum} step {step} {k}")
    for path, a in jax.tree_util.tree_leaves_with_path(got_params):
      b = params
      for p in path:
        b = b[p.key]
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=5e-8,
                                 err_msg=f"{family} accum={accum} {jax.tree_util.keystr(path)}")


# ---- A tiny pair pretrained on 8 CPU devices -----------------------------------------

@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """One uninterrupted run of 20 steps."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  pretrain.run(rtd_config(), workdir)
  return workdir


@pytest.mark.slow
def test_the_pair_trains_and_logs_its_metrics(reference):
  rows = faults.train_rows(reference)
  assert sorted(rows) == [3, 6, 9, 12, 15, 18, 20]
  for name in ("generator_loss", "generator_accuracy", "rtd_loss", "rtd_accuracy",
               "rtd_precision", "rtd_recall", "replaced_fraction"):
    assert np.isfinite(rows[20][name]), name
  assert 0 < rows[20]["replaced_fraction"] < 0.2
  assert rows[20]["loss"] < rows[3]["loss"]
  evals = [r for r in faults.metrics(reference) if r["split"] == "eval"]
  assert evals and "rtd_recall" in evals[-1]


@pytest.mark.slow
def test_sigterm_resumes_bit_for_bit(reference, on_train_batch, tmp_path):
  """SIGTERM before steps 4 and 13; each run saves and returns, the next resumes: the
  metrics and the final state (both networks, the optimizer, the data position) equal
  the uninterrupted run's bit for bit (the samples are drawn from the step's key)."""
  kill_at, workdir, done = [4, 13], str(tmp_path / "preempted"), 0
  for _ in range(len(kill_at) + 1):
    pending = [s - done for s in kill_at if s > done]
    on_train_batch(lambda n, _, first=pending[:1]: n in first and os.kill(os.getpid(),
                                                                          signal.SIGTERM))
    pretrain.run(rtd_config(), workdir)
    done = int(faults.saved_state(workdir)["step"])
  assert done == STEPS
  faults.assert_same_metrics(workdir, reference)
  faults.assert_same_arrays(faults.saved_state(workdir), faults.saved_state(reference))


@pytest.mark.slow
def test_accumulation_and_packed_rows_train(tmp_path):
  """Gradient accumulation over 2 micro-batches of packed rows with isolated documents
  (segment ids) on the 8-device mesh: finite metrics, a falling loss."""
  config = rtd_config(grad_accum_steps=2, batch_size=16, num_steps=12, log_every=4,
                      eval_every=12, checkpoint_every=12)
  config.data.packing, config.data.isolate_documents = "full_sentences", True
  pretrain.run(config, str(tmp_path))
  rows = faults.train_rows(str(tmp_path))
  assert all(np.isfinite(r["rtd_loss"]) for r in rows.values())
  assert rows[12]["loss"] < rows[4]["loss"]


@pytest.mark.slow
def test_export_writes_both_networks_transformers_agrees(reference, tmp_path):
  """convert --to=hf writes the discriminator (ElectraForPreTraining) in DST and the
  generator (ElectraForMaskedLM) in DST/generator; transformers' logits on them equal
  bertjax's of the workdir's networks."""
  transformers = pytest.importorskip("transformers")
  import torch  # pylint: disable=g-import-not-at-top
  dst = tmp_path / "hf"
  convert_cli.main(["--to=hf", f"--src={reference}", f"--dst={dst}"])
  text = ["the module returns a list of the names"]
  for name, cls, key in (("discriminator", "ElectraForPreTraining", "rtd_logits"),
                         ("generator", "ElectraForMaskedLM", "mlm_logits")):
    directory = dst if name == "discriminator" else dst / "generator"
    model = getattr(transformers, cls).from_pretrained(
        directory, attn_implementation="eager").eval()
    assert type(model).__name__ == cls
    ours = load_pretrained(reference, network=name).logits(text, max_length=16)
    with torch.no_grad():
      theirs = model(torch.as_tensor(ours["input_ids"], dtype=torch.long),
                     attention_mask=torch.as_tensor(ours["attention_mask"])).logits.numpy()
    assert np.abs(ours[key] - theirs).max() < 1e-4


@pytest.mark.slow
def test_fill_mask_uses_the_generator(reference):
  assert workdir_lib.masked_lm_network(reference) == "generator"
  assert workdir_lib.other_networks(reference) == ("generator",)
  # The command itself (its own process: other modules' required flags live in this one's).
  out = subprocess.run([sys.executable, "-m", "bertjax.fill_mask", f"--checkpoint={reference}",
                        "--top_k=3", "the [MASK] returns a list ."], capture_output=True,
                       text=True, check=True).stdout
  assert "mask 1:" in out and len(out.splitlines()[1].split()) == 2 + 2 * 3
