"""Each fast path equals the plain path: scanned layers (and their checkpoints), remat
policies, MLM logits at the masked positions only, bf16 with fp32 statistics (the
attention paths: tests/test_attention.py). fp32 comparisons within 1e-5; bf16
tolerances stated per test."""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from bertjax.checkpoint import manager as ckpt_lib, workdir as workdir_lib
from bertjax.model import ModelConfig, bert, layers
from bertjax.model.layout import scan_params, to_layout, unscan_params
from bertjax.parallel import mesh as mesh_lib
from bertjax.train import state as state_lib
from tests.helpers import synthetic_batch, tiny_config

INPUTS = ("input_ids", "attention_mask", "token_type_ids", "masked_lm_positions")


@pytest.fixture(scope="module")
def setup():
  config = tiny_config()
  config.model.num_layers = 3
  cfg = ModelConfig.from_config(config.model)
  batch = {k: jnp.asarray(v) for k, v in synthetic_batch(config, 4).items()}
  inputs = {k: batch[k] for k in INPUTS}
  params = nn.unbox(bert.FAMILY.pretraining(cfg).init(jax.random.key(0), **inputs)["params"])
  return config, cfg, inputs, params


@functools.partial(jax.jit, static_argnames=("cfg", "deterministic"))
def _apply(cfg, params, inputs, deterministic=True, rngs=None):
  return bert.FAMILY.pretraining(cfg).apply({"params": params}, **inputs,
                                       deterministic=deterministic, rngs=rngs)


def _loss(cfg, inputs, rng):
  def loss(params):
    out = _apply(cfg, params, inputs, deterministic=rng is None,
                 rngs=None if rng is None else {"dropout": rng})
    return jnp.mean(out["mlm_logits"] ** 2) + jnp.mean(out["nsp_logits"] ** 2)
  return loss


def _close(a, b, atol=1e-5):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=atol, rtol=atol), a, b)


@pytest.mark.slow
def test_scan_equals_unscanned_forward_backward_hidden_states(setup):
  _, cfg, inputs, params = setup
  scfg = dataclasses.replace(cfg, scan_layers=True)
  _close(_apply(scfg, scan_params(params), inputs), _apply(cfg, params, inputs))
  grads = jax.jit(jax.grad(_loss(cfg, inputs, None)))(params)
  scanned_grads = jax.jit(jax.grad(_loss(scfg, inputs, None)))(scan_params(params))
  _close(unscan_params(scanned_grads), grads)
  encode = lambda c, p: bert.FAMILY.pretraining(c).apply(  # noqa: E731
      {"params": p}, inputs["input_ids"], inputs["attention_mask"], method="encode")
  plain, scanned = encode(cfg, params), encode(scfg, scan_params(params))
  assert scanned["hidden_states"].shape == (cfg.num_layers + 1, 4, 16, cfg.hidden_size)
  _close(scanned, plain)


@pytest.mark.slow
@pytest.mark.parametrize("scan,policies", [(False, ("full", "dots")),
                                            (True, ("full", "dots_no_batch"))])
def test_remat_policy_equals_plain_gradients(setup, scan, policies):
  """Same loss and gradients with dropout on (the same dropout masks are recomputed)."""
  _, cfg, inputs, params = setup
  rng = jax.random.key(3)
  base = dataclasses.replace(cfg, scan_layers=scan)
  p = to_layout(params, scan)
  expected = jax.jit(jax.value_and_grad(_loss(base, inputs, rng)))(p)
  for policy in policies:
    remat = dataclasses.replace(base, remat_policy=policy)
    _close(jax.jit(jax.value_and_grad(_loss(remat, inputs, rng)))(p), expected)


@pytest.mark.slow
def test_scanned_and_unscanned_checkpoints_load_each_other(setup, tmp_path):
  config, cfg, inputs, params = setup
  config.train.num_steps = 10
  for scan in (False, True):
    config.model.scan_layers = scan
    workdir = str(tmp_path / f"scan_{scan}")
    workdir_lib.save_config(workdir, config)
    saver = ckpt_lib.Checkpointer(workdir)
    saver.save(1, {"params": to_layout(params, scan)}, None, force=True)
    saver.wait()
    saver.close()
    restored = workdir_lib.restore_params(workdir)
    other = dataclasses.replace(cfg, scan_layers=not scan)
    _close(_apply(other, to_layout(restored, not scan), inputs), _apply(cfg, params, inputs))
  config.model.scan_layers = False


