"""Where a GPU trace's time goes, op by op, back to the model: `python -m bertjax.benchmark
xplane --trace=FILE_OR_DIR [--top=20 --json=F]`.

A GPU step that XLA runs as a CUDA graph (command buffers) names none of its kernels'
HLO instructions in the trace (every kernel's `hlo_op` is `command_buffer_N`), and a
fusion kernel is named after the first of the identical fusions that share it (the
12 layers' GELU run `loop_convert_multiply_fusion_11` 12 times). The profiler stores
the compiled program itself in the trace (the `/host:metadata` plane's 'Hlo Proto'),
schedule and `op_name` metadata included. This module reads it back (a few fields of
XLA's `HloProto`, by protobuf wire format: no TensorFlow or xprof needed), walks the
entry computation's schedule beside the device's kernels (one kernel per fusion, in
order; a library call's kernels between the fusions around it: cuBLAS' GEMM and
split-K reduction, cuDNN's attention and its helpers, their memsets) and gives each
kernel its instruction, hence its model scope and a `SOURCES` label (dropout masks,
GELU, LayerNorm, ...). It also measures the device's idle time inside each step and
between steps and lists what the host was doing meanwhile (the dispatch: argument
handling, `command_buffer::update`, the graph launch; the benchmark's
`block_until_ready`).

  python -m bertjax.benchmark xplane --trace=../shared/gpu/2026-11-28/bert_base_128.xplane.pb
"""

from __future__ import annotations

import collections
import glob
import json
import os
import re

from absl import flags

from bertjax.errors import ConfigError

FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_string("trace", None, "An .xplane.pb file, or a folder holding one (the "
                      "newest is read).")
  flags.DEFINE_integer("top", 20, "Kernels listed.")
  flags.DEFINE_string("json", "", "Results file.")


# ---- Protobuf wire format (the few fields read here).


def _varint(buf: bytes, i: int) -> tuple[int, int]:
  value = shift = 0
  while True:
    byte = buf[i]
    i += 1
    value |= (byte & 0x7F) << shift
    shift += 7
    if byte < 0x80:
      return value, i


def _fields(buf):
  """(field number, value) of a message: ints for varints, memoryviews otherwise."""
  i, n = 0, len(buf)
  while i < n:
    key, i = _varint(buf, i)
    number, kind = key >> 3, key & 7
    if kind == 0:
      value, i = _varint(buf, i)
    elif kind == 1:
      value, i = buf[i:i + 8], i + 8
    elif kind == 2:
      size, i = _varint(buf, i)
      value, i = buf[i:i + size], i + size
    elif kind == 5:
      value, i = buf[i:i + 4], i + 4
    else:
      raise ValueError(f"protobuf wire type {kind} (groups) is not read here")
    yield number, value


def _ints(value) -> list[int]:
  """A repeated int64 field's value: packed (bytes) or one varint."""
  if isinstance(value, int):
    return [value]
  out, i = [], 0
  while i < len(value):
    x, i = _varint(value, i)
    out.append(x)
  return out


def _text(value) -> str:
  return bytes(value).decode("utf-8", "replace")


# xla.PrimitiveType -> (name, bytes).
_TYPES = {1: ("pred", 1), 2: ("s8", 1), 3: ("s16", 2), 4: ("s32", 4), 5: ("s64", 8),
          6: ("u8", 1), 7: ("u16", 2), 8: ("u32", 4), 9: ("u64", 8), 10: ("f16", 2),
          11: ("f32", 4), 12: ("f64", 8), 16: ("bf16", 2)}


def _shape(buf) -> list[tuple[str, tuple[int, ...]]]:
  """xla.ShapeProto -> [(dtype, dims)] (a tuple's leaves)."""
  kind, dims, leaves = 0, [], []
  for number, value in _fields(buf):
    if number == 2:
      kind = value
    elif number == 3:
      dims += _ints(value)
    elif number == 4:
      leaves += _shape(value)
  if kind == 13:  # TUPLE
    return leaves
  return [(_TYPES.get(kind, (f"type{kind}", 0))[0], tuple(dims))]


def shape_bytes(shape) -> int:
  sizes = {name: size for name, size in _TYPES.values()}
  total = 0
  for dtype, dims in shape:
    n = sizes.get(dtype, 0)
    for d in dims:
      n *= d
    total += n
  return total


