"""The attention kernels against XLA: `python -m bertjax.benchmark kernels
--mode=errors|memory [--batch --seq --heads --head_dim --window --lengths --tokens]`.

`--mode=errors`: every path of `bertjax.model.attention` (cuDNN for padded rows, the
Pallas flash kernel for every kind, XLA) in bfloat16 and float32, on padded rows,
packed rows (`--docs` documents a row and padding), a sliding window, and both: the
output and the gradients of q, k and v against the float32 XLA path at the highest
matmul precision (the reference), each as max |got - ref| / max |ref| over the real
positions, beside XLA in the same dtype at the default precision (what bf16 or TF32
rounding alone gives); and each one's forward + backward time. cuDNN takes bf16 / fp16
and padded global rows only (the 'cudnn' path sends the rest to the Pallas kernel).

`--mode=memory`: packed rows at each of `--lengths` (as many rows as make `--tokens`
tokens), global and windowed, forward + backward in bf16: the memory XLA's compiled
program needs (`memory_analysis`: temporaries + arguments + outputs, before it runs)
on the XLA path (its [B, 1, T, T] mask and [B, N, T, T] scores) against the Pallas
kernel (tiles only), and each one's time when it fits.

Off a GPU the Pallas kernel runs in its interpreter and cuDNN is skipped: use tiny
sizes there (`benchmarks gpu --dry_run`). Shapes: B rows, T length, N heads, D head size.
"""

from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
from absl import flags

from bertjax.errors import ConfigError
from bertjax.model import attention as attn

FLAGS = flags.FLAGS
CASES = ("padded", "packed", "window", "packed_window")


def define_flags() -> None:
  flags.DEFINE_enum("mode", "errors", ["errors", "memory"], "What to measure.")
  flags.DEFINE_integer("batch", 4, "--mode=errors: rows B.")
  flags.DEFINE_integer("seq", 1024, "--mode=errors: length T.")
  flags.DEFINE_integer("heads", 12, "Heads N (ModernBERT-base: 12).")
  flags.DEFINE_integer("head_dim", 64, "Head size D (ModernBERT-base: 64).")
  flags.DEFINE_integer("window", 64, "Half-width of the sliding window (ModernBERT's "
                       "local_attention 128: 64).")
  flags.DEFINE_integer("docs", 4, "Documents a packed row.")
  flags.DEFINE_list("cases", list(CASES), "--mode=errors: which of the cases.")
  flags.DEFINE_list("lengths", ["512", "8192"], "--mode=memory: lengths T.")
  flags.DEFINE_integer("tokens", 16384, "--mode=memory: tokens a batch (B = tokens / T).")
  flags.DEFINE_integer("repeats", 10, "Timed calls (median).")
  flags.DEFINE_string("json", "", "Results file.")


_DTYPES = {"bf16": jnp.bfloat16, "fp32": jnp.float32}


