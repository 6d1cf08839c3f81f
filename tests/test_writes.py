"""The write contract (bertjax/writes.py, docs/writes.md) walked: every command of
`writes.COMMANDS` through each case it lists (`writes.CASES`), each asserting that
what must be protected (a finished run's workdir, a model, the user's files) is
byte-identical afterwards and that the command either did its job or printed one
`error:` line. A command gets its rows by being listed there with an adapter here
(`ADAPTERS`: how this file runs it, in-process); the cases are written once (`CASES`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
from typing import Any, Callable

import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver

from bertjax import convert, merge, plot, writes
from bertjax.checkpoint import files
from bertjax.console import cli
from bertjax.data import prepare, train_tokenizer
from bertjax.hf import files as hf_files
from bertjax.tasks import finetune, mining, predict, rerank_eval
from bertjax.train import pretrain
from configs.finetune import glue, retrieval as retrieval_config
from tests import faults
from tests.helpers import tiny_config
from tests.tasks_helpers import fixture, fixture_tokenizer, tiny_finetune

TEXTS = ["The quick brown fox.", "what is a tuple?", "JSON is a data format."]


@dataclasses.dataclass
class Made:
  """What the cases protect and start from, made once for the module: a finished
  pretraining run (`pre`, its `pre_config`), a finished retrieval run (`ret`,
  `ret_config`, trained on `ret_train`, a copy of the fixture), a finished SST-2 run
  (`sst2`, for predict), a Hugging Face model (`hf`) and a texts file (`texts`)."""

  root: str
  pre: str
  pre_config: Any
  ret: str
  ret_config: Any
  ret_train: str
  sst2: str
  hf: str
  texts: str


@pytest.fixture(scope="module")
def made(tmp_path_factory, tiny_hf_bert) -> Made:
  root = str(tmp_path_factory.mktemp("writes"))
  pre = os.path.join(root, "pre")
  config = tiny_config(num_steps=2, warmup_steps=1, log_every=1, eval_every=2,
                       eval_batches=1, checkpoint_every=2)
  config.model.vocab_size = config.data.tokenizer.vocab_size = 512
  config.data.dupe_factor = 1
  config.compilation_cache_dir = ""
  pretrain.run(config, pre)
  ret_train = os.path.join(root, "pairs.jsonl")
  shutil.copy(fixture("retrieval/train.jsonl"), ret_train)
  ret = os.path.join(root, "ret")
  c = retrieval_config.get_config()
  c.init_from, c.data.train, c.compilation_cache_dir = tiny_hf_bert, ret_train, ""
  c.task.max_seq_length, c.task.mini_batch_size = 32, 8
  c.train.batch_size, c.train.log_every = 16, 1
  finetune.run(c, ret)
  sst2 = os.path.join(root, "sst2")
  s = tiny_finetune(glue.get_config("sst2"), fixture_tokenizer(os.path.join(root, "vocab")),
                    num_epochs=1)
  s.data.train, s.data.dev, s.compilation_cache_dir = (
      fixture("sst2_train.tsv"), fixture("sst2_dev.tsv"), "")
  finetune.run(s, sst2)
  texts = os.path.join(root, "texts.txt")
  with open(texts, "w") as f:
    f.write("\n".join(TEXTS) + "\n")
  return Made(root, pre, config, ret, c, ret_train, sst2, tiny_hf_bert, texts)


def _copy(config):
  import ml_collections  # pylint: disable=g-import-not-at-top
  return ml_collections.ConfigDict(config.to_dict())


# Each command as this file runs it: run(made, **roles) with the roles its cases give
# (workdir, init_from, changed, src, dst, overwrite, input, output), `own` what of its
# own it must not damage, `others` directories of another kind.


def _pretrain(made, workdir, init_from="", changed=False, bad_input=False):
  c = _copy(made.pre_config)
  c.init_from = init_from
  if changed:
    c.train.batch_size = 16
  if bad_input:
    c.data.corpus = os.path.join(made.root, "missing.txt")
  pretrain.run(c, workdir)


def _finetune(made, workdir, init_from=None, changed=False, bad_input=False):
  c = _copy(made.ret_config)
  c.init_from = made.ret_config.init_from if init_from is None else init_from
  if changed:  # the case: another pooling and prompt on a finished run
    c.task.pooling, c.task.query_prompt = "cls", "query: "
  if bad_input:  # the run's own pairs file, now without its anchor column
    with open(made.ret_train, "rb") as f:
      saved = f.read()
    with open(made.ret_train, "w") as f:
      f.write(json.dumps({"question": "q", "positive": "p"}) + "\n")
    try:
      finetune.run(c, workdir)
    finally:
      with open(made.ret_train, "wb") as f:
        f.write(saved)
    return
  finetune.run(c, workdir)


def _convert(made, src, dst, overwrite=False):
  kind = convert.convert_checkpoint("hf", src, dst, overwrite)
  assert kind == "bert"


def _merge(made, src, dst, overwrite=False):
  kind = merge.merge_checkpoints([src, src], dst, overwrite=overwrite)
  assert kind == "bert"


def _predict(made, input, output, overwrite=False):  # pylint: disable=redefined-builtin
  predict.write(made.sst2, input, output, overwrite=overwrite)


@contextlib.contextmanager
def _flags(**values):
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  with flagsaver.flagsaver(**values):
    yield


def _embed(made, input, output, overwrite=False):  # pylint: disable=redefined-builtin
  from bertjax import embed  # pylint: disable=g-import-not-at-top  (defines its flags)
  with _flags(checkpoint=made.hf, input=input, out=output, overwrite=overwrite):
    embed.main(["embed", "encode"])


def _mine(made, input, output, overwrite=False):  # pylint: disable=redefined-builtin
  encode = lambda texts, kind: np.stack([  # a model's stand-in: a vector per text
      np.random.default_rng(len(t)).normal(size=8) for t in texts]).astype(np.float32)
  mining.mine_file(input, output, encode, range_max=2, num_negatives=1,
                   overwrite=overwrite, model_path=made.hf)


def _rerank(made, input, output, overwrite=False):  # pylint: disable=redefined-builtin
  score = lambda pairs: np.asarray([len(q) - len(d) for q, d in pairs], np.float32)
  rerank_eval.score_file(input, output, score, overwrite, model_path=made.hf)


def _plot(made, input, output, overwrite=False):  # pylint: disable=redefined-builtin
  plot.draw(os.path.dirname(input) if input.endswith(files.METRICS_FILE) else made.pre,
            output, overwrite)


def _prepare(made, workdir=None, input=None, output=None):  # pylint: disable=redefined-builtin
  c = _copy(made.pre_config)
  list(prepare.prepare_config(c, input_spec=input or made.texts,
                              tokenizer_path=os.path.join(made.pre, files.TOKENIZER_DIR),
                              output=output or workdir, workers=1))


def _train_tokenizer(made, input=None, output=None, src=None, dst=None, overwrite=False):  # pylint: disable=redefined-builtin
  train_tokenizer.train(input or src, "", output or dst, kind="wordpiece", vocab_size=120,
                        lowercase=True, model_type="unigram", character_coverage=1.0,
                        alpha=0.3, language_counts="sentences", seed=0, text_field="text",
                        overwrite=overwrite)


def _benchmark(made, workdir):
  from bertjax.benchmarks import data_scale  # pylint: disable=g-import-not-at-top
  with _flags(scale_dir=workdir):
    data_scale.main([])


@dataclasses.dataclass
class Adapter:
  run: Callable[..., None]
  own: Callable[[Made], str]  # what of its own kind it must not damage
  others: Callable[[Made], list[str]] = lambda m: []  # other kinds' directories
  input: Callable[[Made], str] = lambda m: m.texts  # an input file it reads


ADAPTERS = {
    "python -m bertjax.main": Adapter(_pretrain, lambda m: m.pre,
                                      lambda m: [m.ret, m.hf, m.texts]),
    "python -m bertjax.finetune": Adapter(_finetune, lambda m: m.ret,
                                          lambda m: [m.pre, m.sst2, m.hf]),
    "python -m bertjax.convert": Adapter(_convert, lambda m: m.pre, lambda m: [m.ret]),
    "python -m bertjax.merge": Adapter(_merge, lambda m: m.pre, lambda m: [m.ret]),
    "python -m bertjax.predict": Adapter(_predict, lambda m: m.sst2,
                                         input=lambda m: fixture("sst2_dev.tsv")),
    "python -m bertjax.embed": Adapter(_embed, lambda m: m.hf),
    "python -m bertjax.mine": Adapter(_mine, lambda m: m.hf, input=lambda m: m.ret_train),
    "python -m bertjax.rerank": Adapter(_rerank, lambda m: m.hf,
                                        input=lambda m: m.ret_train),
    "python -m bertjax.plot": Adapter(
        _plot, lambda m: m.pre, input=lambda m: os.path.join(m.pre, files.METRICS_FILE)),
    "python -m bertjax.data.prepare": Adapter(_prepare, lambda m: m.pre,
                                              lambda m: [m.pre, m.hf]),
    "python -m bertjax.data.train_tokenizer": Adapter(_train_tokenizer, lambda m: m.texts),
    "python -m bertjax.benchmark (--scale_dir, --workdir, --trace_dir), python -m benchmarks (--dir)": Adapter(
        _benchmark, lambda m: m.pre, lambda m: [m.pre, m.ret]),
}


@dataclasses.dataclass
class Outcome:
  error: str | None  # the one `error:` line, or None: the command did its job


def attempt(action: Callable[[], None], capsys) -> Outcome:
  """`action` as a program runs it (`cli.one_line_errors`): its one error line or None."""
  capsys.readouterr()
  try:
    with cli.one_line_errors():
      action()
  except SystemExit as e:
    assert e.code == 2, e.code
    err = capsys.readouterr().err.strip().splitlines()
    lines = [l for l in err if l.startswith("error:")]
    assert len(lines) == 1 and err[-1] == lines[0], err
    assert "Traceback" not in "\n".join(err)
    return Outcome(lines[0])
  return Outcome(None)


def refused(*words: str) -> Callable[[Outcome], None]:
  def check(outcome: Outcome) -> None:
    assert outcome.error, "the command did not refuse"
    for w in words:
      assert w in outcome.error, (w, outcome.error)
  return check


# The cases: each -> [(what to protect, the attempt, its check)], from the adapter.


def _workdir_is_init_from(a, m, tmp, monkeypatch):
  w = a.own(m)
  return [([w], lambda: a.run(m, workdir=w, init_from=w), refused(
      "a command never writes where it reads"))]


def _workdir_of_another_run(a, m, tmp, monkeypatch):
  out = []
  for other in a.others(m):
    out.append(([other], lambda o=other: a.run(m, workdir=o) if a.run not in EXPORTS
                 else a.run(m, src=m.hf, dst=o, overwrite=True), refused(other)))
  return out


def _resume_changed(a, m, tmp, monkeypatch):
  w = a.own(m)
  return [([w], lambda: a.run(m, workdir=w, changed=True),
           refused("holds a run with other settings", "(the run's: "))]


def _failing_input_after_finished_run(a, m, tmp, monkeypatch):
  w = a.own(m)
  return [([w], lambda: a.run(m, workdir=w, bad_input=True), refused())]


EXPORTS = (_convert, _merge)  # the commands writing --dst from --src


def _dst_is_src(a, m, tmp, monkeypatch):
  src = a.own(m)
  return [([src], lambda d=d: a.run(m, src=src, dst=d, overwrite=True),
           refused("an export never writes where it reads"))
          for d in (src, os.path.join(src, "export"), os.path.dirname(src))]


def _user_folder(tmp, name="mine") -> str:
  d = os.path.join(tmp, name)
  os.makedirs(d)
  with open(os.path.join(d, "README.md"), "w") as f:
    f.write("my notes\n")
  return d


def _dst_not_empty(a, m, tmp, monkeypatch):
  d = _user_folder(tmp)
  run = (lambda: a.run(m, src=a.own(m), dst=d)) if a.run in EXPORTS else (
      lambda: a.run(m, input=m.texts, output=d))
  return [([d], run, refused("is not empty", "--overwrite"))]


def _dst_of_another_model(a, m, tmp, monkeypatch):
  """An XLM-R export's tokenizer and a sentence-transformers module in --dst, with the
  user's README: --overwrite writes a whole BERT export, the others' files gone."""
  d = _user_folder(tmp)
  for name, text in (("sentencepiece.bpe.model", "x"), ("modules.json", "[]")):
    with open(os.path.join(d, name), "w") as f:
      f.write(text)
  os.makedirs(os.path.join(d, "1_Pooling"))
  readme = os.path.join(d, "README.md")

  def check(outcome):
    assert outcome.error is None, outcome.error
    assert sorted(os.listdir(d)) == ["README.md", "config.json", "model.safetensors",
                                     "tokenizer_config.json", "vocab.txt"]
    with open(os.path.join(d, "tokenizer_config.json")) as f:
      assert json.load(f)["tokenizer_class"] == "BertTokenizer"
    import transformers  # pylint: disable=g-import-not-at-top
    assert type(transformers.AutoTokenizer.from_pretrained(d)).__name__.startswith("Bert")
    assert not [n for n in os.listdir(tmp) if n.startswith(".")]  # no temporary left

  return [([readme], lambda: a.run(m, src=a.own(m), dst=d, overwrite=True), check)]


def _interrupted_export(a, m, tmp, monkeypatch):
  """A previous export in --dst, and the new one failing after its first files."""
  d = os.path.join(tmp, "export")
  a.run(m, src=a.own(m), dst=d)

  def broken(directory, hf_config, state):
    with open(os.path.join(directory, "config.json"), "w") as f:
      f.write("{}")
    raise OSError(28, "No space left on device")

  def attempt_it():
    with monkeypatch.context() as p:
      p.setattr(hf_files, "write", broken)
      a.run(m, src=a.own(m), dst=d, overwrite=True)

  def check(outcome):
    refused("cannot write", "No space left", "as it was")(outcome)
    assert not [n for n in os.listdir(tmp) if n.startswith(".")]

  return [([d], attempt_it, check)]


def _output_is_input(a, m, tmp, monkeypatch):
  given = a.input(m)
  cases = [([given], lambda: a.run(m, input=given, output=given), refused(given))]
  own = a.own(m)
  if os.path.isdir(own) and a.run not in (_plot, _prepare):  # inside the model it reads
    cases.append(([own], lambda: a.run(m, input=given, output=os.path.join(
        own, files.CONFIG_FILE), overwrite=True), refused(own)))
  if a.run is _prepare or a.run is _train_tokenizer:  # the input inside the output
    folder = os.path.dirname(given)
    cases.append(([folder], lambda: a.run(m, input=given, output=folder), refused()))
  return cases


def _output_exists(a, m, tmp, monkeypatch):
  out = os.path.join(tmp, "out" + {_embed: ".npy", _plot: ".png"}.get(a.run, ".jsonl"))
  with open(out, "w") as f:
    f.write("the user's\n")

  def replaced(outcome):
    assert outcome.error is None, outcome.error
    assert open(out, "rb").read() != b"the user's\n"
    assert os.listdir(tmp) == [os.path.basename(out)]  # no temporary left

  return [([out], lambda: a.run(m, input=a.input(m), output=out),
           refused("exists", "--overwrite")),
          ([], lambda: a.run(m, input=a.input(m), output=out, overwrite=True), replaced)]


CASES = {
    "workdir_is_init_from": _workdir_is_init_from,
    "workdir_of_another_run": _workdir_of_another_run,
    "resume_changed": _resume_changed,
    "failing_input_after_finished_run": _failing_input_after_finished_run,
    "dst_is_src": _dst_is_src,
    "dst_not_empty": _dst_not_empty,
    "dst_of_another_model": _dst_of_another_model,
    "interrupted_export": _interrupted_export,
    "output_is_input": _output_is_input,
    "output_exists": _output_exists,
}
ROWS = [(c.command, case) for c in writes.COMMANDS for case in c.cases]


def test_every_command_and_case_has_its_rows():
  """A command listed in writes.COMMANDS is walked here; every case is written once."""
  assert set(ADAPTERS) == {c.command for c in writes.COMMANDS}
  assert set(CASES) == set(writes.CASES)
  assert {case for _, case in ROWS} == set(CASES)


@pytest.mark.slow
@pytest.mark.parametrize("command,case", ROWS)
def test_the_command_keeps_the_contract(command, case, made, tmp_path, capsys,
                                        monkeypatch):
  for protected, action, check in CASES[case](ADAPTERS[command], made, str(tmp_path),
                                              monkeypatch):
    before = {p: faults.tree(p) for p in protected}
    outcome = attempt(action, capsys)
    assert {p: faults.tree(p) for p in protected} == before, f"{command}, {case}: {outcome}"
    check(outcome)


@pytest.mark.slow
def test_the_guide_shows_what_the_commands_print(made, tmp_path, capsys):
  """docs/writes.md's table is `writes.markdown()`, and each `error:` line it shows is
  what the command prints (paths aside)."""
  with open(os.path.join(os.path.dirname(__file__), "..", "docs", "writes.md")) as f:
    doc = f.read()
  assert writes.markdown() in doc
  w, stale = made.pre, _user_folder(str(tmp_path))
  with open(os.path.join(stale, "sentencepiece.bpe.model"), "w") as f:
    f.write("x")
  printed = [attempt(lambda: _finetune(made, w, init_from=w), capsys).error,
             attempt(lambda: _convert(made, w, stale), capsys).error]
  paths = lambda text: re.sub(r"(/[\w.-]+)+", "PATH", text)
  assert [paths(l) for l in doc.splitlines() if l.startswith("error:")] == [
      paths(p) for p in printed]
