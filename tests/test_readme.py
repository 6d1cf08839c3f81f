"""The documentation runs: every ```bash (and ```python) block of README.md, docs/*.md,
launch/README.md and reports/ is executed on this CPU machine, in order, one shell per file
(variables carry from block to block; a python block runs in one interpreter), with
/tmp/ rewritten to a temporary directory. A comment line directly under a command
is that command's output and must be printed (numbers may differ); an output starting
with `error:` means the command must fail. Blocks that cannot run here say why in an
HTML comment just above them, and a block may declare how the test shortens it:

  <!-- not run: REASON -->                 the block is not executed
  <!-- test: skip "PREFIX" ... (REASON) -->  commands (or `&&` parts) starting with a
                                              PREFIX are left out (pip, pytest)
  <!-- test: append ARGS to "TEXT" -->      ARGS are added to the commands holding TEXT
                                              (later flags win: fewer steps, texts)
  <!-- test: replace "OLD" with "NEW" -->   OLD becomes NEW in every command (data or a
                                              model that is not shipped: a fixture)
  <!-- test: before "COMMAND" (REASON) -->  COMMAND runs first (what the replacements
                                              point to), its output unchecked
  <!-- test: runs in tests/X.py ... -->     the block's commands run in those test
                                              files, which read each one with
                                              `documented(DOC, SNIPPET)` and add their
                                              own checks (a benchmark's JSON): this
                                              test checks that each command is read

Every command, run or not, also has its flags, repository paths and `--config.*`
fields checked against the code, so a renamed flag fails here even in a command that
needs a TPU pod.
"""

from __future__ import annotations

import ast
import dataclasses
import glob
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(os.path.relpath(p, REPO) for p in glob.glob(
    os.path.join(REPO, "docs", "*.md"))) + ["launch/README.md"] + sorted(
        os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "reports", "**", "*.md"),
                                                    recursive=True))
NUMBER = r"\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"
MARKER = "@@readme-test@@"
PYTHON_END = "END_OF_PYTHON_BLOCK"


@dataclasses.dataclass
class Command:
  text: str  # One logical command (continuation lines joined as written).
  outputs: list[str]  # The comment lines directly under it, '# ' removed.


@dataclasses.dataclass
class Block:
  doc: str
  line: int
  commands: list[Command]
  not_run: str | None
  skips: list[str]
  appends: list[tuple[str, str]]  # (ARGS, TEXT)
  replaces: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (OLD, NEW)
  runs_in: list[str] = dataclasses.field(default_factory=list)  # test files
  before: list[str] = dataclasses.field(default_factory=list)  # setup commands


def _complete(text: str) -> bool:
  if text.endswith("\\"):
    return False
  try:
    shlex.split(text, comments=False)
  except ValueError:  # An open quote: the command goes on on the next line.
    return False
  return True


def parse_commands(lines: list[str]) -> list[Command]:
  commands: list[Command] = []
  current: list[str] = []
  attached = False  # The previous line ended a command (no blank line since).
  for line in lines:
    if current:
      current.append(line)
      if _complete("\n".join(current)):
        commands.append(Command("\n".join(current), []))
        current, attached = [], True
      continue
    stripped = line.strip()
    if not stripped:
      attached = False
    elif stripped.startswith("#"):
      if attached:
        commands[-1].outputs.append(re.sub(r"^# ?", "", stripped))
    else:
      current = [line]
      if _complete(line):
        commands.append(Command(line, []))
        current, attached = [], True
  assert not current, f"unfinished command: {current}"
  return commands


