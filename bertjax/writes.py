"""What a command may write, in one place: the contract (`COMMANDS`, the table of
docs/writes.md) and the three ways every command writes through.

- **A workdir belongs to the run that made it.** WORKDIR/run.json records the run's
  kind (`KINDS`: a pretraining run, a fine-tuning run of one task, a sweep of them, a
  checkpoint converted by `convert --to=bertjax`, a benchmark's directory); a workdir
  written before run.json existed is recognised by its files (`owner`). `claim` refuses,
  in one line and before anything is written, a workdir holding another kind of run
  (or a Hugging Face / sentence-transformers folder, or any other non-empty folder),
  and an `init_from` equal to the workdir or inside it; `record` writes run.json once
  every check has passed and every input has been read.
- **Exports are whole or absent** (`export_dir`): written into a temporary folder
  beside the destination and renamed into place. A destination equal to a source, inside
  one or holding one is refused; a non-empty one is refused unless `--overwrite`, which
  replaces the export's files and removes the files another bertjax export writes there
  (`EXPORT_NAMES`, by name: old files are never read to decide anything), so that two
  models never mix; other files stay. A failure leaves the destination as it was.
- **Output files** (`output_file`): an output equal to an input is refused; an existing
  one is replaced only with `--overwrite`; it is written to a temporary file and renamed,
  so a failure leaves the old one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import uuid
from typing import Iterator, Sequence

from etils import epath

from bertjax.checkpoint import files
from bertjax.data import manifest
from bertjax.errors import CheckpointError

RUN_FILE = "run.json"
# The kinds of run a workdir can belong to.
PRETRAINING, FINETUNING, SWEEP, CONVERSION, PREPARED, BENCHMARK = (
    "pretraining", "finetuning", "sweep", "conversion", "prepared", "benchmark")
KINDS = (PRETRAINING, FINETUNING, SWEEP, CONVERSION, PREPARED, BENCHMARK)
OTHER = "other"  # a folder no bertjax run made (its `Owner.task` says what it holds)

# Every name a bertjax export writes at a destination's top level (a Hugging Face
# model's files, each tokenizer kind's, a sentence-transformers folder's modules, a
# converted workdir's): `--overwrite` removes those this export does not write.
EXPORT_NAMES = frozenset({
    "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
    "vocab.txt", "vocab.json", "merges.txt", "sentencepiece.bpe.model", "spm.model",
    "special_tokens_map.json", "modules.json", "1_Pooling", "2_Normalize",
    "1_SpladePooling", "1_Dense", "2_MultiVectorMask", "3_Normalize",
    "router_config.json", "query_0_SparseStaticEmbedding", "document_0_MLMTransformer",
    "document_1_SpladePooling",
    "sentence_bert_config.json", "config_sentence_transformers.json", "generator",
    RUN_FILE, files.TOKENIZER_DIR, files.CHECKPOINT_DIR})


@dataclasses.dataclass(frozen=True)
class Owner:
  """Who a directory belongs to: a run `kind` of `KINDS` (with its `task`: the
  fine-tuning task, the benchmark's name; '' otherwise) or `OTHER` (`task` then says
  what the folder holds)."""

  kind: str
  task: str = ""

  def describe(self) -> str:
    if self.kind == FINETUNING:
      return f"a fine-tuning run of task {self.task!r}"
    if self.kind == SWEEP:
      return f"a sweep of {self.task!r} fine-tuning runs"
    if self.kind == CONVERSION:
      return "a checkpoint converted by python -m bertjax.convert --to=bertjax"
    if self.kind == PREPARED:
      return "a corpus prepared by python -m bertjax.data.prepare"
    if self.kind == BENCHMARK:
      return f"the directory of benchmark {self.task!r}"
    if self.kind == PRETRAINING:
      return "a pretraining run"
    return self.task


def _json(path: epath.Path) -> dict:
  try:
    value = json.loads(path.read_text())
  except (OSError, ValueError):
    return {}
  return value if isinstance(value, dict) else {}


def owner(path: str) -> Owner | None:
  """Who `path` belongs to: None when it is absent or an empty directory (but for
  launch/local.sh's logs, `files.LAUNCH_LOG`); its run.json's
  run; for a workdir older than run.json, the run its files show (task.json: fine-tuning;
  sweep_results.json: a sweep; config.json with a model and a train section: pretraining,
  with a model alone: a conversion); else `OTHER`, naming a Hugging Face or
  sentence-transformers folder, a file, or a few of the folder's entries."""
  p = epath.Path(path)
  if not p.exists():
    return None
  if not p.is_dir():
    return Owner(OTHER, "a file")
  names = sorted(e.name for e in p.iterdir() if not files.LAUNCH_LOG.fullmatch(e.name))
  if not names:  # (a launcher's logs are written before the run starts)
    return None
  run = _json(p / RUN_FILE)
  if run.get("kind") in KINDS:
    return Owner(run["kind"], run.get("task", ""))
  if files.TASK_FILE in names:
    return Owner(FINETUNING, _json(p / files.TASK_FILE).get("name", ""))
  if files.SWEEP_RESULTS_FILE in names:
    runs = _json(p / files.SWEEP_RESULTS_FILE).get("runs") or [{}]
    task = _json(epath.Path(runs[0].get("workdir", path)) / files.TASK_FILE).get("name", "")
    return Owner(SWEEP, task)
  if {manifest.SETTINGS, manifest.SUMMARY} & set(names) or all(
      (p / n).is_dir() and owner(os.fspath(p / n)) == Owner(PREPARED) for n in names):
    return Owner(PREPARED)  # A stage's directory, or a mixture's: one a source.
  config = _json(p / files.CONFIG_FILE) if files.CONFIG_FILE in names else {}
  if isinstance(config.get("model"), dict):
    return Owner(PRETRAINING if "train" in config else CONVERSION)
  if "modules.json" in names:
    return Owner(OTHER, "a sentence-transformers folder")
  if "model_type" in config:
    return Owner(OTHER, f"a Hugging Face model (model_type {config['model_type']!r})")
  shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
  return Owner(OTHER, f"files no bertjax run wrote ({shown})")


def _resolved(path: str) -> str:
  path = os.fspath(path)
  return path.rstrip("/") if "://" in path else os.path.realpath(path)


def same_or_inside(path: str, directory: str) -> bool:
  """Whether `path` is `directory` or lies inside it (symbolic links followed)."""
  a, b = _resolved(path), _resolved(directory)
  return a == b or a.startswith(b.rstrip("/") + "/")


# The inputs a run starts from (checkpoints): neither its workdir nor inside it. Any
# other input (a corpus, a tokenizer, a training file) only may not be the workdir.
STARTS = ("config.init_from", "config.init_generator_from")


def check_inputs(output: str, inputs: dict[str, str], what: str) -> None:
  """A one-line CheckpointError when the output directory `output` (named `what`, e.g.
  '--workdir') is one of `inputs` ({name: path}, e.g. {'config.init_from': ...}; those
  not on disk skipped) or, for a checkpoint it starts from (`STARTS`), holds one: a
  command never writes where it reads."""
  for name, path in inputs.items():
    if not path or not epath.Path(path).exists():
      continue  # unset, or no path on disk ('embedded', tfds:NAME, a glob): nothing to clobber
    same = _resolved(path) == _resolved(output)
    if same or (name in STARTS and same_or_inside(path, output)):
      raise CheckpointError(f"{name}={path} {'is' if same else 'lies inside'} {what}="
                            f"{output}: a command never writes where it reads; give {what} "
                            "a new directory.")


def claim(workdir: str, kind: str, task: str = "", inputs: dict[str, str] | None = None,
          flag: str = "--workdir") -> Owner | None:
  """Checks that a run of `kind` (and `task`) may write `workdir` (given as `flag`),
  before anything is written: none of `inputs` ({flag or config field: path}:
  init_from, the corpus, ...) is the workdir (`check_inputs`), and the workdir is
  absent, empty or a run of the same kind and task (being resumed). Returns the
  workdir's `owner` (None: a new run); a one-line CheckpointError otherwise."""
  check_inputs(workdir, inputs or {}, flag)
  found = owner(workdir)
  if found is None or found == Owner(kind, task) or (found.kind == kind and not found.task):
    return found  # new, the same run, or one older than run.json whose task is unnamed
  if found.kind in (PRETRAINING, CONVERSION, FINETUNING) or "model" in found.task:
    hint = f"start from it with config.init_from and a new {flag}"
  else:
    hint = f"give a new or empty {flag}"
  raise CheckpointError(f"{flag}={workdir} holds {found.describe()}, not "
                        f"{Owner(kind, task).describe()}: a directory belongs to the run "
                        f"that made it; {hint}.")


def record(workdir: str, kind: str, task: str = "") -> None:
  """Writes WORKDIR/run.json (its `Owner`), once `claim` and every input have passed;
  kept as it is when present. Call on process 0 only."""
  path = epath.Path(workdir) / RUN_FILE
  if not path.exists():
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": kind, "task": task}, indent=2) + "\n")


def _entries(directory: str) -> list[str]:
  return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


def _beside(path: str, label: str) -> str:
  parent, name = os.path.split(os.path.abspath(path))
  return os.path.join(parent, f".{name}.{label}-{uuid.uuid4().hex[:8]}")


def _remove(path: str) -> None:
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path)
  elif os.path.lexists(path):
    os.remove(path)


