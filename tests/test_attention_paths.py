"""The start-up log names the kernel each kind of row (padded / packed) and layer (global
/ sliding window) actually runs: a tiny ModernBERT (global and windowed layers) and a
tiny BERT traced as on a GPU in bfloat16 (the platform faked, shapes only), with spies
on cuDNN (`jax.nn.dot_product_attention`) and the Pallas kernel recording what runs."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model import attention as attn
from bertjax.model import bert, flash_gpu
from bertjax.model.bert import ModelConfig
from bertjax.model import modernbert as mb

B, T, WINDOW = 2, 48, 8  # The half-width; T > 2 * WINDOW + 1: local layers are local.
ROWS = {"padded": None, "packed": np.repeat([[1] * 30 + [2] * 14 + [0] * 4], B, axis=0)}


@pytest.fixture
def on_gpu(monkeypatch):
  """The models resolve their path as on a GPU; cuDNN and the Pallas kernel are spies
  that record (kernel, window) and return the shape. Returns the record."""
  calls = []
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  real = jax.nn.dot_product_attention

  def cudnn(q, k, v, *args, implementation=None, **kwargs):
    calls.append((implementation, None))
    return real(q, k, v, implementation="xla")

  def pallas(q, k, v, ids, *, window=None, scale=None):
    del scale
    calls.append(("pallas_gpu", window))
    return jnp.zeros_like(q)

  monkeypatch.setattr(jax.nn, "dot_product_attention", cudnn)
  monkeypatch.setattr(flash_gpu, "flash_attention", pallas)
  attn._log_path.cache_clear()  # pylint: disable=protected-access
  return calls


def _trace(model, segments, caplog, calls) -> list[str]:
  """The attention log lines of tracing `model` on B x T rows (the padded rows: the
  second one right-padded; packed: `segments`); `calls` then holds what ran."""
  ids = jnp.full((B, T), 5, jnp.int32)
  mask = (jnp.arange(T)[None] < jnp.array([[T], [T - 9]])).astype(jnp.int32)
  if segments is not None:
    mask = jnp.asarray(segments > 0, jnp.int32)
  kwargs = {} if segments is None else {"segment_ids": jnp.asarray(segments)}
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, mask, **kwargs))
  calls.clear()  # Initialisation runs 'xla'.
  with caplog.at_level(logging.INFO):
    caplog.clear()
    jax.eval_shape(lambda p: model.apply(p, ids, mask, **kwargs), params)
  return [r.getMessage() for r in caplog.records if r.getMessage().endswith(
      "(path 'cudnn')")]


@pytest.mark.parametrize("scan", [False, True], ids=["unscanned", "scanned"])
def test_modernbert_log_names_what_each_row_and_layer_runs(on_gpu, caplog, scan):
  """4 layers (0 and 3 global, 1 and 2 windowed): padded global layers run cuDNN, every
  other kind the Pallas kernel, as the log says."""
  cfg = mb.ModernBertConfig(vocab_size=64, hidden_size=32, num_layers=4, num_heads=2,
                            intermediate_size=48, pad_token_id=0,
                            local_attention=2 * WINDOW, scan_layers=scan,
                            dtype=jnp.bfloat16)
  model = mb.FAMILY.pretraining(cfg)
  pallas, cudnn = attn.KERNELS["pallas_gpu"], attn.KERNELS["cudnn"]
  want = {"padded": [f"attention: padded rows, global layers -> {cudnn} (path 'cudnn')",
                     f"attention: padded rows, sliding-window layers -> {pallas} "
                     "(path 'cudnn')"],
          "packed": [f"attention: packed rows, global layers -> {pallas} (path 'cudnn')",
                     f"attention: packed rows, sliding-window layers -> {pallas} "
                     "(path 'cudnn')"]}
  runs = {"padded": [("cudnn", None), ("pallas_gpu", WINDOW)],
          "packed": [("pallas_gpu", None), ("pallas_gpu", WINDOW)]}
  for rows, segments in ROWS.items():
    assert sorted(_trace(model, segments, caplog, on_gpu)) == sorted(want[rows])
    assert set(on_gpu) == set(runs[rows]), rows
    if not scan:  # One call a layer (a scan traces its body more than once).
      assert len(on_gpu) == cfg.num_layers


def test_bert_log_names_what_each_row_kind_runs(on_gpu, caplog):
  cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2,
                    intermediate_size=48, max_position_embeddings=T,
                    attention_dropout_rate=0.0, dtype=jnp.bfloat16)
  model = bert.FAMILY.pretraining(cfg)
  for rows, segments in ROWS.items():
    kernel = "cudnn" if rows == "padded" else "pallas_gpu"
    assert _trace(model, segments, caplog, on_gpu) == [
        f"attention: {rows} rows, global layers -> {attn.KERNELS[kernel]} (path 'cudnn')"]
    assert on_gpu == [(kernel, None)] * 2


@pytest.mark.parametrize("impl,packed,windowed,want", [
    ("cudnn", False, False, "cudnn"), ("cudnn", True, False, "pallas_gpu"),
    ("cudnn", False, True, "pallas_gpu"), ("xla", True, True, "xla"),
    ("pallas_gpu", False, False, "pallas_gpu"), ("splash", True, True, "splash")])
def test_kernel_path(impl, packed, windowed, want):
  assert attn.kernel_path(impl, packed=packed, windowed=windowed) == want