def parse(doc: str) -> list[Block]:
  with open(os.path.join(REPO, doc)) as f:
    lines = f.read().splitlines()
  blocks, i = [], 0
  while i < len(lines):
    if lines[i].strip() not in ("```bash", "```python"):
      i += 1
      continue
    start = i
    end = lines.index("```", i + 1)
    directives, k = [], start - 1
    while k >= 0 and lines[k].startswith("<!--"):
      directives.append(lines[k])
      k -= 1
    if lines[start].strip() == "```python":  # The whole block, one interpreter.
      source = "\n".join(lines[start + 1:end])
      commands = [Command(f"python - <<'{PYTHON_END}'\n{source}\n{PYTHON_END}", [])]
    else:
      commands = parse_commands(lines[start + 1:end])
    block = Block(doc, start + 1, commands, None, [], [])
    for d in directives:
      m = re.fullmatch(r"<!-- (not run|test): (.*) -->", d.strip())
      assert m, f"{doc}:{start}: unknown directive {d!r}"
      if m.group(1) == "not run":
        block.not_run = m.group(2)
      elif m.group(2).startswith("skip "):
        block.skips += re.findall(r'"([^"]+)"', m.group(2))
      elif m.group(2).startswith("replace "):
        r = re.fullmatch(r'replace "([^"]+)" with "([^"]*)"(?: \(.*\))?', m.group(2))
        assert r, f"{doc}:{start}: unknown directive {d!r}"
        block.replaces.append((r.group(1), r.group(2)))
      elif m.group(2).startswith("runs in "):
        block.runs_in = re.findall(r"tests/\w+\.py", m.group(2).split("(")[0])
        assert block.runs_in, f"{doc}:{start}: unknown directive {d!r}"
      elif m.group(2).startswith("before "):
        b = re.fullmatch(r'before "([^"]+)"(?: \(.*\))?', m.group(2))
        assert b, f"{doc}:{start}: unknown directive {d!r}"
        block.before.insert(0, b.group(1))  # directives are read bottom-up
      else:
        a = re.fullmatch(r'append (.+) to "([^"]+)"(?: \(.*\))?', m.group(2))
        assert a, f"{doc}:{start}: unknown directive {d!r}"
        block.appends.append((a.group(1), a.group(2)))
    blocks.append(block)
    i = end + 1
  return blocks


def runnable(block: Block) -> list[tuple[Command, str]]:
  """The block's commands as the test runs them: its `before` commands first (no
  outputs), skipped parts left out, replacements made, arguments appended, /tmp/ kept
  (rewritten later). Checks that every directive applies."""
  out, used = [(Command(b, []), b) for b in block.before], set()
  for cmd in block.commands:
    parts = [p for p in re.split(r" && ", cmd.text)]
    kept = []
    for p in parts:
      prefix = next((s for s in block.skips if p.strip().startswith(s)), None)
      if prefix:
        used.add(prefix)
      else:
        kept.append(p)
    if not kept:
      continue
    text = " && ".join(kept)
    for old, new in block.replaces:
      if old in text:
        text = text.replace(old, new)
        used.add(old)
    for args, where in block.appends:
      if where in text:
        text = f"{text} {args}"
        used.add(where)
    out.append((cmd, text))
  stale = set(block.skips) | {w for _, w in block.appends} | {o for o, _ in block.replaces}
  assert stale <= used, f"{block.doc}:{block.line}: directives match nothing: {stale - used}"
  return out


def expected_pattern(output: str, tmp: str) -> re.Pattern:
  """A shown output line as a regex: its numbers may differ, runs of spaces too."""
  text = " ".join(output.replace("/tmp/", f"{tmp}/").split())
  pieces = re.split(NUMBER, text)
  return re.compile(NUMBER.join(re.escape(p) for p in pieces))


# Static checks: flags, paths and config fields of every command, run or not.

def _module_files(words: list[str]) -> list[str]:
  """The source files that may define the flags of `python -m bertjax.X [subcommand]`
  or `python -m benchmarks NAME`: the module (a benchmark's own file: the package's
  bertjax/benchmarks/NAME.py, the repository's benchmarks/NAME.py) and the bertjax and
  benchmarks modules it imports (at any indentation: `bertjax.hf.convert` imports its
  program in its `__main__` block)."""
  module = words[words.index("-m") + 1]
  if module == "bertjax.benchmark":
    module = f"bertjax.benchmarks.{words[words.index('-m') + 2]}"
  elif module == "benchmarks":
    module = f"benchmarks.{words[words.index('-m') + 2]}"
  path = os.path.join(REPO, *module.split(".")) + ".py"
  if not os.path.isfile(path):
    return []
  files = [path]
  for m in re.finditer(r"^\s*from ((?:bertjax|benchmarks)[\w.]*) import (\w+)",
                       open(path).read(), re.M):
    for candidate in (f"{m.group(1)}.{m.group(2)}", m.group(1)):
      f = os.path.join(REPO, *candidate.split(".")) + ".py"
      if os.path.isfile(f):
        files.append(f)
        break
  return files