@contextlib.contextmanager
def export_dir(dst: str, overwrite: bool = False, sources: dict[str, str] | None = None,
               kind: str = "", flag: str = "--dst") -> Iterator[str]:
  """Yields a new empty temporary directory beside `dst` to write an export into, then
  puts it in place (module docstring); `kind` (a run kind of `KINDS`) is the only run
  whose workdir `dst` may be (with `overwrite`). Refused in one line before anything is
  written: `dst` equal to a source of `sources` ({flag: path}), inside one or holding
  one; a file; a workdir of a run (but `kind`'s); a non-empty folder without
  `overwrite`. On any error inside, the temporary directory is removed and `dst` is
  left as it was."""
  sources = {k: v for k, v in (sources or {}).items() if v and epath.Path(v).exists()}
  for name, path in sources.items():
    if same_or_inside(dst, path) or same_or_inside(path, dst):
      where = ("is" if _resolved(path) == _resolved(dst) else
               "lies inside" if same_or_inside(dst, path) else "holds")
      raise CheckpointError(f"{flag}={dst} {where} {name}={path}: an export never writes "
                            f"where it reads; give {flag} a new directory.")
  found = owner(dst)
  if found is not None and found.task == "a file":
    raise CheckpointError(f"{flag}={dst} is a file: give a directory.")
  if found is not None and found.kind in KINDS and found.kind != kind:
    raise CheckpointError(f"{flag}={dst} holds {found.describe()}: an export never writes "
                          f"into a run's workdir; give {flag} a new directory.")
  if found is not None and not overwrite:
    shown = _entries(dst)
    raise CheckpointError(
        f"{flag}={dst} is not empty ({', '.join(shown[:3])}{', ...' if len(shown) > 3 else ''})"
        ": give a new or empty directory, or --overwrite to replace what the export writes "
        "there.")
  remote = "://" in os.fspath(dst)
  if remote:  # Written here, then copied up (an object store renames nothing).
    tmp = tempfile.mkdtemp(prefix="bertjax-export-")
  else:
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    tmp = _beside(dst, "tmp")
    os.makedirs(tmp)
  try:
    yield tmp
    if remote:
      _upload(tmp, epath.Path(dst))
    else:
      _install(tmp, dst)
  except OSError as e:
    raise CheckpointError(f"cannot write {dst} ({e}); it is as it was before.") from None
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp)


