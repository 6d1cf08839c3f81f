"""What a profiler trace of a train step says: its device time by category.

`device_events` reads the trace back (`jax.profiler.ProfileData`): the accelerator's
ops (the GPU's streams, the TPU's 'XLA Ops'; on a CPU the XLA thunks of the host's
threads); `program_ops` finds each op in the compiled program's text by name (its
`hlo_op`, or the kernel's name) with the model scope XLA records for it (`op_name`)
and whether it multiplies matrices; `summarize` sums the time a step per category:

- attention: the attention function inside each layer's attention module (scores,
  masks, softmax, the fused kernels; rotary tables); its projections are matmuls;
- matmuls: every other dot or GEMM (projections, feed-forward, pooler);
- MLM head + loss: the MLM head's scope and the loss computed on its logits;
- optimizer: what lies outside the forward and backward passes (update, clipping);
- other: the rest of the passes (norms, activations, embeddings, dropout);
- host input: host-to-device copies on the device (`benchmark profile` also measures
  the host's seconds to put each batch on the device).

A kernel the program does not name (a library's own) is placed by its name (GEMM,
SDPA or flash kernels), else under 'other'.
"""

from __future__ import annotations

import collections
import glob
import os
import re

import jax

from bertjax.errors import ConfigError

CATEGORIES = ("attention", "matmuls", "MLM head + loss", "optimizer", "other",
              "host input")


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?\s*->.*\{\s*$")
_GEMM = re.compile(r"gemm|matmul|cublas|xmma|nvjet|cutlass|\bdot\b", re.I)


def _opcode(rest: str) -> str:
  """The opcode of an instruction's right-hand side 'TYPE opcode(...), ...'."""
  depth, i = 0, 0
  while i < len(rest):  # Skip the result type (a tuple type holds spaces).
    c = rest[i]
    depth += c in "([{"
    depth -= c in ")]}"
    if c == " " and depth == 0:
      break
    i += 1
  match = re.match(r"\s*([\w\-]+)\(", rest[i:])
  return match.group(1) if match else ""


def program_ops(hlo_text: str) -> dict[str, dict]:
  """{instruction name: {'op_name', 'matmul'}} of an optimized HLO module's text: a
  matmul is a dot or convolution, a GEMM library call, or a fusion calling one."""
  ops, calls, has_dot = {}, {}, collections.defaultdict(bool)
  computation = ""
  for line in hlo_text.splitlines():
    head = _COMPUTATION.match(line)
    if head and "=" not in line.split("->")[0]:
      computation = head.group(1)
      continue
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    name, rest = match.groups()
    opcode = _opcode(rest)
    target = re.search(r'custom_call_target="([^"]*)"', rest)
    dot = opcode in ("dot", "convolution") or bool(
        target and _GEMM.search(target.group(1)))
    has_dot[computation] |= dot
    op_name = re.search(r'op_name="([^"]*)"', rest)
    ops[name] = {"op_name": op_name.group(1) if op_name else "", "matmul": dot}
    calls[name] = re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", rest)
  for name, called in calls.items():
    ops[name]["matmul"] |= any(has_dot[c] for c in called)
  return ops


_PROJECTION = re.compile(
    r"/(attention|attn)/(query|key|value|output|Wqkv|Wo|Dropout_\d+)/")
_ATTENTION = re.compile(r"/(attention|attn)/")


def category(op_name: str, matmul: bool) -> str:
  """The category (module docstring) of an op by its scope and kind."""
  if _ATTENTION.search(op_name) and not _PROJECTION.search(op_name):
    return "attention"
  if "/mlm/" in op_name or re.search(r"jvp\(\)", op_name):  # The head; the loss.
    return "MLM head + loss"
  if matmul:
    return "matmuls"
  if op_name and "jvp(" not in op_name:
    return "optimizer"
  return "other"


def kernel_category(name: str) -> str:
  """The category of a kernel the program does not name, by its name."""
  lower = name.lower()
  if "memcpy" in lower and ("htod" in lower or "h2d" in lower):
    return "host input"
  if re.search(r"fmha|sdpa|flash|attention|mha", lower):
    return "attention"
  return "matmuls" if _GEMM.search(lower) else "other"


_AGGREGATES = re.compile(r"Modules|Steps|Scope|Framework|TensorFlow|Source|TraceMe")


def _op_lines(plane):
  """The lines of a device plane that hold its ops once each: 'XLA Ops' where the
  profiler derived it (TPU), else the GPU's streams, else every line but those that
  span ops (modules, steps, scopes)."""
  lines = list(plane.lines)
  ops = [line for line in lines if line.name == "XLA Ops"]
  streams = [line for line in lines if line.name.startswith("Stream")]
  return ops or streams or [line for line in lines if not _AGGREGATES.search(line.name)]


def device_events(trace_dir: str, module: str
                  ) -> tuple[list[tuple[str, str | None, float]], str]:
  """([(event name, its hlo_op or None, seconds)], where from) of every device op of
  program `module` (or of none: a copy, a library's kernel) in the newest trace under
  `trace_dir`: the accelerator planes' events, or without them (a CPU) the XLA thunks
  of the host's threads (the events carrying an hlo_op)."""
  files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True),
                 key=os.path.getmtime)
  if not files:
    raise ConfigError(f"no trace (*.xplane.pb) under {trace_dir}")
  planes = list(jax.profiler.ProfileData.from_file(files[-1]).planes)
  device = [p for p in planes if p.name.startswith("/device:")]
  out = []
  for plane in device or [p for p in planes if p.name.startswith("/host:")]:
    for line in _op_lines(plane) if device else plane.lines:
      for event in line.events:
        stats = dict(event.stats)
        hlo_op, hlo_module = stats.get("hlo_op"), stats.get("hlo_module")
        if (device or hlo_op) and hlo_module in (None, module):
          out.append((event.name, hlo_op, event.duration_ns * 1e-9))
  source = (", ".join(p.name for p in device) if device
            else "the host's XLA thunks (no device plane)")
  return out, source


