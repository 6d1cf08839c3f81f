"""Sharded training on the 8-device CPU mesh: data parallel, FSDP and tensor parallel
(and their mixes) match one device after 3 steps; BERT-base parameter shardings
against a golden file; the tensor-sharded vocabulary is never gathered for the MLM
loss; a checkpoint written on one mesh restores onto another."""

import json
import os
import re

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax.checkpoint import manager as ckpt_lib
from bertjax.errors import ConfigError
from bertjax.parallel import mesh as mesh_lib
from bertjax.train import state as state_lib, step as step_lib
from configs import bert_base
from tests.helpers import synthetic_batch, tiny_config

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "bert_base_shardings.json")
VOCAB = 1000  # Divisible by 8; no other dimension of the tiny model equals it.
COLLECTIVE = re.compile(r"= (\S+) (all-gather|all-reduce|reduce-scatter|all-to-all|"
                        r"collective-permute)(-start)?\(")


def parallel_config(data, fsdp, tensor):
  c = tiny_config()
  c.model.vocab_size = VOCAB
  c.model.num_heads = 4  # One head per device at tensor=4.
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = data, fsdp, tensor
  return c


def _compiled_step(config, devices=None):
  """(jitted step, state, batch sharding, mesh, rules) on the config's mesh."""
  t = state_lib.build_trainer(config, mesh_lib.create_mesh(config.mesh, devices))
  return t.train_step, t.init_state(config), t.batch_sharding, t.mesh, t.rules


def train_3_steps(config, devices=None):
  step, state, bsh, mesh, rules = _compiled_step(config, devices)
  losses = []
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    for seed in range(3):
      state, m = step(state, mesh_lib.put_batch(synthetic_batch(config, 8, seed), bsh))
      losses.append(float(m["loss"]))
  return state, losses


@pytest.fixture(scope="module")
def single_device():
  return train_3_steps(parallel_config(1, 1, 1), jax.devices()[:1])


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 2, 4)])
def test_mesh_layouts_match_one_device(single_device, shape):
  ref_state, ref_losses = single_device
  state, losses = train_3_steps(parallel_config(*shape))
  assert dict(jax.tree.leaves(state.params)[0].sharding.mesh.shape) == dict(
      zip(mesh_lib.AXES, shape))
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  assert losses[-1] < losses[0]
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(state.params),
                          jax.tree.leaves(ref_state.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6,
                               err_msg=jax.tree_util.keystr(path))


def bert_base_specs(shape=(2, 2, 2)) -> dict[str, list]:
  """{parameter path: mesh axes per dimension} for BERT-base (eval_shape, no memory);
  the 12 layers share one entry per path, `layer_*` (asserted equal)."""
  c = bert_base.get_config()
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = shape
  _, boxed = state_lib.abstract_state(c)
  shardings = mesh_lib.logical_shardings(boxed, mesh_lib.create_mesh(c.mesh), c.logical_axis_rules)
  specs: dict[str, list] = {}
  for path, s in jax.tree_util.tree_leaves_with_path(shardings.params):
    key = re.sub(r"layer_\d+", "layer_*", "/".join(p.key for p in path))
    spec = [list(a) if isinstance(a, tuple) else a for a in s.spec]
    assert specs.setdefault(key, spec) == spec, key
  return specs


def test_bert_base_parameter_shardings_match_golden():
  with open(GOLDEN) as f:
    golden = json.load(f)
  assert bert_base_specs() == golden
  # FSDP shards the optimizer state exactly like the parameters.
  c = bert_base.get_config()
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 2
  _, boxed = state_lib.abstract_state(c)
  sh = mesh_lib.logical_shardings(boxed, mesh_lib.create_mesh(c.mesh), c.logical_axis_rules)
  adam = sh.opt_state[1][0]
  assert jax.tree.map(lambda s: s.spec, adam.mu) == jax.tree.map(lambda s: s.spec, sh.params)
  assert jax.tree.map(lambda s: s.spec, adam.nu) == jax.tree.map(lambda s: s.spec, sh.params)


def test_indivisible_dimensions_fall_back_to_replication():
  """BERT's 30522-token vocabulary over tensor=4: the vocab dimension is replicated,
  the hidden dimension stays FSDP-sharded, divisible weights stay tensor-sharded."""
  specs = bert_base_specs((1, 2, 4))
  assert specs["encoder/embeddings/word_embeddings/embedding"] == [None, "fsdp"]
  assert specs["mlm/bias"] == [None]
  assert specs["encoder/layer_*/intermediate/kernel"] == ["fsdp", "tensor"]


