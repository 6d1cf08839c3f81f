"""`benchmarks gpu`'s table: one line per part (status, seconds, the result in short),
then each kind of result in full (train steps against Hugging Face, the attention
kernels' errors, packed rows' memory, the profile, the tests' failures); and the
counts of a pytest run read from its output (also when it was stopped)."""

from __future__ import annotations

import re

from bertjax.benchmarks import kernels, trace
from bertjax.model import attention

_OUTCOMES = "PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS"
# `pytest -v`'s line of a test: 'tests/x.py::t PASSED [ 25%]', or with pytest-xdist's
# workers '[gw0] [ 25%] PASSED tests/x.py::t'.
_OUTCOME = re.compile(rf"^(?:(?P<test>tests/\S+) (?P<outcome>{_OUTCOMES})\b|\[gw\d+\] "
                      rf"\[\s*\d+%\] (?P<outcome2>{_OUTCOMES}) (?P<test2>tests/\S+))")
_FAILURE = re.compile(r"^(FAILED|ERROR) (tests/\S+)(?: - (.*))?$")
_FINAL = re.compile(r"^=+ .*\b(passed|failed|skipped|error|errors|deselected|no tests "
                    r"ran)\b.* in [\d.]+s.* =+$")


def pytest_counts(log: str) -> dict:
  """Outcomes of a `pytest -v -rfE` run from its output (one process or pytest-xdist's
  workers): counts, the failures with their one-line reasons, whether it finished; ok
  when it did with none failed."""
  counts = dict.fromkeys(("passed", "failed", "skipped", "error", "xfail", "xpass"), 0)
  failures, finished = {}, False
  for line in log.splitlines():
    outcome, failure = _OUTCOME.match(line), _FAILURE.match(line)
    if outcome:
      test = outcome["test"] or outcome["test2"]
      result = outcome["outcome"] or outcome["outcome2"]
      counts[result.lower()] += 1
      if result in ("FAILED", "ERROR"):
        failures.setdefault(test, "")
    elif failure:
      failures[failure.group(2)] = (failure.group(3) or "")[:200]
    finished |= bool(_FINAL.match(line.strip()))
  shown = {k: v for k, v in counts.items() if v or k in ("passed", "failed")}
  summary = ", ".join(f"{v} {k}" for k, v in shown.items())
  return {**counts, "failures": [{"test": k, "reason": v} for k, v in failures.items()],
          "finished": finished, "summary": summary + ("" if finished else " (stopped)"),
          "ok": finished and not counts["failed"] and not counts["error"]}


def _sci(x) -> str:
  return "-" if x is None else f"{x:.3g}"


def path_label(run: dict) -> str:
  """The kernels a train run's attention took: per kind of layer for a family with
  windows, with '(dropout)' where attention dropout sent it to XLA."""
  cfg, packed = run.get("config", {}), run.get("docs_per_row", 0) > 1
  impl = run.get("attention_impl", "?")
  kinds = ([False, True] if cfg.get("family") == "modernbert" else [False])
  names = [attention.kernel_path(impl, packed=packed, windowed=w) for w in kinds]
  label = "/".join(dict.fromkeys(names)) + (" (global/window)" if len(set(names)) > 1
                                            else "")
  dropout = cfg.get("attention_dropout_rate", cfg.get("attention_dropout", 0.0))
  return label + (" (dropout)" if impl == "xla" and dropout else "")