def _defines(files: list[str], flag: str) -> bool:
  """Whether `--flag` is defined (absl DEFINE_*, or argparse); an f-string name's
  `{k}` stands for a number (`sentence{k}`: --sentence1, --sentence2)."""
  source = "".join(open(f).read() for f in files)
  names = re.findall(r'DEFINE_\w+\(\s*f?"([^"]+)"|add_argument\(\s*"--([^"]+)"', source)
  patterns = [re.sub(r"\\\{\w+\\\}", r"\\d+", re.escape(a or b)) for a, b in names]
  wanted = {flag, flag[2:]} if flag.startswith("no") else {flag}
  return any(re.fullmatch(p, w) for p in patterns for w in wanted)


def _config(path_arg: str):
  path, _, arg = path_arg.partition(":")
  spec = importlib.util.spec_from_file_location("readme_config", os.path.join(REPO, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def check_static(cmd: str) -> list[str]:
  """Problems with `cmd`'s flags, repository paths and config fields."""
  problems = []
  try:
    words = shlex.split(cmd.replace("\\\n", " "), comments=False)
  except ValueError as e:
    return [f"cannot split: {e}"]
  for w in words:  # Repository paths, as a flag value or an argument.
    value = w.split("=", 1)[-1].split(":", 1)[0]
    if re.match(r"(configs|tests|launch|bertjax|benchmarks|docs)/", value) and not glob.glob(
        os.path.join(REPO, value)):
      problems.append(f"no such path {value}")
  config_file = next((w.split("=", 1)[-1] for w in words if re.match(
      r"(--config=)?configs/.*\.py(:\S+)?$", w)), None)  # :ARG, e.g. a folder
  config = _config(config_file) if config_file else None
  for w in words:
    m = re.match(r"--config\.([\w.]+)=", w)
    if m:
      node = config
      for key in m.group(1).split("."):
        if node is None or key not in node:
          problems.append(f"no config field {m.group(1)} in {config_file}")
          break
        node = node[key]
  program = words[words.index("-m") + 1] if "-m" in words else ""
  if program.startswith("bertjax") or program == "benchmarks":
    files = _module_files(words)
    if not files:  # e.g. a reproduction named to `python -m bertjax.benchmark`
      name = " ".join(words[words.index("-m") + 1:][:2 if "benchmark" in program else 1])
      return problems + [f"no module for `python -m {name}`"]
    for w in words:
      m = re.match(r"--(\w+)(=|$)", w)
      if m and not w.startswith("--config.") and not _defines(files, m.group(1)):
        problems.append(f"{words[words.index('-m') + 1]} has no flag --{m.group(1)}")
  return problems


def test_every_command_names_real_flags_paths_and_config_fields():
  problems, count = [], 0
  for doc in DOCS:
    variables = {}  # NAME="..." set by an earlier command of the file
    for block in parse(doc):
      for cmd in block.commands:
        count += 1
        text = re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), cmd.text)
        assignment = re.fullmatch(r'(\w+)="([^"]*)"', text, re.S)
        if assignment:
          variables[assignment.group(1)] = assignment.group(2)
        if cmd.text.startswith("python - <<"):  # a ```python block: run, not parsed
          continue
        if not (cmd.outputs and cmd.outputs[0].startswith("error:")):  # meant to fail
          problems += [f"{doc}:{block.line}: {p}" for p in check_static(text)]
  assert count > 20 and not problems, problems


def test_config_docstring_commands_name_real_flags_and_fields():
  """Each recipe's docstring shows its launch command: its flags and fields are real."""
  problems, count = [], 0
  for path in sorted(glob.glob(os.path.join(REPO, "configs", "**", "*.py"), recursive=True)):
    with open(path) as f:
      doc = ast.get_docstring(ast.parse(f.read())) or ""
    lines = [line.strip() for line in doc.splitlines()]
    for k, line in enumerate(lines):
      if line.startswith("python -m bertjax"):
        cmd = [line]
        while cmd[-1].endswith("\\") and k + len(cmd) < len(lines):
          cmd.append(lines[k + len(cmd)])
        count += 1
        problems += [f"{os.path.relpath(path, REPO)}: {p}" for p in check_static("\n".join(cmd))]
  assert count >= 12 and not problems, problems


