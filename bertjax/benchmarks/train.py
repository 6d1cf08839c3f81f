"""Train-step benchmark: `python -m bertjax.benchmark train --config=CONFIG [--batch=N
--seq=L --steps=K --dtype=bf16 --docs_per_row=D --compare=hf --max_batch]`.

Times the real jitted train step (forward, backward, the recipe's clipping and
optimizer; donated state) on synthetic full-length rows, with the recipe's share of
masked positions (the recipe's training rate: 15% BERT, 30% ModernBERT), after
warm-up and reports: step time (median, min, max),
sequences/s, tokens/s, model FLOPs per step (the objectives' networks and heads,
`Objectives.train_flops`, next to XLA's own count), MFU: the global step's FLOPs over the bf16 peak of all the devices it ran on
(the table of `bertjax.benchmarks.flops.CHIPS` by exact device kind; on a CPU the matmul
throughput of all of them at once, measured in this run, in the same dtype), peak
memory, compile time, and the attention path and dtype the step resolved to.
`--dtype`: '' keeps config.model.dtype (the recipes: bf16 on GPUs and TPUs, fp32 on the
CPU). Any model family (`config.model.family`). Token types follow the model:
segments A/B for BERT (type_vocab_size 2), all 0 for RoBERTa / XLM-R (type_vocab_size
1) and ModernBERT (none: ignored). `--docs_per_row=D` packs D equal documents a row
(segment ids and restarting positions: isolated attention; with
`--config.model.attention_impl=cudnn` / `xla` and `--config.model.attention_dropout_rate=0`
it compares the attention paths' peak memory on packed rows, on a GPU).

`--compare=hf` also times Hugging Face (PyTorch, SDPA attention, AdamW + clipping, the
same global batch, length and masked positions, bf16 autocast when our dtype is bf16):
the class the family's Hugging Face table names (`pretraining_model` in
bertjax/hf/<family>.py), built from the same config (our parameters' shapes):
`BertForPreTraining` with NSP, else `BertForMaskedLM`, `RobertaForMaskedLM` for
RoBERTa / XLM-R, `ModernBertForMaskedLM` (no documents isolation on its side; our
optimizer, theirs AdamW: the same per-step work); with the 'rtd' objective ELECTRA's
pair, `ElectraForMaskedLM` at config.generator's sizes sharing the embeddings of
`ElectraForPreTraining`, Gumbel-max samples, loss generator + lambda x discriminator
(DeBERTa-v3's discriminator has no transformers class: a one-line error). Both run in
this process, one step of each in turn (the same load on a shared CPU), JAX told not to preallocate on an
accelerator; ours on the devices Hugging Face has: the same CPU cores, or one GPU. Its
MFU counts the FLOPs it does (MLM logits at every position; attention over the pairs
the model scores on both sides: a sliding window's, though on a CPU both compute the
masked [T, T] scores). `--max_batch` finds the
largest global batch each framework fits at this length (doubling, then bisecting to
`--batch_tolerance`), every try a fresh process of its own (`--only`), so neither
holds memory the other needs. Any config field can be overridden
(`--config.model.scan_layers=True`). Results go to --json.

  python -m bertjax.benchmark train --config=configs/bert_tiny.py --compare=hf
  python -m bertjax.benchmark train --config=configs/modernbert_tiny.py --compare=hf
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from ml_collections import config_flags

from bertjax import objectives as objectives_lib
from bertjax.benchmarks import flops as flops_lib
from bertjax.benchmarks import hf_reference
from bertjax.errors import ConfigError
from bertjax.hf import convert as hf_convert
from bertjax.hf import electra as electra_table
from bertjax.parallel import mesh as mesh_lib
from bertjax.train import state as state_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Recipe file, e.g. configs/bert_base.py.", lock_config=True)
_BATCH = flags.DEFINE_integer("batch", 0, "Global batch (0: config.train.batch_size).")
_SEQ = flags.DEFINE_integer("seq", 0, "Sequence length (0: config.data.max_seq_length).")
_STEPS = flags.DEFINE_integer("steps", 10, "Timed steps after warm-up.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps after compilation.")
_DTYPE = flags.DEFINE_enum("dtype", "", ["", "fp32", "bf16"],
                           "Activation dtype ('': config.model.dtype).")
_DOCS = flags.DEFINE_integer("docs_per_row", 0, "Packed rows of this many isolated "
                             "documents (0: one full-length document a row).")
_COMPARE = flags.DEFINE_enum("compare", "", ["", "hf"], "hf: also time Hugging Face.")
_ONLY = flags.DEFINE_enum("only", "", ["", "bertjax", "hf"],
                          "Run one framework alone (the --max_batch tries).")
_MAX_BATCH = flags.DEFINE_bool("max_batch", False, "Also find the largest batch each "
                               "framework fits, each try in a process of its own.")
_BATCH_TOLERANCE = flags.DEFINE_float("batch_tolerance", 0.1, "--max_batch stops when "
                                      "the smallest failing batch is within this "
                                      "fraction of the largest fitting one.")
_BATCH_CAP = flags.DEFINE_integer("batch_cap", 4096, "--max_batch tries no larger batch.")
_JSON = flags.DEFINE_string("json", "", "Results file (default: a name in /tmp).")
_PROFILE_DIR = flags.DEFINE_string(
    "profile_dir", "", "Also trace two of our steps after the timed ones into this "
    "folder and print their device time by category (`benchmark profile`'s table).")
flags.mark_flags_as_required(["config"])

_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
_OUT_OF_MEMORY = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OutOfMemoryError")


def synthetic_batch(config, batch: int, seq: int, predictions: int,
                    fields: Sequence[str] = (), docs_per_row: int = 0, seed: int = 0
                    ) -> dict[str, np.ndarray]:
  """Full-length rows (as packing gives): ids [B, T], `predictions` masked positions;
  token types A/B halves when the model has two (BERT), else 0 (RoBERTa / XLM-R, and
  ModernBERT, which has none); with `docs_per_row` > 1 also segment_ids (1 + the
  document) and positions restarting at each document [B, T]. The other `fields` the
  objectives read (`Objectives.fields`): NSP's labels [B], random; SBO's span
  boundaries [B, P], each masked token a span of its own."""
  cfg = objectives_lib.from_config(config).model
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, cfg.vocab_size, size=(batch, seq)).astype(np.int32)
  positions = np.sort(np.stack([rng.choice(np.arange(1, seq), predictions, replace=False)
                                for _ in range(batch)]), axis=1).astype(np.int32)
  pos = np.arange(seq)[None].repeat(batch, 0)
  two_types = cfg.type_vocab_size >= 2
  out = {
      "input_ids": ids, "attention_mask": np.ones_like(ids),
      "token_type_ids": ((pos >= seq // 2) & two_types).astype(np.int32),
      "masked_lm_positions": positions,
      "masked_lm_ids": np.take_along_axis(ids, positions, 1),
      "masked_lm_weights": np.ones((batch, predictions), np.float32),
  }
  if docs_per_row > 1:
    doc = pos * docs_per_row // seq  # Equal documents, the last one taking the rest.
    starts = (np.arange(docs_per_row) * seq + docs_per_row - 1) // docs_per_row
    out["segment_ids"] = (doc + 1).astype(np.int32)
    out["position_ids"] = (pos - starts[doc] + cfg.position_offset).astype(np.int32)
  if "next_sentence_labels" in fields:
    out["next_sentence_labels"] = rng.integers(0, 2, size=batch).astype(np.int32)
  if "span_left_positions" in fields:
    out.update(span_left_positions=positions - 1,
               span_right_positions=np.minimum(positions + 1, seq - 1).astype(np.int32),
               span_relative_positions=np.zeros_like(positions))
  unknown = sorted(set(fields) - set(out))
  if unknown:
    raise ConfigError(f"benchmark train cannot make up the batch field {unknown[0]!r} "
                      "the objectives read; benchmark other config.objectives.")
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


def process_age_s() -> float | None:
  """Seconds since this process started (Linux's /proc; None elsewhere): the
  interpreter, imports and the accelerator's start included."""
  try:
    with open("/proc/self/stat") as f:
      started = int(f.read().rsplit(")", 1)[1].split()[19])  # clock ticks after boot
    with open("/proc/uptime") as f:
      return float(f.read().split()[0]) - started / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError):
    return None


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