def _instruction(buf) -> dict:
  out = {"called": [], "operands": [], "op_name": "", "target": "", "shape": []}
  for number, value in _fields(buf):
    if number == 1:
      out["name"] = _text(value)
    elif number == 2:
      out["opcode"] = _text(value)
    elif number == 3:
      out["shape"] = _shape(value)
    elif number == 7:  # OpMetadata: op_name = 2, source_file = 3, source_line = 4.
      for n, v in _fields(value):
        if n == 2:
          out["op_name"] = _text(v)
    elif number == 28:
      out["target"] = _text(value)
    elif number == 35:
      out["id"] = value
    elif number == 36:
      out["operands"] += _ints(value)
    elif number == 38:
      out["called"] += _ints(value)
  return out


class Program:
  """The compiled program of a trace: instructions by id and name, computations, the
  entry computation's schedule (instructions in execution order)."""

  def __init__(self, module: bytes):
    self.name, entry, self.computations, schedule = "", "", {}, {}
    self.instructions = {}
    for number, value in _fields(module):
      if number == 1:
        self.name = _text(value)
      elif number == 2:
        entry = _text(value)
      elif number == 3:
        cid, cname, body = 0, "", []
        for n, v in _fields(value):
          if n == 1:
            cname = _text(v)
          elif n == 2:
            body.append(_instruction(v))
          elif n == 5:
            cid = v
        self.computations[cid] = {"name": cname, "instructions": body}
        self.instructions.update((i["id"], i) for i in body)
        if cname == entry:
          self.entry_id = cid
          self.entry_body = body
      elif number == 7:  # HloScheduleProto: map<computation id, sequence>.
        for n, entry_kv in _fields(value):
          if n == 1:
            key, ids = 0, []
            for k, v in _fields(entry_kv):
              if k == 1:
                key = v
              elif k == 2:
                ids = [x for f, seq in _fields(v) if f == 1 for x in _ints(seq)]
            schedule[key] = ids
    order = schedule.get(self.entry_id)
    self.schedule = ([self.instructions[i] for i in order] if order
                     else list(self.entry_body))
    self.by_name = {i["name"]: i for i in self.instructions.values()}

  def fused(self, instruction: dict) -> list[dict]:
    """Every instruction inside `instruction`'s called computations, recursively."""
    out = []
    for cid in instruction["called"]:
      for inner in self.computations.get(cid, {"instructions": []})["instructions"]:
        out.append(inner)
        out += self.fused(inner)
    return out

  def operand_bytes(self, instruction: dict) -> int:
    return sum(shape_bytes(self.instructions[i]["shape"])
               for i in instruction["operands"] if i in self.instructions)


def programs(xspace: bytes) -> dict[str, Program]:
  """{module name: Program} of every 'Hlo Proto' stored in the trace (XSpace bytes)."""
  out = {}
  for number, plane in _fields(xspace):
    if number != 1:
      continue
    name, stat_names, metadata = "", {}, []
    for n, v in _fields(plane):
      if n == 2:
        name = _text(v)
      elif n == 5:  # map<int64, XStatMetadata{id = 1, name = 2}>
        entry = dict(_fields(v))
        stat = dict(_fields(entry.get(2, b"")))
        stat_names[entry.get(1, 0)] = _text(stat.get(2, b""))
      elif n == 4:  # map<int64, XEventMetadata{name = 2, stats = 5}>
        metadata.append(dict(_fields(v)).get(2, b""))
    if name != "/host:metadata":
      continue
    for event in metadata:
      for n, stat in _fields(event):
        if n != 5:
          continue
        fields = dict(_fields(stat))
        if stat_names.get(fields.get(1)) == "Hlo Proto" and 6 in fields:
          hlo = dict(_fields(fields[6]))  # HloProto: hlo_module = 1.
          program = Program(hlo[1])
          out[program.name] = program
  return out


# ---- Kernels -> instructions.

_LIBRARY = re.compile(r"nvjet|cudnn|cutlass|cublas|splitKreduce|^Memset|^memcpy|gemm_kernel"
                      r"|sm90_xmma|ampere_|sm80_", re.I)