def _upload(tmp: str, dst: epath.Path) -> None:
  """The export in `tmp` copied to a remote `dst`, file by file."""
  for parent, _, names in os.walk(tmp):
    for name in names:
      target = dst / os.path.relpath(os.path.join(parent, name), tmp)
      target.parent.mkdir(parents=True, exist_ok=True)
      with open(os.path.join(parent, name), "rb") as f:
        target.write_bytes(f.read())


def _install(tmp: str, dst: str) -> None:
  """Puts the export in `tmp` at `dst`: renamed whole when `dst` is absent or empty;
  else each of its entries replaces `dst`'s, and `dst`'s other `EXPORT_NAMES` go, the
  old entries moved aside first and put back should a rename fail."""
  if not _entries(dst):
    if os.path.isdir(dst):
      os.rmdir(dst)
    os.rename(tmp, dst)
    return
  new = _entries(tmp)
  stale = [n for n in _entries(dst) if n in EXPORT_NAMES and n not in new]
  aside = _beside(dst, "old")
  os.makedirs(aside)
  moved, placed = [], []
  try:
    for name in new + stale:
      if os.path.lexists(os.path.join(dst, name)):
        os.rename(os.path.join(dst, name), os.path.join(aside, name))
        moved.append(name)
    for name in new:
      os.rename(os.path.join(tmp, name), os.path.join(dst, name))
      placed.append(name)
  except OSError:  # Back as it was.
    for name in placed:
      _remove(os.path.join(dst, name))
    for name in moved:
      os.rename(os.path.join(aside, name), os.path.join(dst, name))
    raise
  finally:
    shutil.rmtree(aside, ignore_errors=True)