def bench_bertjax(config, batch: int, seq: int, predictions: int, devices,
                  docs_per_row: int = 0, profile_dir: str = "", pipelined_steps: int = 2):
  """Compiles our train step on `devices` (data parallel). Returns (step, finish):
  `step()` runs one step to completion; `finish()` the start-up (`startup_s`: each
  phase's seconds, printed as it ends), compile, FLOP and memory figures, the step
  time of `pipelined_steps` steps dispatched back to back and, with
  `profile_dir`, the device time of two more steps traced there, by category
  (`bertjax.benchmarks.trace`)."""
  startup = {}

  def phase(name: str, start: float) -> None:
    startup[name] = round(time.perf_counter() - start, 2)
    print(f"bertjax start-up: {name} {startup[name]:.1f} s", flush=True)

  start = time.perf_counter()
  trainer = state_lib.build_trainer(config, mesh_lib.create_mesh(config.mesh, devices))
  host = synthetic_batch(config, batch, seq, predictions,
                         objectives_lib.from_config(config).fields, docs_per_row)
  phase("setup", start)
  with jax.set_mesh(trainer.mesh), nn.logical_axis_rules(trainer.rules):
    start = time.perf_counter()
    state = jax.block_until_ready(trainer.init_state(config))
    phase("init (compiled and run)", start)
    params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
    data = mesh_lib.put_batch(host, trainer.batch_sharding)
    start = time.perf_counter()
    lowered = trainer.train_step.lower(state, data)
    phase("trace", start)
    start = time.perf_counter()
    compiled = lowered.compile()
    phase("compile", start)
    trace_s, compile_s = startup["trace"], startup["trace"] + startup["compile"]
  last = {}

  def step():
    nonlocal state
    state, last["metrics"] = compiled(state, data, trainer.train_step.seed)
    jax.block_until_ready(last["metrics"]["loss"])
    last.setdefault("first_step_at_s", process_age_s())

  def pipelined(steps: int) -> float:
    """Seconds a step with `steps` steps dispatched back to back and one host sync at
    the end, as the trainer runs them (its only syncs are at log_every): the host's
    dispatch of a step overlaps the device's previous one."""
    nonlocal state
    start = time.perf_counter()
    for _ in range(steps):
      state, last["metrics"] = compiled(state, data, trainer.train_step.seed)
    jax.block_until_ready(last["metrics"]["loss"])
    return (time.perf_counter() - start) / steps

  def traced() -> dict:
    from bertjax.benchmarks import trace  # pylint: disable=g-import-not-at-top
    with jax.profiler.trace(profile_dir):
      for _ in range(2):
        step()
    return trace.analyze(profile_dir, compiled.as_text(), 2)

  def finish() -> dict:
    loss = float(last["metrics"]["loss"])
    if not np.isfinite(loss):
      raise ConfigError("the benchmarked train step gave a non-finite loss; check the "
                        "config.")
    stats = devices[0].memory_stats() or {}
    mem, cost = compiled.memory_analysis(), compiled.cost_analysis()
    return {
      "loss": loss, "params": params, "trace_s": trace_s, "compile_s": compile_s,
      # The partitioned program's count is one device's: times the devices.
      "xla_flops": (float(cost["flops"]) * len(trainer.mesh.devices.flat)
                    if cost and "flops" in cost else None),
      "peak_device_memory_mb": stats.get("peak_bytes_in_use", 0) / 2**20 or None,
      "xla_memory_mb": (mem.temp_size_in_bytes + mem.argument_size_in_bytes
                        + mem.output_size_in_bytes - mem.alias_size_in_bytes) / 2**20,
      "max_rss_mb": _max_rss_mb(), "startup_s": startup,
      # The first step done, in seconds since the process started (a fresh machine's
      # wait: issue 46 asks 30 s for BERT-large with no compilation cache).
      "first_step_at_s": last["first_step_at_s"],
      "step_ms_pipelined": 1e3 * pipelined(max(pipelined_steps, 2)),
      **({"profile": traced()} if profile_dir else {}),
    }

  return step, finish