def summarize(events, ops: dict[str, dict], steps: int) -> tuple[dict, list, float]:
  """({category: seconds a step}, [(op, category, seconds a step)] largest first, the
  share of the time found in the program by name; the rest is placed by kernel
  names)."""
  normalized = {re.sub(r"[.\-]", "_", k): k for k in ops}
  per_op = collections.defaultdict(float)
  kinds = {}
  named = 0.0
  for name, hlo_op, seconds in events:
    key = hlo_op if hlo_op in ops else normalized.get(re.sub(r"[.\-]", "_", name))
    named += seconds if key else 0.0
    label = key or name
    kinds[label] = (category(ops[key]["op_name"], ops[key]["matmul"]) if key
                    else kernel_category(name))
    per_op[label] += seconds / steps
  totals = dict.fromkeys(CATEGORIES, 0.0)
  for label, seconds in per_op.items():
    totals[kinds[label]] += seconds
  top = sorted(((label, kinds[label], s) for label, s in per_op.items()),
               key=lambda x: -x[2])
  total = sum(s for _, _, s in events)
  return totals, top, named / total if total else 0.0


def analyze(trace_dir: str, hlo_text: str, steps: int) -> dict:
  """The newest trace under `trace_dir` of `steps` runs of the program whose optimized
  HLO text is `hlo_text`: {'device_ms': {category: ms a step}, 'top_ops': [{'op',
  'category', 'ms'}] largest first, 'named_share', 'source'}."""
  module = re.match(r"HloModule\s+([\w.\-]+)", hlo_text)
  events, source = device_events(trace_dir, module.group(1) if module else None)
  totals, top, named = summarize(events, program_ops(hlo_text), steps)
  return {"device_ms": {k: 1e3 * v for k, v in totals.items()},
          "top_ops": [{"op": o, "category": c, "ms": 1e3 * s} for o, c, s in top],
          "named_share": named, "source": source}


def format_table(result: dict, top: int = 10) -> str:
  """The categories and the largest ops as a text table."""
  busy = sum(result["device_ms"].values())
  lines = [f"one train step on {result['device']}: batch {result['batch']} x seq "
           f"{result['seq']}" + (f", {result['docs_per_row']} documents a row"
                                 if result["docs_per_row"] > 1 else "")
           + f": {result['step_ms']:.2f} ms wall, ops {busy:.2f} ms"
           + (f", put_batch (host) {result['put_batch_ms']:.2f} ms"
              if "put_batch_ms" in result else ""),
           f"ops from {result['source']}; {100 * result['named_share']:.0f}% of their "
           "time found in the program by name, the rest placed by kernel names",
           f"{'category':16} {'ms/step':>9} {'share':>6}"]
  for name, ms in result["device_ms"].items():
    lines.append(f"{name:16} {ms:9.3f} {100 * ms / busy if busy else 0:5.1f}%")
  lines.append(f"{'largest ops':54} {'category':16} {'ms/step':>9}")
  for op in result["top_ops"][:top]:
    lines.append(f"  {op['op'][:52]:52} {op['category']:16} {op['ms']:9.3f}")
  return "\n".join(lines)
