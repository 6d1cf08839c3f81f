"""Train-step benchmark: `python -m bertjax.benchmark train --config=CONFIG [--batch=N
--seq=L --steps=K --dtype=bf16 --compare=hf]`.

Times the real jitted train step (forward, backward, clipping, AdamW; donated state)
on synthetic full-length rows after warm-up and reports: step time (median, min, max),
sequences/s, tokens/s, model FLOPs per step (`bertjax.benchmarks.flops`, next to XLA's own
count), MFU: the global step's FLOPs over the bf16 peak of all the devices it ran on
(on a CPU: the matmul throughput of all of them at once, measured in this run, in the
same dtype), peak memory and compile time. `--compare=hf` times Hugging Face
`BertForPreTraining` (PyTorch, SDPA attention, the same shapes, bf16 autocast with
--dtype=bf16; one GPU, or the same CPU cores) in the same process and prints our
speed-up, per device when we ran on more GPUs than it; its MFU counts the FLOPs it
does (MLM logits at every position). Any config field can be overridden
(`--config.model.scan_layers=True`). Results go to --json.

  python -m bertjax.benchmark train --config=configs/bert_tiny.py --compare=hf
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import time

import flax.linen as nn
import jax
import numpy as np
from absl import flags
from ml_collections import config_flags

from bertjax.benchmarks import flops as flops_lib
from bertjax.errors import ConfigError
from bertjax.parallel import mesh as mesh_lib
from bertjax.train import state as state_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Recipe file, e.g. configs/bert_base.py.", lock_config=True)
_BATCH = flags.DEFINE_integer("batch", 0, "Global batch (0: config.train.batch_size).")
_SEQ = flags.DEFINE_integer("seq", 0, "Sequence length (0: config.data.max_seq_length).")
_STEPS = flags.DEFINE_integer("steps", 10, "Timed steps after warm-up.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps after compilation.")
_DTYPE = flags.DEFINE_enum("dtype", "fp32", ["fp32", "bf16"], "Activation dtype.")
_COMPARE = flags.DEFINE_enum("compare", "", ["", "hf"], "hf: also time Hugging Face.")
_JSON = flags.DEFINE_string("json", "", "Results file (default: a name in /tmp).")
flags.mark_flags_as_required(["config"])

_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def synthetic_batch(config, batch: int, seq: int, predictions: int, nsp: bool,
                    seed: int = 0) -> dict[str, np.ndarray]:
  """Full-length rows (as packing gives): ids [B, T], `predictions` masked positions."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, config.model.vocab_size, size=(batch, seq)).astype(np.int32)
  positions = np.sort(np.stack([rng.choice(np.arange(1, seq), predictions, replace=False)
                                for _ in range(batch)]), axis=1).astype(np.int32)
  out = {
      "input_ids": ids, "attention_mask": np.ones_like(ids),
      "token_type_ids": (np.arange(seq)[None] >= seq // 2).astype(np.int32).repeat(batch, 0),
      "masked_lm_positions": positions,
      "masked_lm_ids": np.take_along_axis(ids, positions, 1),
      "masked_lm_weights": np.ones((batch, predictions), np.float32),
  }
  if nsp:
    out["next_sentence_labels"] = rng.integers(0, 2, size=batch).astype(np.int32)
  return out


def _summary(times: list[float], batch: int, seq: int, step_flops: float) -> dict:
  median = statistics.median(times)
  return {
      "step_ms_median": 1e3 * median, "step_ms_min": 1e3 * min(times),
      "step_ms_max": 1e3 * max(times),
      "step_ms_stdev": 1e3 * statistics.stdev(times) if len(times) > 1 else 0.0,
      "sequences_per_s": batch / median, "tokens_per_s": batch * seq / median,
      "tflops_per_s": step_flops / median / 1e12,
  }


def _max_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_interleaved(steppers: list, steps: int, warmup: int) -> list[list[float]]:
  """Seconds per step of each `stepper()` (runs one step to completion), taken in
  turns so that both frameworks see the same load on a shared machine."""
  for stepper in steppers:
    for _ in range(warmup):
      stepper()
  times = [[] for _ in steppers]
  for _ in range(steps):
    for stepper, out in zip(steppers, times):
      start = time.perf_counter()
      stepper()
      out.append(time.perf_counter() - start)
  return times


def bench_bertjax(config, batch: int, seq: int, predictions: int):
  """Compiles our train step on all local devices (data parallel). Returns (step,
  finish): `step()` runs one step to completion; `finish()` the compile, FLOP and
  memory figures."""
  trainer = state_lib.build_trainer(config)
  host = synthetic_batch(config, batch, seq, predictions, config.model.nsp)
  with jax.set_mesh(trainer.mesh), nn.logical_axis_rules(trainer.rules):
    state = trainer.init_state(config)
    data = mesh_lib.put_batch(host, trainer.batch_sharding)
    start = time.perf_counter()
    lowered = trainer.train_step.lower(state, data)
    trace_s = time.perf_counter() - start
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
  last = {}

  def step():
    nonlocal state
    state, last["metrics"] = compiled(state, data)
    jax.block_until_ready(last["metrics"]["loss"])

  def finish() -> dict:
    if not np.isfinite(float(last["metrics"]["loss"])):
      raise ConfigError("the benchmarked train step gave a non-finite loss; check the "
                        "config.")
    stats = jax.devices()[0].memory_stats() or {}
    mem, cost = compiled.memory_analysis(), compiled.cost_analysis()
    return {
      "trace_s": trace_s, "compile_s": compile_s,
      # The partitioned program's count is one device's: times the devices.
      "xla_flops": (float(cost["flops"]) * len(trainer.mesh.devices.flat)
                    if cost and "flops" in cost else None),
      "peak_device_memory_mb": stats.get("peak_bytes_in_use", 0) / 2**20 or None,
      "xla_memory_mb": (mem.temp_size_in_bytes + mem.argument_size_in_bytes
                        + mem.output_size_in_bytes - mem.alias_size_in_bytes) / 2**20,
      "max_rss_mb": _max_rss_mb(),
    }

  return step, finish


def bench_hf(config, batch: int, seq: int, predictions: int, dtype: str):
  """Hugging Face BertForPreTraining (SDPA) + AdamW + clipping on the same batch.
  Returns (step, finish) as `bench_bertjax` does."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  m = config.model
  hf_config = transformers.BertConfig(
      vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
      num_attention_heads=m.num_heads, intermediate_size=m.intermediate_size,
      max_position_embeddings=m.max_position_embeddings, type_vocab_size=m.type_vocab_size,
      layer_norm_eps=m.layer_norm_eps, hidden_dropout_prob=m.dropout_rate,
      attention_probs_dropout_prob=m.attention_dropout_rate, hidden_act="gelu")
  hf_config._attn_implementation = "sdpa"  # pylint: disable=protected-access
  device = "cuda" if torch.cuda.is_available() else "cpu"
  model = transformers.BertForPreTraining(hf_config).to(device).train()
  t = config.train
  opt = torch.optim.AdamW(model.parameters(), lr=t.learning_rate, betas=(t.b1, t.b2),
                          eps=t.eps, weight_decay=t.weight_decay)
  host = synthetic_batch(config, batch, seq, predictions, nsp=True)
  labels = np.full_like(host["input_ids"], -100)
  np.put_along_axis(labels, host["masked_lm_positions"], host["masked_lm_ids"], 1)
  inputs = {"input_ids": host["input_ids"], "attention_mask": host["attention_mask"],
            "token_type_ids": host["token_type_ids"], "labels": labels,
            "next_sentence_label": host["next_sentence_labels"]}
  inputs = {k: torch.as_tensor(v, dtype=torch.long, device=device) for k, v in inputs.items()}
  autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bf16")
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

  last = {}

  def step():
    with autocast:
      loss = model(**inputs).loss
    loss.backward()
    if t.max_grad_norm > 0:
      torch.nn.utils.clip_grad_norm_(model.parameters(), t.max_grad_norm)
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync()
    last["loss"] = loss

  def finish() -> dict:
    return {
        "loss": float(last["loss"].detach()), "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "peak_device_memory_mb": (torch.cuda.max_memory_allocated() / 2**20
                                  if device == "cuda" else None),
    }

  return step, finish


def _fmt(x, spec=".3g"):
  return "-" if x is None else format(x, spec)


def main(argv):
  del argv
  config = _CONFIG.value
  config.model.dtype = _DTYPES[_DTYPE.value]
  batch = _BATCH.value or config.train.batch_size
  seq = _SEQ.value or config.data.max_seq_length
  config.data.max_seq_length = seq
  if seq > config.model.max_position_embeddings:
    config.model.max_position_embeddings = seq
  predictions = max(1, round(0.15 * seq))
  if _STEPS.value < 2:
    raise ConfigError("--steps must be at least 2 (a median and a spread).")
  from bertjax.model import ModelConfig  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig.from_config(config.model)
  step_flops = flops_lib.train_flops(cfg, batch, seq, predictions)
  # Hugging Face computes the MLM logits at every position: its FLOPs are larger.
  hf_flops = flops_lib.train_flops(cfg, batch, seq, seq)
  devices = jax.devices()
  benches = [("bertjax", bench_bertjax(config, batch, seq, predictions))]
  if _COMPARE.value == "hf":
    benches.append(("hf", bench_hf(config, batch, seq, predictions, _DTYPE.value)))
  times = time_interleaved([step for _, (step, _) in benches], _STEPS.value, _WARMUP.value)
  runs = {name: {**_summary(t, batch, seq, (hf_flops if name == "hf" else step_flops)[
      "total"]), **finish(), "step_s": t} for (name, (_, finish)), t in zip(benches, times)}
  # MFU: the global step's FLOPs over the peak of every device the step ran on (measured
  # right after our steps on a CPU). Hugging Face runs on one device (a GPU) or the same
  # CPU cores as ours: its peak is one device's, or the same CPU peak.
  peak, peak_source = flops_lib.peak_tflops(devices, cfg.dtype)
  cpu = devices[0].platform == "cpu"
  runs["bertjax"]["devices"], runs["bertjax"]["peak_tflops"] = len(devices), peak
  if "hf" in runs:
    runs["hf"]["devices"] = len(devices) if cpu else 1
    runs["hf"]["peak_tflops"] = peak if cpu else peak / len(devices)
  for r in runs.values():
    r["mfu"] = r["tflops_per_s"] / r["peak_tflops"]
  result = {
      "config": cfg.to_dict(), "batch": batch, "seq": seq,
      "masked_positions": predictions, "dtype": _DTYPE.value, "steps": _STEPS.value,
      "device": devices[0].device_kind, "platform": devices[0].platform,
      "num_devices": len(devices), "cpu_count": os.cpu_count(),
      "load_average_1min": os.getloadavg()[0],
      "peak_tflops": peak, "peak_source": peak_source,
      "flops_per_step": step_flops, "hf_flops_per_step": hf_flops,
      "padding_fraction": 0.0, **runs,
  }
  ours = runs["bertjax"]
  lines = [
      f"device {devices[0].device_kind} x{len(devices)} | peak {peak:.3g} TFLOP/s "
      f"({peak_source}) | batch {batch} x seq {seq}, {predictions} masked/row, "
      f"{_DTYPE.value} | load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
      f"model FLOPs/step {step_flops['total']:.4g} (encoder {step_flops['encoder_matmuls']:.3g}"
      f", attention {step_flops['attention']:.3g}, MLM head {step_flops['mlm_head']:.3g}); "
      f"XLA counts {_fmt(ours['xla_flops'], '.4g')}"
      + (" (XLA counts a scanned loop body once)" if cfg.scan_layers else ""),
  ]
  if "hf" in runs:
    # Per device where Hugging Face ran on fewer devices; on a CPU both use its cores.
    hf = runs["hf"]
    result["speedup_vs_hf"] = (hf["step_ms_median"] / ours["step_ms_median"]
                               * hf["devices"] / ours["devices"])
    result["speedup_basis"] = "same CPU cores" if cpu else "per device"
    lines.append(f"Hugging Face FLOPs/step {hf_flops['total']:.4g} (MLM head at all {seq} "
                 f"positions: {hf_flops['mlm_head']:.3g}) on "
                 + ("the same CPU cores" if cpu else "1 device"))
  lines.append(f"{'':9} {'step ms median [min, max]':>27} {'seq/s':>9} {'tokens/s':>10} "
               f"{'TFLOP/s':>8} {'MFU':>6} {'peak mem MB':>11}")
  for name, r in runs.items():
    mem = r.get("peak_device_memory_mb") or r.get("xla_memory_mb")
    lines.append(
        f"{name:9} {r['step_ms_median']:9.2f} [{r['step_ms_min']:7.2f}, {r['step_ms_max']:7.2f}]"
        f" {r['sequences_per_s']:9.1f} {r['tokens_per_s']:10.0f} {r['tflops_per_s']:8.3f} "
        f"{100 * r['mfu']:5.1f}% {_fmt(mem, '11.0f')}")
  lines.append(f"bertjax compile {ours['compile_s']:.1f} s (trace {ours['trace_s']:.1f} s); "
               f"process max RSS {ours['max_rss_mb']:.0f} MB")
  if "speedup_vs_hf" in result:
    lines.append(f"speed-up vs Hugging Face (torch {result['hf']['torch']}, "
                 f"{result['hf']['threads']} threads, {result['speedup_basis']}): "
                 f"{result['speedup_vs_hf']:.2f}x")
  print("\n".join(lines))
  path = _JSON.value or os.path.join(
      "/tmp", f"bertjax_benchmark_train_L{cfg.num_layers}_H{cfg.hidden_size}_b{batch}"
      f"_t{seq}_{_DTYPE.value}.json")
  with open(path, "w") as f:
    json.dump(result, f, indent=1, default=str)
  print(f"wrote {path}")