def _rtd(config) -> bool:
  """Whether `config` trains by replaced-token detection (a generator and a
  discriminator); only ELECTRA's pair has Hugging Face classes (DeBERTa-v3's
  discriminator, GDES, has none): a one-line ConfigError for another family."""
  objectives = objectives_lib.from_config(config)
  if "rtd" not in objectives.names:
    return False
  if objectives.model.family != "electra":
    raise ConfigError(f"--compare=hf with the 'rtd' objective times ELECTRA's pair "
                      f"(ElectraForMaskedLM + ElectraForPreTraining); transformers has no "
                      f"class that pretrains the {objectives.model.family} discriminator. "
                      "Benchmark it without --compare=hf.")
  return True


def hf_model(config) -> tuple[str, dict, object]:
  """The Hugging Face model that pretrains `config.model` as we do (its family's table,
  `bertjax.hf.<family>.pretraining_model`): (class name, config.json, our model config
  with the heads that class computes). With 'rtd': the discriminator's
  (ElectraForPreTraining; its generator is `bench_hf`'s)."""
  cfg = objectives_lib.from_config(config).model
  if _rtd(config):
    return electra_table.PRETRAINING, electra_table.hf_config(
        cfg, electra_table.PRETRAINING), cfg
  hf_json, computed = hf_convert.family_table(cfg.family).pretraining_model(cfg)
  return hf_json["architectures"][0], hf_json, computed