def _train_line(name: str, r: dict) -> str:
  ours, hf = r.get("bertjax", {}), r.get("hf")

  def mem(x: dict) -> str:
    return _sci(x.get("peak_device_memory_mb") or x.get("xla_memory_mb"))

  line = (f"{name:22} {path_label(r):26} {r['batch']:5d}x{r['seq']:<5d}"
          f"{'p' + str(r['docs_per_row']) if r['docs_per_row'] > 1 else '':3} "
          f"{ours.get('step_ms_median', 0):9.1f} {_sci(ours.get('tokens_per_s')):>9} "
          f"{100 * ours.get('mfu', 0):5.1f}% ")
  if hf:
    line += (f"{_sci(hf['tokens_per_s']):>9} {100 * hf['mfu']:5.1f}% "
             f"{r.get('speedup_vs_hf', 0):5.2f}x {mem(ours):>7}/{mem(hf):<7}")
  else:
    line += f"{'':9} {'':6} {'':6} {mem(ours):>7}"
  if "max_batch" in ours:
    line += f" max batch {ours['max_batch']}" + (f"/{hf['max_batch']}" if hf else "")
  return line


def _short(record: dict) -> str:
  """One line of a part's result."""
  r, kind = record.get("result"), record["kind"]
  if record["status"] != "ok" and (kind != "tests" or not r):
    return record.get("reason", "")
  if kind == "smoke":
    paths = "; ".join(f"{k} {v}" for k, v in r["attention"].items())
    return (f"{', '.join(dict.fromkeys(r['devices']))}: bf16 matmul {r['matmul_size']}^3 "
            f"{r['matmul_tflops']:.3g} TFLOP/s; {paths}")
  if kind == "train":
    ours, hf = r["bertjax"], r.get("hf")
    profile = ours.get("profile")
    busy = (sum(profile["device_ms"].values()) or 1.0) if profile else 1.0
    return (f"{path_label(r)}: {_sci(ours['tokens_per_s'])} tokens/s, MFU "
            f"{100 * ours['mfu']:.1f}%" + (f"; HF {_sci(hf['tokens_per_s'])}, MFU "
                                           f"{100 * hf['mfu']:.1f}%: "
                                           f"{r['speedup_vs_hf']:.2f}x" if hf else "")
            + f"; start-up {sum(ours['startup_s'].values()):.0f} s ("
            + ", ".join(f"{k} {v:.0f}" for k, v in ours["startup_s"].items()) + ")"
            + ("; device time " + ", ".join(f"{k} {100 * v / busy:.0f}%" for k, v in
                                           profile["device_ms"].items())
               if profile else ""))
  if kind == "kernels":
    worst = {}  # The fused kernels' (XLA in bf16 is the table's yardstick).
    for row in (row for row in r["rows"] if row["impl"] != "xla"):
      for key in ("out", "dq", "dk", "dv"):
        if key in row and row[key] >= worst.get(row["dtype"], (0,))[0]:
          worst[row["dtype"]] = (row[key], f"{row['impl']} {row['case']} {key}")
    failed = sum("error" in row for row in r["rows"])
    return "; ".join(f"worst {d} error {e:.1e} ({where})" for d, (e, where) in
                     worst.items()) + (f"; {failed} failed" if failed else "")
  if kind == "levers":  # `benchmarks levers`: each variant's pipelined step.
    return "; ".join(f"{n} " + (f"{v['step_ms_pipelined']:.1f} ms" if "skipped" not in v
                                else "skipped") for n, v in r["variants"].items())
  if kind == "memory":
    return "; ".join(f"T={row['seq']} {row['layer']} {row['impl']} "
                     + (f"{row['total_mib']:.0f} MiB" if "total_mib" in row else "failed")
                     for row in r["rows"])
  return r["summary"]