def test_mlm_logits_at_masked_positions_equal_full_logits(setup):
  _, cfg, inputs, params = setup
  full = _apply(cfg, params, {**inputs, "masked_lm_positions": None})["mlm_logits"]
  gathered = jnp.take_along_axis(full, inputs["masked_lm_positions"][..., None], axis=1)
  _close(_apply(cfg, params, inputs)["mlm_logits"], gathered)


@pytest.mark.slow
def test_bf16_activations_match_fp32_with_fp32_master_weights(setup):
  """bf16 compute, fp32 weights: logits within 0.05 + 2% of fp32 (bf16 has 8 bits of
  mantissa; 3 layers of rounding), same argmax almost everywhere; gradients stay fp32."""
  _, cfg, inputs, params = setup
  bcfg = dataclasses.replace(cfg, dtype=jnp.bfloat16)
  ref, out = _apply(cfg, params, inputs), _apply(bcfg, params, inputs)
  np.testing.assert_allclose(out["mlm_logits"], ref["mlm_logits"], atol=0.05, rtol=0.02)
  agree = np.mean(np.argmax(out["mlm_logits"], -1) == np.argmax(ref["mlm_logits"], -1))
  assert agree > 0.9
  grads = jax.jit(jax.grad(_loss(bcfg, inputs, None)))(params)
  assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}


def test_layer_norm_statistics_are_float32_for_bf16_inputs():
  """Rows with a large mean and a small spread: bf16 statistics would lose the spread."""
  cfg = ModelConfig(dtype=jnp.bfloat16, hidden_size=256, num_heads=4, layer_norm_eps=1e-5)
  x = (300.0 + jax.random.normal(jax.random.key(0), (4, 256))).astype(jnp.bfloat16)
  ln = layers.layer_norm(cfg, "ln", cfg.layer_norm_eps)
  variables = ln.init(jax.random.key(1), x)
  got = ln.apply(variables, x)
  ref = layers.layer_norm(dataclasses.replace(cfg, dtype=jnp.float32), "ln",
                         cfg.layer_norm_eps).apply(
      variables, x.astype(jnp.float32))
  assert got.dtype == jnp.bfloat16
  np.testing.assert_allclose(got.astype(jnp.float32), ref, atol=0.05)


def test_attention_dropout_path_softmax_is_float32(setup):
  """bf16 training with attention dropout goes through flax's attention with an fp32
  softmax: at rate 0 it equals the jax.nn path in bf16 within bf16 rounding."""
  _, cfg, inputs, params = setup
  bcfg = dataclasses.replace(cfg, dtype=jnp.bfloat16, dropout_rate=0.0)
  fused = _apply(bcfg, params, inputs)["mlm_logits"]
  dropout_path = _apply(dataclasses.replace(bcfg, attention_dropout_rate=1e-9), params,
                        inputs, deterministic=False, rngs={"dropout": jax.random.key(0)})
  np.testing.assert_allclose(dropout_path["mlm_logits"], fused, atol=0.05, rtol=0.02)


def test_cudnn_without_attention_dropout_is_refused_in_training(setup):
  _, cfg, inputs, params = setup
  with pytest.raises(ValueError, match="attention_dropout_rate=0.0"):
    _apply(dataclasses.replace(cfg, attention_impl="cudnn"), params, inputs,
           deterministic=False, rngs={"dropout": jax.random.key(0)})


def test_scanned_parameters_shard_like_unscanned_ones(setup):
  """The stacked [L] axis ('layers') is never sharded; the rest keeps its rules."""
  config = setup[0].copy_and_resolve_references()
  config.model.scan_layers = True
  config.mesh.update(data=2, fsdp=2, tensor=2)
  mesh = mesh_lib.create_mesh(config.mesh)
  _, boxed = state_lib.abstract_state(config)
  shardings = mesh_lib.logical_shardings(boxed, mesh, config.logical_axis_rules)
  layers_ = shardings.params["encoder"]["layers"]
  assert layers_["attention"]["query"]["kernel"].spec == P(None, "fsdp", "tensor", None)
  assert layers_["intermediate"]["kernel"].spec == P(None, "fsdp", "tensor")
  assert layers_["attention_norm"]["scale"].spec == P(None, "fsdp")