def hf_model_class(config) -> str:
  """The Hugging Face class with our heads (`hf_model`)."""
  return hf_model(config)[0]


def hf_flops(config, batch: int, seq: int) -> dict[str, float]:
  """What Hugging Face computes: its heads (`hf_model`), the MLM logits at every
  position (with 'rtd': the generator's, and both networks)."""
  if _rtd(config):
    return objectives_lib.from_config(config).train_flops(batch, seq, seq)
  return flops_lib.train_flops(hf_model(config)[2], batch, seq, seq)


def bench_hf(config, batch: int, seq: int, predictions: int, bf16: bool):
  """Hugging Face (`hf_model`, SDPA) + AdamW + clipping on the same batch.
  Returns (step, finish) as `bench_bertjax` does."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  name, hf_json, cfg = hf_model(config)
  model_class = getattr(transformers, name)
  hf_config = model_class.config_class(**hf_json, attn_implementation="sdpa")
  device = "cuda" if torch.cuda.is_available() else "cpu"
  model = model_class(hf_config).to(device).train()
  t = config.train
  host = synthetic_batch(config, batch, seq, predictions,
                         objectives_lib.from_config(config).fields)
  labels = np.full_like(host["input_ids"], -100)
  np.put_along_axis(labels, host["masked_lm_positions"], host["masked_lm_ids"], 1)
  inputs = {"input_ids": host["input_ids"], "attention_mask": host["attention_mask"],
            "labels": labels}
  if cfg.type_vocab_size:
    inputs["token_type_ids"] = host["token_type_ids"]
  if cfg.nsp:
    inputs["next_sentence_label"] = host["next_sentence_labels"]
  inputs = {k: torch.as_tensor(v, dtype=torch.long, device=device) for k, v in inputs.items()}
  autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=bf16)
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  if _rtd(config):  # Both networks, the shared embeddings once.
    model = hf_reference.rtd_pair(config, model, "sdpa").train()
    name = f"ElectraForMaskedLM + {name}"
  loss_of = lambda: model(**inputs).loss  # noqa: E731
  parameters = list(model.parameters())
  opt = torch.optim.AdamW(parameters, lr=t.learning_rate, betas=(t.b1, t.b2),
                          eps=t.eps, weight_decay=t.weight_decay)

  last = {}

  def step():
    with autocast:
      loss = loss_of()
    loss.backward()
    if t.max_grad_norm > 0:
      torch.nn.utils.clip_grad_norm_(parameters, t.max_grad_norm)
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync()
    last["loss"] = loss

  def finish() -> dict:
    loss = float(last["loss"].detach())
    if not np.isfinite(loss):
      raise ConfigError(f"Hugging Face's {name} step gave a non-finite loss.")
    return {
        "loss": loss, "model_class": name, "torch": torch.__version__,
        "params": sum(p.numel() for p in parameters),  # Tied: counted once.
        "threads": torch.get_num_threads(),
        "peak_device_memory_mb": (torch.cuda.max_memory_allocated() / 2**20
                                  if device == "cuda" else None),
    }

  return step, finish


def largest_batch(fits: Callable[[int], bool], start: int, unit: int, tolerance: float,
                  cap: int) -> tuple[int, list[tuple[int, bool]]]:
  """The largest multiple of `unit` up to `cap` for which `fits(batch)`: from `start`,
  double while it fits (or halve while it does not), then bisect until the smallest
  failing batch is within `tolerance` of the largest fitting one. Returns (batch, 0 if
  none fits; the tries as (batch, fits))."""
  tries = []

  def probe(n: int) -> bool:
    tries.append((n * unit, fits(n * unit)))
    return tries[-1][1]

  n = max(1, min(start, cap) // unit)
  if probe(n):
    lo, hi = n, None
    while hi is None and lo * unit < cap:
      n = min(2 * lo, cap // unit)
      lo, hi = (n, None) if probe(n) else (lo, n)
  else:
    lo, hi = 0, n
    while lo == 0 and hi > 1:
      n = hi // 2
      lo, hi = (n, hi) if probe(n) else (0, n)
  while hi is not None and hi - lo > max(1, tolerance * lo):
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if probe(mid) else (lo, mid)
  return lo * unit, tries


def probe_command(framework: str, batch: int, seq: int, bf16: bool,
                  docs_per_row: int) -> list[str]:
  """This benchmark for `framework` alone at `batch`: the recipe and its overrides as
  this run was given them, the dtype resolved here, two timed steps (a try of
  --max_batch)."""
  overrides = [a for a in sys.argv[2:] if a.startswith("--config")]
  return [sys.executable, "-m", "bertjax.benchmark", "train", *overrides,
          f"--seq={seq}", f"--dtype={'bf16' if bf16 else 'fp32'}",
          f"--docs_per_row={docs_per_row}", f"--batch={batch}", "--steps=2",
          "--warmup=1", f"--only={framework}"]


def fits_in_own_process(framework: str, seq: int, bf16: bool,
                        docs_per_row: int) -> Callable[[int], bool]:
  """fits(batch): whether a fresh process runs `framework`'s steps at `batch`; an
  out-of-memory failure is False, any other failure an error. Our process may take
  95% of the device; Hugging Face's keeps JAX on the CPU (no device memory)."""
  env = dict(os.environ)
  if framework == "bertjax":
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
  else:
    env["JAX_PLATFORMS"] = "cpu"

  def fits(batch: int) -> bool:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
      proc = subprocess.run(probe_command(framework, batch, seq, bf16, docs_per_row)
                            + [f"--json={out.name}"],
                            capture_output=True, text=True, env=env, check=False)
    print(f"  {framework} batch {batch}: {'fits' if proc.returncode == 0 else 'no'}",
          flush=True)
    if proc.returncode and not any(s in proc.stderr for s in _OUT_OF_MEMORY):
      raise ConfigError(f"--max_batch: {framework} at batch {batch} failed: "
                        + (proc.stderr.strip().splitlines() or ["?"])[-1])
    return proc.returncode == 0

  return fits