def test_the_parser_reads_commands_outputs_and_directives():
  blocks = parse("README.md")
  first = blocks[0]
  assert first.commands[0].text.startswith("pip install -e . && python -m bertjax.main")
  assert [c.text for c in first.commands][-1] == 'pip install -e ".[test]" && python -m pytest -q'
  assert "pip install" in first.skips and "python -m pytest" in first.skips
  assert not any("pytest" in text for _, text in runnable(first))
  with open(os.path.join(REPO, ".ci", "run")) as f:  # CI runs the README's test command
    assert f.read().splitlines()[-1] == first.commands[-1].text
  assert all(b.not_run or runnable(b) for doc in DOCS for b in parse(doc))
  lines = ["python -m x --a=1 \\", '  --b="two', '  lines"', "# out 1", "", "# narrative",
           "echo hi", "# hi"]
  cmds = parse_commands(lines)
  assert [c.outputs for c in cmds] == [["out 1"], ["hi"]]
  assert expected_pattern("wrote /tmp/a.npz: 164 vectors of size 384", "/x").fullmatch(
      "wrote /x/a.npz: 12 vectors of size 384")
  assert check_static("python -m bertjax.embed similarity --sentence1=a --word2=b") == []
  assert check_static("python -m bertjax.embed --sentences=a --config=configs/bert_tiny.py "
                      "--config.train.nope=1 --input=tests/fixtures/missing.txt") == [
                          "no such path tests/fixtures/missing.txt",
                          "no config field train.nope in configs/bert_tiny.py",
                          "bertjax.embed has no flag --sentences",
                          "bertjax.embed has no flag --config"]
  # The repository's reproductions resolve to benchmarks/NAME.py, the package's tools to
  # bertjax/benchmarks/NAME.py; a name in neither place is no module.
  assert check_static("python -m benchmarks retrieval_example --dir=/tmp/rex --nope=1") == [
      "benchmarks has no flag --nope"]
  assert check_static("python -m bertjax.benchmark plan --config=configs/bert_tiny.py") == []
  assert check_static("python -m bertjax.benchmark retrieval_example --dir=/tmp/rex") == [
      "no module for `python -m bertjax.benchmark retrieval_example`"]


def _to_run(doc: str) -> list[tuple[Command, str]]:
  return [pair for b in parse(doc) if not (b.not_run or b.runs_in) for pair in runnable(b)]


def documented(doc: str, snippet: str, *extra: str) -> list[str]:
  """The argv of the one command of `doc` holding `snippet` (its `python` this
  interpreter), then `extra` (later flags win): for a test that runs a documented
  command itself, with checks of its own, from a block marked `test: runs in`."""
  (text,) = _holding(doc, snippet)
  words = shlex.split(text.replace("\\\n", " "), comments=False)
  return [sys.executable if w == "python" else w for w in words] + list(extra)


def _holding(doc: str, snippet: str) -> list[str]:
  """The commands of `doc` equal to `snippet`, else those holding it."""
  texts = [c.text for b in parse(doc) for c in b.commands]
  return [t for t in texts if t == snippet] or [t for t in texts if snippet in t]


def test_commands_run_elsewhere_are_read_there():
  """Each command of a block marked `runs in` is read by one of those test files: a
  string of theirs picks it alone (`documented(DOC, SNIPPET)`)."""
  missing, count = [], 0
  for doc in DOCS:
    for block in parse(doc):
      if not block.runs_in:
        continue
      strings = {node.value for f in block.runs_in
                 for node in ast.walk(ast.parse(open(os.path.join(REPO, f)).read()))
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)}
      for cmd in block.commands:
        count += 1
        if not any(_holding(doc, s) == [cmd.text] for s in strings if len(s) > 8):
          missing.append(f"{doc}:{block.line}: {cmd.text[:80]}")
  assert count and not missing, missing


@pytest.fixture(scope="module")
def doc_runs(tmp_path_factory):
  """doc -> (the temporary directory standing for /tmp/, the output of its shell),
  each doc run once, when first asked for."""
  runs = {}

  def run(doc: str) -> tuple[str, str]:
    if doc not in runs:
      tmp = str(tmp_path_factory.mktemp("readme"))
      runs[doc] = tmp, _run_shell(_to_run(doc), tmp)
    return runs[doc]

  return run


def _run_shell(commands: list[tuple[Command, str]], tmp: str) -> str:
  """The commands in one shell, in order, /tmp/ rewritten to `tmp`: their output,
  each command's between markers with its exit status."""
  assert not any(re.search(r"\bpytest\b", text) for _, text in commands)  # no recursion
  script = ["exec 2>&1", f"cd {shlex.quote(REPO)}"]
  for k, (_, text) in enumerate(commands):
    script += [f"echo {MARKER} {k}", text.replace("/tmp/", f"{tmp}/"),
               f"echo {MARKER} rc $?"]
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env.pop("JAX_NUM_CPU_DEVICES")  # A user's CPU is one device, not the suite's 8 fake ones.
  return subprocess.run(["bash", "-c", "\n".join(script)], capture_output=True,
                        text=True, env=env).stdout