def inputs(case: str, B: int, T: int, N: int, D: int, window: int, docs: int,
           dtype=jnp.float32, seed: int = 0):
  """q, k, v [B, T, N, D] in `dtype`; padding [B, T] (right-padded: row 0 full less an
  eighth, the others half); segment ids [B, T] (`docs` documents a row) for packed
  cases, else None; the window (None for global cases); loss weights [B, T, N, D]."""
  keys = jax.random.split(jax.random.key(seed), 4)
  q, k, v, w = (jax.random.normal(key, (B, T, N, D), jnp.float32) for key in keys)
  lengths = jnp.array([T - T // 8] + [T // 2] * (B - 1))
  pos = jnp.arange(T)[None]
  padding = (pos < lengths[:, None]).astype(jnp.int32)
  segments = None
  if case.startswith("packed"):
    segments = (pos * docs // lengths[:, None] + 1).astype(jnp.int32) * padding
  return (*(t.astype(dtype) for t in (q, k, v)), padding, segments,
          window if case.endswith("window") else None, w)


def step(impl: str, padding, segments, window):
  """jit of (q, k, v, w) -> ((sum(out * w), out at real positions), (dq, dk, dv))."""
  real = padding[:, :, None, None] > 0

  def loss(q, k, v, w):
    out = attn.attention(q, k, v, padding, segments, window=window, impl=impl)
    out = jnp.where(real, out.astype(jnp.float32), 0.0)
    return jnp.sum(out * w), out

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def median_ms(fn, *args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)


def _impls(dtype, case: str, gpu: bool) -> list[tuple[str, str | None]]:
  """(path, None) to run, or (path, why not) to report: cuDNN on padded rows only (the
  'cudnn' path sends the other cases to the Pallas kernel)."""
  out = [("xla", None), ("pallas_gpu", None)]
  if case == "padded":
    out.append(("cudnn", "cuDNN takes bf16 / fp16" if jnp.dtype(dtype) != jnp.bfloat16
                else None if gpu else "cuDNN needs a GPU"))
  return out


def errors(B, T, N, D, window, docs, repeats, cases=CASES) -> list[dict]:
  """One row per (dtype, case, path): scaled max errors of out, dq, dk, dv against the
  float32 highest-precision XLA reference, and ms per forward + backward."""
  gpu = jax.default_backend() == "gpu"
  rows = []
  for case in cases:
    q, k, v, padding, segments, win, w = inputs(case, B, T, N, D, window, docs)
    with jax.default_matmul_precision("highest"):
      (_, ref_out), ref_grads = step("xla", padding, segments, win)(q, k, v, w)
    ref = dict(zip(("out", "dq", "dk", "dv"), (ref_out, *ref_grads)))
    scale = {name: float(jnp.max(jnp.abs(x))) for name, x in ref.items()}
    for dtype_name, dtype in _DTYPES.items():
      args = (q.astype(dtype), k.astype(dtype), v.astype(dtype), w)
      for impl, why in _impls(dtype, case, gpu):
        row = {"dtype": dtype_name, "case": case, "impl": impl}
        rows.append(row)
        if why:
          row["skipped"] = why
          continue
        try:
          fn = step(impl, padding, segments, win)
          (_, out), grads = fn(*args)
          for name, got in zip(ref, (out, *grads)):
            diff = jnp.max(jnp.abs(got.astype(jnp.float32) - ref[name]))
            row[name] = float(diff) / scale[name]
          row["finite"] = all(bool(jnp.isfinite(g).all()) for g in (out, *grads))
          row["ms"] = median_ms(fn, *args, repeats=repeats)
        except Exception as e:  # pylint: disable=broad-except
          row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        print(json.dumps(row), flush=True)
  return rows


def memory(lengths, tokens, N, D, window, docs, repeats) -> list[dict]:
  """One row per (T, layer kind, path): MiB the compiled bf16 forward + backward needs
  on packed rows, and its ms when it runs."""
  rows = []
  for T in lengths:
    B = max(1, tokens // T)
    for case in ("packed", "packed_window"):
      q, k, v, padding, segments, win, w = inputs(case, B, T, N, D, window, docs,
                                                  jnp.bfloat16)
      padding = jnp.ones_like(padding)  # Full rows of documents, as packing gives.
      segments = (jnp.arange(T)[None] * docs // T + 1).repeat(B, 0).astype(jnp.int32)
      for impl in ("xla", "pallas_gpu"):
        row = {"seq": T, "batch": B, "layer": "window" if win else "global",
               "impl": impl}
        rows.append(row)
        try:
          fn = step(impl, padding, segments, win)
          compiled = fn.lower(q, k, v, w).compile()
          mem = compiled.memory_analysis()
          row["temp_mib"] = mem.temp_size_in_bytes / 2**20
          row["total_mib"] = (mem.temp_size_in_bytes + mem.argument_size_in_bytes
                              + mem.output_size_in_bytes
                              - mem.alias_size_in_bytes) / 2**20
          row["ms"] = median_ms(compiled, q, k, v, w, repeats=repeats)
        except Exception as e:  # pylint: disable=broad-except
          row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        print(json.dumps(row), flush=True)
  return rows


def main(argv):
  del argv
  f = FLAGS
  unknown = sorted(set(f.cases) - set(CASES))
  if unknown:
    raise ConfigError(f"--cases: unknown {unknown}; use any of {list(CASES)}.")
  if f.mode == "errors":
    rows = errors(f.batch, f.seq, f.heads, f.head_dim, f.window, f.docs, f.repeats,
                  f.cases)
  else:
    rows = memory([int(t) for t in f.lengths], f.tokens, f.heads, f.head_dim, f.window,
                  f.docs, f.repeats)
  result = {"mode": f.mode, "platform": jax.default_backend(),
            "device": jax.devices()[0].device_kind, "rows": rows}
  if f.json:
    with open(f.json, "w") as out:
      json.dump(result, out, indent=1)
  print(format_table(result))


def _fmt(x, spec=".1e") -> str:
  return "-" if x is None else format(x, spec)


def format_table(result: dict) -> str:
  """The rows as a text table (`benchmarks gpu` prints it too)."""
  rows = result["rows"]
  if result["mode"] == "errors":
    lines = ["attention paths against float32 XLA at the highest precision "
             "(max |got - ref| / max |ref|, real positions)",
             f"{'dtype':5} {'case':13} {'path':10} {'out':>8} {'dq':>8} {'dk':>8} "
             f"{'dv':>8} {'ms':>8}"]
    for r in rows:
      head = f"{r['dtype']:5} {r['case']:13} {r['impl']:10}"
      if "skipped" in r or "error" in r:
        lines.append(f"{head} {r.get('skipped') or r['error']}")
      else:
        lines.append(f"{head} " + " ".join(_fmt(r[n]).rjust(8) for n in
                                           ("out", "dq", "dk", "dv"))
                     + f" {r['ms']:8.2f}" + ("" if r["finite"] else " NOT FINITE"))
    return "\n".join(lines)
  lines = ["packed rows, bf16 forward + backward: memory of the compiled program "
           "(XLA's memory_analysis) and time",
           f"{'T':>6} {'rows':>5} {'layer':7} {'path':10} {'temp MiB':>10} "
           f"{'total MiB':>10} {'ms':>8}"]
  for r in rows:
    head = f"{r['seq']:6d} {r['batch']:5d} {r['layer']:7} {r['impl']:10}"
    if "error" in r and "temp_mib" not in r:
      lines.append(f"{head} {r['error']}")
    else:
      lines.append(f"{head} {r['temp_mib']:10.1f} {r['total_mib']:10.1f} "
                   + (f"{r['ms']:8.2f}" if "ms" in r else r["error"]))
  return "\n".join(lines)