def check_not_input(path: str, inputs: dict[str, str], flag: str = "--out") -> None:
  """A one-line CheckpointError when the output file `path` (given as `flag`) is one of
  `inputs` ({flag: path}) or lies inside one (a model directory it reads)."""
  for name, given in inputs.items():
    if given and os.path.exists(given) and same_or_inside(path, given):
      where = "is" if _resolved(path) == _resolved(given) else "lies inside"
      raise CheckpointError(f"{flag}={path} {where} {name}={given}: a command never writes "
                            f"where it reads; give {flag} a new path.")


@contextlib.contextmanager
def output_file(path: str, overwrite: bool = False, inputs: dict[str, str] | None = None,
                flag: str = "--out") -> Iterator[str]:
  """Yields a temporary path beside `path` (with its extension) to write an output file
  to, renamed to `path` when the block ends without error (else removed: an old
  `path` stays). Refused in one line before anything is written: `path` one of `inputs`
  ({flag: path}) or inside one; a directory; an existing file without `overwrite`."""
  check_not_input(path, inputs or {}, flag)
  if os.path.isdir(path):
    raise CheckpointError(f"{flag}={path} is a directory: give a file path.")
  if os.path.lexists(path) and not overwrite:
    raise CheckpointError(f"{flag}={path} exists: give a new path, or --overwrite to "
                          "replace it.")
  parent = os.path.dirname(os.path.abspath(path))
  try:
    os.makedirs(parent, exist_ok=True)
  except OSError as e:
    raise CheckpointError(f"cannot write {flag}={path} ({e}).") from None
  stem, ext = os.path.splitext(os.path.basename(path))
  tmp = os.path.join(parent, f".{stem}.tmp-{uuid.uuid4().hex[:8]}{ext}")
  try:
    yield tmp
    os.replace(tmp, path)
  except OSError as e:
    raise CheckpointError(f"cannot write {flag}={path} ({e}).") from None
  finally:
    if os.path.lexists(tmp):
      os.remove(tmp)


@dataclasses.dataclass(frozen=True)
class Contract:
  """What one command writes: what it `creates`, what it may `replace` and what it
  never touches (`never`); `cases`: the refusals it owes (tests/test_writes.py walks
  each command through its cases)."""

  command: str
  creates: str
  replaces: str
  never: str
  cases: tuple[str, ...]


_NEVER_RUN = ("init_from and every other input; another run's workdir, a Hugging Face "
              "or sentence-transformers folder, any non-empty folder it did not make")