def check_run(doc: str, doc_runs) -> None:
  """Runs the file's runnable blocks in one shell, in order, and checks each command's
  exit status and shown outputs."""
  commands = _to_run(doc)
  tmp, stdout = doc_runs(doc)
  sections = re.split(rf"^{MARKER} (\d+)\n", stdout, flags=re.M)[1:]
  assert len(sections) == 2 * len(commands), stdout[-3000:]
  for (cmd, text), output in zip(commands, sections[1::2]):
    body, rc = re.match(rf"(.*){MARKER} rc (\d+)\n?$", output, re.S).groups()
    fails = bool(cmd.outputs) and cmd.outputs[0].startswith("error:")
    assert (int(rc) != 0) == fails, f"{doc}: `{text}` exited {rc}:\n{body[-3000:]}"
    lines = [" ".join(line.split()) for line in body.splitlines()]
    for shown in cmd.outputs:
      pattern = expected_pattern(shown, tmp)
      assert any(pattern.search(line) for line in lines), (
          f"{doc}: `{text}` did not print `{shown}`:\n{body[-3000:]}")


def pretrained_minilm_beats_random_init(doc_runs) -> None:
  """docs/finetuning.md's worked example as it ran: the real MiniLM against the same
  architecture from random init on the SST-2-format fixture, whose dev sentences use
  sentiment words absent from training, so only the pretrained start can transfer."""
  tmp, _ = doc_runs("docs/finetuning.md")
  accuracy = {}
  for name in ("minilm_sst2", "random_sst2"):
    with open(os.path.join(tmp, name, "dev_results.json")) as f:
      accuracy[name] = json.load(f)["accuracy"]
  assert accuracy["minilm_sst2"] >= 0.75, accuracy
  assert accuracy["minilm_sst2"] > accuracy["random_sst2"] + 0.15, accuracy


def first_command_prints_its_records_data_figures(doc_runs) -> None:
  """README's first command as it ran (10 steps, the whole held-out set) holds out the
  recorded run's pairs and prints its most-frequent-token baseline: those depend only on
  the data. Its trained accuracies need the 1,500 steps: tests/test_readme_figures.py
  checks README's against the record of the full run."""
  with open(os.path.join(REPO, "tests", "golden", "readme_first_command.json")) as f:
    record = json.load(f)
  commands = _to_run("README.md")
  k = next(i for i, (_, text) in enumerate(commands) if record["command"] in text)
  _, stdout = doc_runs("README.md")
  body = re.split(rf"^{MARKER} (\d+)\n", stdout, flags=re.M)[2 + 2 * k]
  assert f"'eval_examples': {record['eval_examples']}," in body, body[-3000:]
  baseline = record["evals"][-1]["mlm_accuracy_most_frequent_baseline"]
  assert re.search(rf"^held-out MLM accuracy {NUMBER} vs {baseline:.4f} for always "
                   rf"predicting the most frequent token; NSP accuracy {NUMBER}$", body,
                   re.M), body[-3000:]


# What else reads a document's run, checked where that run is (its class).
RUN_READERS = {"README.md": first_command_prints_its_records_data_figures,
               "docs/finetuning.md": pretrained_minilm_beats_random_init}


def _runs_class(doc: str) -> type:
  """A test class of the runs of `doc` (and what reads them, `RUN_READERS`): pytest-xdist
  (`--dist loadscope`) hands each class to a worker of its own, so the documents' shells
  run side by side instead of one after the other on one worker."""

  class Runs:
    def test_documented_commands_run(self, doc_runs):
      check_run(doc, doc_runs)

  if doc in RUN_READERS:
    reader = RUN_READERS[doc]
    setattr(Runs, f"test_{reader.__name__}", lambda self, doc_runs: reader(doc_runs))
  Runs.__name__ = Runs.__qualname__ = "TestRuns_" + re.sub(r"\W", "_", doc)
  Runs.__doc__ = f"{doc}'s runnable blocks, in one shell."
  return pytest.mark.slow(Runs)


for _doc in (d for d in DOCS if _to_run(d)):  # README.md first
  _class = _runs_class(_doc)
  globals()[_class.__name__] = _class