def _gathered_vocab(config) -> list[str]:
  """Collectives in the compiled train step whose result has a full-vocabulary dim."""
  step, state, bsh, mesh, rules = _compiled_step(config)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=bsh)
           for k, v in synthetic_batch(config, 8).items()}
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    hlo = step.lower(state, batch).compile().as_text()
  found = []
  for m in COLLECTIVE.finditer(hlo):
    dims = [int(d) for d in re.findall(r"\d+", m.group(1).split("{")[0].split("[", 1)[-1])]
    if VOCAB in dims:
      found.append(m.group(0))
  return found


@pytest.mark.slow
def test_tensor_sharded_vocabulary_is_never_gathered():
  """The MLM logits [B, P, vocab] stay sharded over 'tensor' through the softmax
  cross-entropy: GSPMD reduces max/sum over the shards and gathers no vocab-sized
  array (the tied embedding [vocab, E] is only gathered over 'fsdp', per shard)."""
  assert _gathered_vocab(parallel_config(1, 2, 4)) == []
  # The check sees a gather when there is one: logits replicated over the vocabulary
  # while the embedding is vocab-sharded.
  c = parallel_config(1, 2, 4)
  c.logical_axis_rules = tuple((k, None if k == "activation_vocab" else v)
                               for k, v in c.logical_axis_rules)
  assert _gathered_vocab(c)


@pytest.mark.slow
def test_checkpoint_restores_onto_another_mesh(tmp_path):
  """Saved from (8, 1, 1) on 8 devices, restored onto (1, 2, 2) on 4 devices and onto
  (1, 2, 4): same values, the new shardings; training continues on the new mesh."""
  config = parallel_config(8, 1, 1)
  state, _ = train_3_steps(config)
  saver = ckpt_lib.Checkpointer(str(tmp_path))
  saver.save(3, state.fields(), None, force=True)
  saver.wait()
  saver.close()
  expected = jax.device_get(state)
  abstract, boxed = state_lib.abstract_state(config)
  for shape, devices in (((1, 2, 2), jax.devices()[:4]), ((1, 2, 4), None)):
    c = parallel_config(*shape)
    mesh = mesh_lib.create_mesh(c.mesh, devices)
    shardings = mesh_lib.logical_shardings(boxed, mesh, c.logical_axis_rules)
    restored = step_lib.TrainState(**ckpt_lib.Checkpointer(
        str(tmp_path), read_only=True).restore(3, ckpt_lib.abstract_on(abstract,
                                                                       shardings).fields()))
    kernel = restored.params["encoder"]["layer_0"]["intermediate"]["kernel"]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    assert len(kernel.sharding.device_set) == len(devices or jax.devices())
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), expected)


def test_saving_replicated_arrays_compiles_nothing_on_one_process(tmp_path):
  """On one process a replicated array is written whole, not as each replica's slice:
  orbax's replica-parallel writing compiled a slice program per array and replica at a
  process's first save (400 for these 50 arrays); the values come back."""
  replicated = jax.sharding.NamedSharding(jax.make_mesh((8,), ("data",)),
                                          jax.sharding.PartitionSpec())
  tree = {f"w{i}": jax.device_put(np.full((40 + i, 8), i, np.float32), replicated)
          for i in range(50)}
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, seconds, **_: compiles.append(event)
      if event == "/jax/core/compile/backend_compile_duration" else None)
  saver = ckpt_lib.Checkpointer(str(tmp_path))
  saver.save(1, tree, None, force=True)
  saver.wait()
  assert not compiles
  restored = ckpt_lib.Checkpointer(str(tmp_path), read_only=True).restore(
      1, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      tree))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(tree))


def test_mesh_sizes_and_errors():
  c = parallel_config(-1, 2, 2)
  assert mesh_lib.mesh_shape(c.mesh, 8) == (2, 2, 2)
  with pytest.raises(ConfigError, match="needs 16 devices but 8"):
    mesh_lib.mesh_shape(parallel_config(4, 2, 2).mesh, 8)
  c.mesh.dcn_data = 3
  with pytest.raises(ConfigError, match="3 slices"):
    mesh_lib.create_mesh(c.mesh)
  c.mesh.dcn_data = 2  # 2 "slices" but one process: the devices do not form them.
  with pytest.raises(ConfigError, match="number of processes"):
    mesh_lib.create_mesh(c.mesh)