def _fmt(x, spec=".3g"):
  return "-" if x is None else format(x, spec)


def masked_positions(config, seq: int) -> int:
  """Masked positions per row at the recipe's training rate: its first masking
  phase's (ModernBERT's 30%), else `config.data.masked_lm_prob` (BERT's 15%)."""
  rate = (config.data.masked_lm_prob_phases[0][1] if config.data.masked_lm_prob_phases
          else config.data.masked_lm_prob)
  return max(1, round(rate * seq))


def sized(config, batch: int, seq: int, dtype: str = "") -> tuple[int, int, int]:
  """Sets `config` to a benchmark's `dtype` ('' keeps config.model.dtype, 'fp32',
  'bf16'), global `batch` and length `seq` (0: the recipe's), with position embeddings
  enough for that length. Returns (batch, seq, masked positions a row)."""
  if dtype:
    config.model.dtype = _DTYPES[dtype]
  batch = batch or config.train.batch_size
  seq = seq or config.data.max_seq_length
  config.train.batch_size, config.data.max_seq_length = batch, seq
  offset = objectives_lib.from_config(config).model.position_offset
  if seq + offset > config.model.max_position_embeddings:
    config.model.max_position_embeddings = seq + offset
  return batch, seq, masked_positions(config, seq)


def main(argv):
  del argv
  config = _CONFIG.value
  batch, seq, predictions = sized(config, _BATCH.value, _SEQ.value, _DTYPE.value)
  if _STEPS.value < 2:
    raise ConfigError("--steps must be at least 2 (a median and a spread).")
  frameworks = [_ONLY.value] if _ONLY.value else ["bertjax"] + (
      ["hf"] if _COMPARE.value == "hf" else [])
  if "hf" in frameworks and len(frameworks) > 1:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # Before JAX starts.
  from bertjax.model import attention  # pylint: disable=g-import-not-at-top
  objectives = objectives_lib.from_config(config)
  cfg = objectives.model
  bf16 = jnp.dtype(cfg.dtype) == jnp.bfloat16
  step_flops = objectives.train_flops(batch, seq, predictions)
  hf_step_flops = hf_flops(config, batch, seq)
  # Its MLM head(s) at every position (an RTD pair's: the generator's).
  hf_mlm_head = sum(v for k, v in hf_step_flops.items() if "mlm_head" in k)
  devices = jax.devices()
  cpu = devices[0].platform == "cpu"
  if "hf" in frameworks and not cpu:
    devices = devices[:1]  # Hugging Face runs on one GPU: so do we.
  impl = attention.resolve_impl(cfg.attention_impl, platform=devices[0].platform,
                                dtype=cfg.dtype, dropout=cfg.attention_dropout_rate > 0,
                                seq_len=seq)
  benches = []
  if "bertjax" in frameworks:
    benches.append(("bertjax", bench_bertjax(config, batch, seq, predictions, devices,
                                             _DOCS.value, _PROFILE_DIR.value,
                                             _STEPS.value)))
  if "hf" in frameworks:
    benches.append(("hf", bench_hf(config, batch, seq, predictions, bf16)))
  times = time_interleaved([step for _, (step, _) in benches], _STEPS.value, _WARMUP.value)
  runs = {name: {**_summary(t, batch, seq, (hf_step_flops if name == "hf" else step_flops)[
      "total"]), **finish(), "step_s": t} for (name, (_, finish)), t in zip(benches, times)}
  # MFU: the global step's FLOPs over the peak of every device the step ran on (measured
  # right after our steps on a CPU, where Hugging Face uses the same cores).
  peak, peak_source = flops_lib.peak_tflops(devices, cfg.dtype)
  for r in runs.values():
    r["devices"], r["peak_tflops"] = len(devices), peak
    r["mfu"] = r["tflops_per_s"] / r["peak_tflops"]
  if _MAX_BATCH.value:
    for name in runs:  # Our batch: a multiple of the devices x micro-batches.
      unit = len(devices) * config.train.grad_accum_steps if name == "bertjax" else 1
      print(f"largest batch of {name} at length {seq}:", flush=True)
      runs[name]["max_batch"], runs[name]["max_batch_tries"] = largest_batch(
          fits_in_own_process(name, seq, bf16, _DOCS.value), batch, unit,
          _BATCH_TOLERANCE.value, _BATCH_CAP.value)
  dtype_name = jnp.dtype(cfg.dtype).name
  result = {
      "config": cfg.to_dict(), "batch": batch, "seq": seq,
      "masked_positions": predictions, "dtype": dtype_name, "attention_impl": impl,
      "docs_per_row": _DOCS.value, "steps": _STEPS.value,
      "device": devices[0].device_kind, "platform": devices[0].platform,
      "num_devices": len(devices), "cpu_count": os.cpu_count(),
      "load_average_1min": os.getloadavg()[0],
      "peak_tflops": peak, "peak_source": peak_source,
      "flops_per_step": step_flops, "hf_flops_per_step": hf_step_flops,
      "padding_fraction": 0.0, **runs,
  }
  lines = [
      f"device {devices[0].device_kind} x{len(devices)} | peak {peak:.3g} TFLOP/s "
      f"({peak_source}) | batch {batch} x seq {seq}, {predictions} masked/row, "
      f"{dtype_name}, attention {impl}"
      + (f", {_DOCS.value} isolated documents a row" if _DOCS.value > 1 else "")
      + f" | load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
      f"model FLOPs/step {step_flops['total']:.4g} ("
      + ", ".join(f"{k.replace('_', ' ')} {v:.3g}" for k, v in step_flops.items()
                  if k != "total") + ")",
  ]
  ours = runs.get("bertjax")
  if ours:
    lines[-1] += (f"; XLA counts {_fmt(ours['xla_flops'], '.4g')}"
                  + (" (XLA counts a scanned loop body once)" if cfg.scan_layers else ""))
  if "hf" in runs:
    lines.append(f"Hugging Face {runs['hf']['model_class']} ({runs['hf']['params']:,} "
                 "parameters" + (f", ours {ours['params']:,}" if ours else "")
                 + f") FLOPs/step {hf_step_flops['total']:.4g} (MLM head at all {seq} "
                 f"positions: {hf_mlm_head:.3g}) on "
                 + ("the same CPU cores" if cpu else "the same GPU")
                 + (", attending across documents" if _DOCS.value > 1 else ""))
  lines.append(f"{'':9} {'step ms median [min, max]':>27} {'seq/s':>9} {'tokens/s':>10} "
               f"{'TFLOP/s':>8} {'MFU':>6} {'peak mem MB':>11} {'max batch':>9}")
  for name, r in runs.items():
    mem = r.get("peak_device_memory_mb") or r.get("xla_memory_mb")
    lines.append(
        f"{name:9} {r['step_ms_median']:9.2f} [{r['step_ms_min']:7.2f}, {r['step_ms_max']:7.2f}]"
        f" {r['sequences_per_s']:9.1f} {r['tokens_per_s']:10.0f} {r['tflops_per_s']:8.3f} "
        f"{100 * r['mfu']:5.1f}% {_fmt(mem, '11.0f')} {_fmt(r.get('max_batch'), '9d')}")
  if ours:
    lines.append(f"bertjax start-up {sum(ours['startup_s'].values()):.1f} s: "
                 + ", ".join(f"{k} {v:.1f} s" for k, v in ours["startup_s"].items())
                 + f"; process max RSS {ours['max_rss_mb']:.0f} MB"
                 + (f"; the first step done {ours['first_step_at_s']:.1f} s after the "
                    "process started" if ours["first_step_at_s"] is not None else ""))
    lines.append(f"bertjax {ours['step_ms_pipelined']:.2f} ms/step with the steps dispatched "
                 "back to back, one sync at the end (as the trainer runs; the table's "
                 "times sync every step)")
  if ours and "hf" in runs:
    hf = runs["hf"]
    result["speedup_vs_hf"] = hf["step_ms_median"] / ours["step_ms_median"]
    result["speedup_basis"] = "same CPU cores" if cpu else "one GPU each"
    lines.append(f"speed-up vs Hugging Face (torch {hf['torch']}, {hf['threads']} threads, "
                 f"{result['speedup_basis']}): {result['speedup_vs_hf']:.2f}x")
  if ours and "profile" in ours:
    from bertjax.benchmarks import trace  # pylint: disable=g-import-not-at-top
    lines.append(trace.format_table({**ours["profile"], "device": devices[0].device_kind,
                                     "batch": batch, "seq": seq, "docs_per_row": _DOCS.value,
                                     "step_ms": ours["step_ms_median"]}))
  print("\n".join(lines))
  path = _JSON.value or os.path.join(
      "/tmp", f"bertjax_benchmark_train_{cfg.family}_L{cfg.num_layers}_H{cfg.hidden_size}"
      f"_b{batch}_t{seq}_{dtype_name}.json")
  with open(path, "w") as f:
    json.dump(result, f, indent=1, default=str)
  print(f"wrote {path}")