_MAIN_LIBRARY = re.compile(r"nvjet|cutlass|cudnn_generated|sm90_xmma|ampere_|sm80_"
                           r"|gemm_kernel", re.I)


def _kernel_key(name: str) -> str:
  return re.sub(r"[.\-]", "_", name)


def assign(events: list[tuple], program: Program) -> list[tuple[tuple, dict | None, int]]:
  """[(event, its instruction or None, step index)] of a device stream's events
  (name, start_ns, duration_ns, ...) in time order: each fusion of the entry schedule
  is one kernel (named after it or after an identical earlier fusion: same kind); a
  library call's kernels (GEMM, its split-K reduction, cuDNN's, the memsets around
  them) lie between the fusions around it. The schedule repeats once a step."""
  kernels = [i for i in program.schedule if i["opcode"] in ("fusion", "custom-call")]
  fusions = [k for k, i in enumerate(kernels) if i["opcode"] == "fusion"]
  if not fusions:
    raise ConfigError("the trace's program has no fusions to align its kernels with")
  n = len(kernels)
  kind = lambda name: re.sub(r"_\d+$", "", _kernel_key(name))
  out, library, count, previous = [], [], 0, -1

  def place(segment, lo, hi):
    """The library kernels between global kernel positions lo and hi (exclusive)."""
    calls = [(k // n, kernels[k % n]) for k in range(lo + 1, hi)
             if kernels[k % n]["opcode"] == "custom-call"]
    owner = -1
    for event in segment:
      main = bool(_MAIN_LIBRARY.search(event[0])) and not event[0].startswith("Memset")
      owner += main
      # A memset before a call's main kernel belongs to that call; a helper after it
      # (split-K reduction, cuDNN's conversions) to the call before.
      k = owner + 1 if event[0].startswith("Memset") else owner
      k = min(max(k, 0), len(calls) - 1)
      step = calls[k][0] if calls else max(lo, 0) // n
      out.append((event, calls[k][1] if calls else None, step))

  for event in events:
    if _LIBRARY.search(event[0]):
      library.append(event)
      continue
    step, k = divmod(count, len(fusions))
    position = step * n + fusions[k]
    if kind(event[0]) != kind(kernels[fusions[k]]["name"]):
      raise ConfigError(f"kernel {event[0]!r} is not the schedule's next fusion "
                        f"{kernels[fusions[k]]['name']!r}: the trace and its program "
                        "disagree")
    place(library, previous, position)
    library, previous = [], position
    out.append((event, kernels[fusions[k]], step))
    count += 1
  place(library, previous, (previous // n + 1) * n)
  return out


# ---- Instructions -> their source in the model.

# (label, pattern over a kernel's op_names (its fusion's instructions' metadata, the
# 'jit(train_step)/' prefix dropped; a backward op carries 'transpose(')), first match
# wins. The files: the model's in bertjax/model/, the loss in bertjax/objectives/mlm.py,
# the optimizer in bertjax/train/optimizer.py.
SOURCES = (
    ("dropout masks drawn (threefry)", r"jit\(_bernoulli\)|jit\(_uniform\)|threefry2x32"
     r"|random_bits"),
    ("attention (fused kernel)", r"pallas_call|/attention/(?!query|key|value|output)"
     r"[^/]*/?(softmax|reduce_max|exp)"),
    ("GELU forward (erf) + bias", r"^jvp\(.*/(erf|erfc|erf_inv)$"),
    ("GELU backward + intermediate bias grad", r"^transpose\(.*/intermediate/reduce_sum$"),
    ("embedding gather / scatter-add", r"embeddings/.*(_take|scatter|gather)"),
    ("LayerNorm (+ residual, dropout)", r"_norm/|LayerNorm/"),
    ("dropout applied (select, 1/keep)", r"Dropout_\d+/|/dropout/"),
    ("MLM head + loss", r"/mlm/|^jvp\(\)/|^transpose\(jvp\(\)\)/|/nsp/|/pooler/"),
    ("bias add / bias grad", r"/(query|key|value|output|intermediate|dense)/(add|reduce_sum)$"),
    ("float32 params cast to bf16", r"^jvp\(.*/convert_element_type$"),
    ("residual gradient adds", r"add_any$"),
    ("optimizer, clipping, norms", r"^(?!jvp\(|transpose\().+"),
)


_DECISIVE = 5  # SOURCES' labels decided by one matching op_name.


def op_names(program: Program, instruction: dict) -> collections.Counter:
  """The op_names inside a kernel's instruction (layers folded: layer_*)."""
  names = collections.Counter()
  for i in [instruction, *program.fused(instruction)]:
    name = re.sub(r"^jit\([\w.]+\)/", "", i["op_name"])
    if name:
      names[re.sub(r"layer_\d+", "layer_*", name)] += 1
  return names


def is_matmul(program: Program, instruction: dict) -> bool:
  """A GEMM library call, or a fusion around a dot (XLA's Triton GEMM)."""
  if instruction["opcode"] == "custom-call":
    return bool(re.search(r"cublas|gemm|matmul", instruction["target"], re.I))
  return any(i["opcode"] in ("dot", "convolution") for i in program.fused(instruction))


def source(program: Program, instruction: dict | None) -> tuple[str, list[str]]:
  """(label, [every other SOURCES label its op_names match]) of a kernel's
  instruction: the first of SOURCES' first five that any of its op_names matches (an
  RNG, GELU or scatter inside a fusion is what it costs), else the label most of its
  op_names match, the optimizer's only when no other does."""
  if instruction is None:
    return "memsets / copies", []
  names = op_names(program, instruction)
  if instruction["opcode"] == "custom-call" and "cudnn" in instruction["target"]:
    return "attention (fused kernel)", []
  if is_matmul(program, instruction):
    return "matmuls", []
  votes = collections.Counter()
  for label, pattern in SOURCES:
    votes[label] = sum(c for n, c in names.items() if re.search(pattern, n))
  matched = [label for label, _ in SOURCES if votes[label]]
  decisive = [label for label, _ in SOURCES[:_DECISIVE] if votes[label]]
  rest = [label for label in matched if label != SOURCES[-1][0]]
  if decisive:
    label = decisive[0]
  elif rest:
    label = max(rest, key=lambda x: votes[x])
  else:
    label = matched[0] if matched else "other"
  return label, [m for m in matched if m != label]


def scope(names: collections.Counter) -> str:
  """The most frequent op_name of a kernel, shortened (its model scope)."""
  if not names:
    return ""
  name = re.sub(r"/jit\(_\w+\)", "", names.most_common(1)[0][0])
  name = re.sub(r"^transpose\(jvp\(\w*\)\)/", "bwd ", name)
  return re.sub(r"^jvp\(\w*\)/", "fwd ", name)[:110]


# ---- The trace.


def read(path: str) -> tuple[bytes, str]:
  """(the XSpace bytes, the file) of `path` or of the newest .xplane.pb under it."""
  if os.path.isdir(path):
    files = sorted(glob.glob(os.path.join(path, "**", "*.xplane.pb"), recursive=True),
                   key=os.path.getmtime)
    if not files:
      raise ConfigError(f"no trace (*.xplane.pb) under {path}")
    path = files[-1]
  with open(path, "rb") as f:
    return f.read(), path


def _device_stream(path: str, module: str):
  """The device's kernels of program `module` in time order, and every host event
  (name, start_ns, duration_ns), from the trace at `path`."""
  import jax  # pylint: disable=g-import-not-at-top
  planes = list(jax.profiler.ProfileData.from_file(path).planes)
  device, host = [], []
  for plane in planes:
    for line in plane.lines:
      if plane.name.startswith("/device:") and not re.search(r"Memcpy|Steps|Modules",
                                                              line.name):
        for e in line.events:
          stats = dict(e.stats)
          if stats.get("hlo_module") in (None, module):
            device.append((e.name, e.start_ns, e.duration_ns))
      elif plane.name.startswith("/host:"):
        host += [(e.name, e.start_ns, e.duration_ns) for e in line.events]
  device.sort(key=lambda e: e[1])
  return device, host


# What the host does between two steps (XLA / PJRT / JAX trace names).
HOST_PHASES = ("ParseArguments", "DevicePut", "ExecutePrepare", "command_buffer::update",
               "cuGraphLaunch", "block_until_ready", "ExecuteThunks")


def analyze(path: str, module: str = "") -> dict:
  """The trace at `path` (a file or folder) of a program (default: the one stored
  with the most instructions): per step its span, busy and idle time; the gaps between
  steps with the host's phases inside them; the device time by source; the kernels
  grouped by name (a name runs once per identical fusion: e.g. per layer)."""
  data, path = read(path)
  stored = programs(data)
  if not stored:
    raise ConfigError(f"{path} holds no compiled program ('Hlo Proto'): a CPU trace, "
                      "or one from a profiler that did not store it")
  program = (stored[module] if module else
             max(stored.values(), key=lambda p: len(p.instructions)))
  device, host = _device_stream(path, program.name)
  placed = assign(device, program)
  steps = max(s for _, _, s in placed) + 1
  spans = []
  for s in range(steps):
    events = [e for e, _, step in placed if step == s]
    start, end = events[0][1], max(e[1] + e[2] for e in events)
    busy, reach, idle = 0.0, start, 0.0
    for e in events:
      idle += max(0.0, e[1] - reach)
      reach = max(reach, e[1] + e[2])
      busy += e[2]
    spans.append({"start_ms": start * 1e-6, "span_ms": (end - start) * 1e-6,
                  "kernels_ms": busy * 1e-6, "idle_inside_ms": idle * 1e-6,
                  "kernels": len(events), "end_ns": end, "start_ns": start})
  gaps = []
  for a, b in zip(spans, spans[1:]):
    lo, hi = a["end_ns"], b["start_ns"]
    phases = collections.defaultdict(float)
    for name, start, duration in host:
      overlap = min(hi, start + duration) - max(lo, start)
      for phase in HOST_PHASES:
        if phase in name and overlap > 0:
          phases[phase] = max(phases[phase], overlap * 1e-6)
    gaps.append({"idle_ms": (hi - lo) * 1e-6, "host_phases_ms": dict(phases)})
  by_source = collections.defaultdict(float)
  groups = {}
  for event, instruction, _ in placed:
    label, matched = source(program, instruction)
    by_source[label] += event[2] * 1e-6 / steps
    library = instruction is not None and instruction["opcode"] != "fusion"
    key = (re.sub(r"layer_\d+", "layer_*", instruction["op_name"]) or instruction["name"]
           if library else event[0])
    g = groups.setdefault(key, {"kernel": "", "source": label, "also": matched,
                                "ms": 0.0, "launches": 0, "instructions": set(),
                                "scope": "", "bytes": 0})
    g["ms"] += event[2] * 1e-6 / steps
    main = not library or (_MAIN_LIBRARY.search(event[0])
                           and not event[0].startswith("Memset"))
    g["launches"] += bool(main)
    if main and not g["kernel"]:
      g["kernel"] = event[0][:80]
    if instruction is not None:
      if instruction["name"] not in g["instructions"]:
        g["bytes"] += (shape_bytes(instruction["shape"])
                       + program.operand_bytes(instruction))
      g["instructions"].add(instruction["name"])
      g["scope"] = g["scope"] or scope(op_names(program, instruction))
  top = sorted(groups.values(), key=lambda g: -g["ms"])
  for g in top:
    g["launches"] //= steps
    g["instructions"] = sorted(g["instructions"])[:3] + (
        ["..."] if len(g["instructions"]) > 3 else [])
    # Bytes in and out of its instructions over its time: the DRAM rate it reached.
    g["GB_per_s"] = g["bytes"] / (g["ms"] * 1e-3) / 1e9 if g["ms"] else 0.0
  return {"trace": path, "program": program.name, "steps": steps,
          "step_spans": [{k: v for k, v in s.items() if not k.endswith("_ns")}
                         for s in spans],
          "between_steps": gaps,
          "device_ms_by_source": dict(sorted(by_source.items(), key=lambda x: -x[1])),
          "kernels": top}


_OPCODE = re.compile(r"=\s*(?:\([^=]*?\)|[\w\[\]{},:\d]+)\s+([\w\-]+)\(")


def hlo_counts(text: str) -> dict[str, int]:
  """Instruction counts of an optimized HLO module's text, fused computations
  included: fusions, custom calls (library GEMMs, attention), RNG ops, the integer
  ops threefry expands into, scatters, erf."""
  ops = collections.Counter(m.group(1) for m in _OPCODE.finditer(text))
  return {"instructions": sum(ops.values()), "fusion": ops["fusion"],
          "custom-call": ops["custom-call"],
          "rng-bit-generator": ops["rng-bit-generator"] + ops["rng"],
          "threefry ops (shift, xor, or)": sum(ops[k] for k in (
              "shift-left", "shift-right-logical", "xor", "or")),
          "scatter": ops["scatter"], "erf": ops["erf"]}


# Entry instructions that launch no kernel of their own.
_NO_KERNEL = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all",
              "partition-id", "replica-id", "opt-barrier"}


def compiled_program(compiled) -> Program:
  """The `Program` of a compiled JAX program (`jit(...).lower(...).compile()`), e.g.
  one compiled for a GPU target on a CPU (`bertjax.benchmarks.gpu_target`)."""
  module = compiled.runtime_executable().hlo_modules()[0]
  return Program(module.as_serialized_hlo_module_proto())


def kernel_bytes(program: Program) -> dict:
  """The bytes the program's kernels move, without running it: each kernel's output
  and operands (a while loop's body counted once), by `SOURCES` label ({label:
  {'GB', 'kernels'}}, largest first) and 'total'. A fusion reads and writes these
  bytes once: a memory-bound kernel's time is about its bytes over the HBM rate (a
  GEMM's and a compute-bound kernel's are not; nor is a scatter-add's whose atomics
  serialize)."""
  by = collections.defaultdict(lambda: [0, 0])

  def walk(body):
    for instruction in body:
      if instruction["opcode"] in ("while", "conditional", "call"):
        for cid in instruction["called"]:
          walk(program.computations[cid]["instructions"])
      elif instruction["opcode"] not in _NO_KERNEL:
        label, _ = source(program, instruction)
        by[label][0] += shape_bytes(instruction["shape"]) + program.operand_bytes(instruction)
        by[label][1] += 1

  walk(program.schedule)
  out = {label: {"GB": b / 1e9, "kernels": n}
         for label, (b, n) in sorted(by.items(), key=lambda kv: -kv[1][0])}
  out["total"] = {"GB": sum(v["GB"] for v in out.values()),
                  "kernels": sum(v["kernels"] for v in out.values())}
  return out


def format_report(result: dict, top: int = 20) -> str:
  lines = [f"{result['trace']}: program {result['program']}, {result['steps']} steps"]
  for k, s in enumerate(result["step_spans"]):
    lines.append(f"step {k}: {s['kernels']} kernels, span {s['span_ms']:.2f} ms, kernels "
                 f"{s['kernels_ms']:.2f} ms, device idle inside {s['idle_inside_ms']:.2f} ms")
  for k, g in enumerate(result["between_steps"]):
    phases = ", ".join(f"{p} {ms:.1f}" for p, ms in g["host_phases_ms"].items())
    lines.append(f"between steps {k} and {k + 1}: device idle {g['idle_ms']:.2f} ms; "
                 f"host meanwhile (ms): {phases or 'nothing traced'}")
  busy = sum(result["device_ms_by_source"].values())
  lines.append(f"{'device time a step by source':42} {'ms':>8} {'share':>6}")
  for label, ms in result["device_ms_by_source"].items():
    lines.append(f"  {label:40} {ms:8.3f} {100 * ms / busy:5.1f}%")
  lines.append(f"{'kernel (launches a step)':44} {'ms':>7} {'GB/s':>6}  source; scope")
  for g in result["kernels"][:top]:
    lines.append(f"  {g['kernel'][:38]:38} ({g['launches']:3d}) {g['ms']:7.3f} "
                 f"{g['GB_per_s']:6.0f}  {g['source']}"
                 + (f" (also {', '.join(g['also'])})" if g["also"] else "")
                 + f"; {g['scope']}")
  return "\n".join(lines)


def main(argv):
  del argv
  if not FLAGS.trace:
    raise ConfigError("--trace: an .xplane.pb file or a folder holding one")
  result = analyze(FLAGS.trace)
  if FLAGS.json:
    with open(FLAGS.json, "w") as out:
      json.dump(result, out, indent=1)
  print(format_report(result, FLAGS.top))