# The cases of tests/test_writes.py: what a command refuses (or, for an export into a
# non-empty folder with --overwrite, does whole).
CASES = {
    "workdir_is_init_from": "--workdir equal to config.init_from (or holding it)",
    "workdir_of_another_run": "--workdir of another kind of run or another model's folder",
    "resume_changed": "a rerun whose data, batch or task settings differ from the run's",
    "failing_input_after_finished_run": "a rerun of a finished run whose input fails",
    "dst_is_src": "--dst equal to --src, inside it or holding it",
    "dst_not_empty": "--dst holding files, without --overwrite",
    "dst_of_another_model": "--overwrite onto another model's export",
    "interrupted_export": "an export failing half-way",
    "output_is_input": "an output equal to an input",
    "output_exists": "an existing output, without --overwrite",
}
COMMANDS = (
    Contract("python -m bertjax.main",
             "WORKDIR (run.json, config.json, tokenizer/, init_from.json, checkpoints/, "
             "metrics.jsonl, tensorboard/, training.png)",
             "its own run's checkpoints (max_to_keep), metrics, config.json with the "
             "settings a resume may change (logged)", _NEVER_RUN,
             ("workdir_is_init_from", "workdir_of_another_run", "resume_changed",
              "failing_input_after_finished_run")),
    Contract("python -m bertjax.finetune",
             "WORKDIR (run.json, config.json, tokenizer/, task.json, checkpoints/, "
             "dev_results.json, dev_predictions.json; a sweep: WORKDIR/lr*_seed*/ and "
             "sweep_results.json / .md)",
             "its own run's checkpoints, dev results, sweep table, config.json with the "
             "settings a resume may change (logged)", _NEVER_RUN,
             ("workdir_is_init_from", "workdir_of_another_run", "resume_changed",
              "failing_input_after_finished_run")),
    Contract("python -m bertjax.convert",
             "DST whole: a Hugging Face / sentence-transformers folder (--to=hf) or a "
             "bertjax workdir (--to=bertjax)",
             "with --overwrite: DST's model files (EXPORT_NAMES); other files stay",
             "SRC; a run's workdir as DST; a non-empty DST without --overwrite",
             ("dst_is_src", "dst_not_empty", "dst_of_another_model", "interrupted_export",
              "workdir_of_another_run")),
    Contract("python -m bertjax.merge",
             "DST whole: the merged model as a Hugging Face folder (--to=hf) or a bertjax "
             "workdir (--to=bertjax)",
             "with --overwrite: DST's model files (EXPORT_NAMES); other files stay",
             "--src, --base; a run's workdir as DST; a non-empty DST without --overwrite",
             ("dst_is_src", "dst_not_empty", "dst_of_another_model", "interrupted_export",
              "workdir_of_another_run")),
    Contract("python -m bertjax.predict",
             "--output (default CHECKPOINT/predictions.jsonl) or --glue_dir's TASK.tsv",
             "that file, with --overwrite", "--input, the checkpoint's other files",
             ("output_is_input", "output_exists")),
    Contract("python -m bertjax.embed",
             "--out (.npz, .npy, .png)", "that file, with --overwrite",
             "--input, --checkpoint, --standardize", ("output_is_input", "output_exists")),
    Contract("python -m bertjax.mine",
             "--out (JSON lines)", "that file, with --overwrite",
             "--pairs, --corpus, --model", ("output_is_input", "output_exists")),
    Contract("python -m bertjax.rerank",
             "--out (JSON lines of scored pairs, or a reranked TREC run)",
             "that file, with --overwrite", "--pairs, --run, --beir, --model",
             ("output_is_input", "output_exists")),
    Contract("python -m bertjax.plot",
             "--out (default WORKDIR/training.png, the run's own picture)",
             "the run's training.png; --out with --overwrite", "metrics.jsonl",
             ("output_is_input", "output_exists")),
    Contract("python -m bertjax.data.prepare",
             "--output (run.json, shards, summary / settings / manifest, tokenizer/)",
             "nothing: a rerun finishes the units left (same settings only)",
             "--input; another run's workdir or a non-empty folder it did not prepare",
             ("output_is_input", "workdir_of_another_run")),
    Contract("python -m bertjax.data.train_tokenizer",
             "--output whole (the tokenizer's files)",
             "with --overwrite: the tokenizer files there", "--input",
             ("output_is_input", "dst_not_empty")),
    Contract("python -m bertjax.benchmark (--scale_dir, --workdir, --trace_dir), python -m benchmarks (--dir)",
             "its directory (run.json, the runs and data it measures, its report)",
             "its own earlier results there (a rerun keeps what it can), its --json report",
             "a run's workdir or any folder another command made",
             ("workdir_of_another_run",)),
)


def markdown() -> str:
  """The contract as docs/writes.md's table."""
  rows = ["| command | creates | may replace | never touches |", "|---|---|---|---|"]
  rows += [f"| `{c.command}` | {c.creates} | {c.replaces} | {c.never} |" for c in COMMANDS]
  return "\n".join(rows) + "\n"