def levers_table(result: dict) -> str:
  """`benchmarks levers`' table: each variant's times (when run) and the bytes its
  kernels move against base's, by source (the sources that differ)."""
  variants = {n: r for n, r in result["variants"].items() if "skipped" not in r}
  base = variants.get("base") or next(iter(variants.values()), None)
  lines = [f"levers on {result['device']}" + (" (compiled only)" if result["compile_only"]
                                              else "")
           + f", batch {result['batch']} x {result['seq']}, {result['dtype']}:",
           f"{'variant':18} {'synced ms':>9} {'piped ms':>9} {'kernel GB':>9} "
           f"{'vs base':>8} {'temp GiB':>8} {'fusions':>7} {'scatter':>7}  "
           "sources that differ from base (GB)"]
  for name, r in result["variants"].items():
    if "skipped" in r:
      lines.append(f"{name:18} skipped: {r['skipped']}")
      continue
    times = (f"{r['step_ms_synced']:9.1f} {r['step_ms_pipelined']:9.1f}"
             if "step_ms_synced" in r else f"{'-':>9} {'-':>9}")
    gb, ref = r["kernel_GB"], base["kernel_GB"]
    moved = [f"{k} {ref.get(k, {}).get('GB', 0):.2f} -> {v['GB']:.2f}"
             for k, v in gb.items() if k != "total"
             and abs(v["GB"] - ref.get(k, {}).get("GB", 0)) > 0.005 * ref["total"]["GB"]]
    lines.append(f"{name:18} {times} {gb['total']['GB']:9.2f} "
                 f"{gb['total']['GB'] / ref['total']['GB']:8.3f} {r['temp_GiB']:8.2f} "
                 f"{r['fusion']:7d} {r['scatter']:7d}  {'; '.join(moved)}")
  return "\n".join(lines)


def table(result: dict) -> str:
  """The whole report (`benchmarks gpu` prints it last and writes it to gpu.txt)."""
  parts, v = result["parts"], result["versions"]
  smoke = parts.get("smoke", {}).get("result") or {}
  devices = ", ".join(dict.fromkeys(smoke.get("devices", ["?"])))
  lines = [f"bertjax GPU check{' (dry run)' if result['dry_run'] else ''}, "
           f"{result['started']}: {result['seconds']:.0f} s of a "
           f"{result['budget_s']:.0f} s budget; {devices} ({smoke.get('platform', '?')})",
           "versions: " + ", ".join(f"{k} {x}" for k, x in v.items()),
           f"{'part':22} {'status':9} {'s':>6}  result"]
  for name, record in parts.items():
    lines.append(f"{name:22} {record['status']:9} {record.get('seconds', 0):6.1f}  "
                 f"{_short(record)}"[:400])
  train = {n: r["result"] for n, r in parts.items()
           if r["kind"] == "train" and r["status"] == "ok"}
  if train:
    peak = next(iter(train.values()))
    lines += ["", f"train steps, {peak['dtype']}, MFU = model FLOPs over "
              f"{peak['peak_tflops']:.4g} TFLOP/s ({peak['peak_source']})"
              + next((f"; HF: Hugging Face, {r['speedup_basis']}" for r in train.values()
                      if "speedup_basis" in r), ""),
              f"{'run':22} {'attention':26} {'batch x seq':14} {'ms/step':>9} "
              f"{'tokens/s':>9} {'MFU':>6} {'HF tok/s':>9} {'MFU':>6} {'ours/HF':>6} "
              f"{'peak MiB ours/HF':>15}"]
    lines += [_train_line(n, r) for n, r in train.items()]
  for name, record in parts.items():
    r = record.get("result")
    if not r or record["kind"] == "smoke":
      continue
    if record["kind"] == "train":
      if record["status"] == "ok" and "profile" in r["bertjax"]:
        lines += ["", trace.format_table({
            **r["bertjax"]["profile"], "device": r["device"], "batch": r["batch"],
            "seq": r["seq"], "docs_per_row": r["docs_per_row"],
            "step_ms": r["bertjax"]["step_ms_median"]})]
      continue
    lines.append("")
    if record["kind"] in ("kernels", "memory"):
      lines.append(kernels.format_table(r))
    elif record["kind"] == "levers":
      lines.append(levers_table(r))
    elif record["kind"] == "tests":
      lines.append(f"tests: {r['summary']}")
      lines += [f"  {f['test']}: {f['reason']}" for f in r["failures"][:20]]
  return "\n".join(lines)
