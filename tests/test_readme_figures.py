"""The figures of the README, the guides and the reports that do not depend on the
machine are what the code gives: the recipes' parameter counts (docs/pretraining.md),
the model FLOPs of the benchmark tables (reports/training_step.md), the embedded
corpus's and its tokenizer's numbers and the fixtures' counts; and every figure of the
README's first command is its recorded runs' (tests/golden/readme_first_command.json,
reports/tiny_recipes.md: the 1,500 steps do not fit the suite;
BERTJAX_TEST_README_RUN=1 reruns them here and compares). (tests/test_readme.py runs the commands, shortened, where any number may
differ, checks the exact error lines, and that the first command prints the record's
data figures.)"""

import dataclasses
import importlib
import json
import os
import re
import subprocess
import statistics
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import model as model_lib
from bertjax import objectives
from bertjax.benchmarks import flops
from bertjax.benchmarks import train as benchmark_train
from bertjax.model import config_from, family_of
from tests.tasks_helpers import fixture

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(name: str) -> str:
  with open(os.path.join(REPO, name), encoding="utf-8") as f:
    return f.read()


README, PRETRAINING, DATA = _read("README.md"), _read("docs/pretraining.md"), _read("docs/data.md")
FINETUNING, STEP = _read("docs/finetuning.md"), _read("reports/training_step.md")
PIPELINE, TINY = _read("reports/input_pipeline.md"), _read("reports/tiny_recipes.md")


def _table(header_cell: str, text: str) -> list[list[list[str]]]:
  """The tables of `text` whose header has `header_cell`: rows of cells (header first)."""
  tables, rows = [], []
  for line in text.splitlines() + [""]:
    if line.startswith("|"):
      rows.append([c.strip() for c in line.strip("|").split("|")])
    elif rows:
      if any(header_cell in c for c in rows[0]):
        tables.append([rows[0]] + [r for r in rows[2:]])
      rows = []
  return tables


def _encoder_parameters(config) -> int:
  """Encoder (+ pooler for BERT's family) parameters, as Hugging Face's *Model counts
  them, no memory."""
  if model_lib.family_of(config.model).name != "bert":
    model = model_lib.family_of(config.model).pretraining(
        model_lib.config_from(config.model))
    shapes = jax.eval_shape(model.init_params, jax.random.key(0))["encoder"]
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  # The model config a run builds: its objectives choose the heads (RoBERTa: no NSP).
  model = dataclasses.replace(objectives.from_config(config).model, pooler=True)
  shapes = jax.eval_shape(lambda: nn.unbox(family_of(model).pretraining(model).init(
      jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"]["encoder"]))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


@pytest.mark.slow
def test_recipe_table_parameter_counts():
  (table,) = _table("what it reproduces", PRETRAINING)
  checked = 0
  for row in table[1:]:
    recipe = re.fullmatch(r"`configs/(\w+)\.py`", row[0])
    count = re.search(r"(\d+\.\d)M\b", row[1])
    if recipe and count:
      config = importlib.import_module(f"configs.{recipe.group(1)}").get_config()
      assert round(_encoder_parameters(config) / 1e6, 1) == float(count.group(1)), row[:2]
      checked += 1
  assert checked == 16


def _benchmark_flops(model_cell: str, batch_seq: str) -> dict[str, float]:
  """The benchmark's model FLOPs per step: the recipe the cell starts with
  (modernbert_tiny, else bert_tiny) with the sizes it names (L=4 H=512 A=8 M=2048),
  P = the recipe's training masking rate of the length (benchmark_train.masked_positions)."""
  recipe = "modernbert_tiny" if model_cell.startswith("modernbert_tiny") else "bert_tiny"
  config = importlib.import_module(f"configs.{recipe}").get_config()
  model = config_from(config.model)
  sizes = dict(re.findall(r"\b([LHAM])=(\d+)", model_cell))
  fields = {"L": "num_layers", "H": "hidden_size", "A": "num_heads", "M": "intermediate_size"}
  model = dataclasses.replace(model, **{fields[k]: int(v) for k, v in sizes.items()})
  batch, seq = map(int, batch_seq.split("x"))
  return flops.train_flops(model, batch, seq, benchmark_train.masked_positions(config, seq))


def test_benchmark_tables_model_flops():
  tables = _table("GFLOP/step", STEP)
  assert len(tables) == 2
  rows = 0
  for table in tables:
    header = table[0]
    col = next(i for i, c in enumerate(header) if c.startswith("GFLOP/step"))
    shape = header.index("batch x seq")
    for row in table[1:]:
      model = row[0] if header[0] == "model" else "bert_tiny"
      f = _benchmark_flops(model, row[shape])
      shown = re.fullmatch(r"([\d.]+)(?: \(([\d.]+)\))?", row[col])
      assert float(shown.group(1)) == round(f["total"] / 1e9, 1), row
      if shown.group(2):  # The attention term.
        assert float(shown.group(2)) == round(f["attention"] / 1e9, 2), row
      rows += 1
  assert rows == 11
  total = _benchmark_flops("bert_tiny", "32x128")["total"]
  assert f"e.g. {total:.3e}".replace("e+", "e") in STEP  # 1.325e10


def test_embedded_corpus_and_tokenizer_figures(documents, tokenizer):
  sentences = [s for d in documents for s in d]
  words = [w for s in sentences for w in s.split()]
  assert (f"sentences {len(sentences)} | vocab_size {tokenizer.vocab_size} | pad_id "
          f"{tokenizer.pad_id} | cls_id {tokenizer.cls_id} | sep_id {tokenizer.sep_id} | "
          f"mask_id {tokenizer.mask_id} |") in DATA
  assert f"documents {len(documents)} | sentences {len(sentences):,} |" in DATA
  assert f"tokenizer: {len(sentences):,}/{len(sentences):,} sentences (100%)" in PRETRAINING
  distinct = 100 * len(set(words)) / len(words)
  assert (f"embedded corpus ({len(sentences):,} sentences, {len(words):,} words, "
          f"{distinct:.1f}% of") in PIPELINE


def test_fixture_figures():
  def rows(name):
    with open(fixture(name), encoding="utf-8") as f:
      return f.read().splitlines()
  train, dev = len(rows("sst2_train.tsv")) - 1, len(rows("sst2_dev.tsv")) - 1  # headers
  assert f"fixture ({train} training sentences; the {dev} dev sentences" in FINETUNING
  assert f"# wrote {dev} predictions to /tmp/sst2_dev_predictions.jsonl" in FINETUNING


@pytest.mark.parametrize("recipe", ["bert_base", "bert_large"])
def test_bert_recipes_default_to_the_papers_two_length_phases(recipe):
  """90% of the steps at 128 tokens with 20 predictions, then 512 with 80, as the
  recipe table of docs/pretraining.md says."""
  from bertjax.data import pipeline  # pylint: disable=g-import-not-at-top
  config = importlib.import_module(f"configs.{recipe}").get_config()
  assert pipeline.length_phases(config.data, config.train.num_steps) == [
      (900_000, 128, 20), (None, 512, 80)]
  assert "90% of the steps at 128 tokens (20 predictions), the last 10% at 512 (80)" in PRETRAINING


with open(os.path.join(REPO, "tests", "golden", "readme_first_command.json"),
          encoding="utf-8") as _f:
  FIRST_RUN = json.load(_f)


def _first_command():
  """README's first command (tests/test_readme.py's parser) and the outputs shown under it."""
  from tests.test_readme import parse  # pylint: disable=g-import-not-at-top
  return parse("README.md")[0].commands[0]


RUNS = [dict(FIRST_RUN["conditions"], seed=0, printed=FIRST_RUN["printed"],
             final_eval=FIRST_RUN["evals"][-1])] + FIRST_RUN["runs"]


def _accuracies(printed: str) -> tuple[float, float]:
  """(MLM, NSP) accuracy of the line the first command prints."""
  return tuple(float(x) for x in re.search(
      r"MLM accuracy ([\d.]+) .*NSP accuracy ([\d.]+)$", printed).groups())


def test_first_command_figures_are_its_recorded_runs():
  """README's first command shows the record's line rounded, README gives the median
  and the range of every recorded run's held-out MLM accuracy rounded (seeds, core counts,
  CPUs, code versions), and reports/tiny_recipes.md a row per run and the record's three
  evaluations; the record's line is what bertjax.main prints of its metrics
  (pretrain.summary)."""
  from bertjax.train import pretrain  # pylint: disable=g-import-not-at-top
  from configs import bert_tiny  # pylint: disable=g-import-not-at-top
  evals, final = FIRST_RUN["evals"], FIRST_RUN["evals"][-1]
  command = _first_command()
  assert FIRST_RUN["command"] in command.text
  assert pretrain.summary(final) == FIRST_RUN["printed"]
  rounded = re.sub(r"\d\.\d{4}", lambda m: f"{float(m.group()):.2f}", FIRST_RUN["printed"])
  assert command.outputs == [rounded]
  mlm = sorted(_accuracies(r["printed"])[0] for r in RUNS)
  text = " ".join(README.split())
  assert (f"held-out MLM accuracy, about {statistics.median(mlm):.2f} ({mlm[0]:.2f}-"
          f"{mlm[-1]:.2f} over {len(mlm)} runs") in text, mlm
  baseline = final["mlm_accuracy_most_frequent_baseline"]
  assert f"most frequent token ({baseline:.2f} at the default seed" in text
  tiny = " ".join(TINY.split())
  for r in RUNS:
    m, n = _accuracies(r["printed"])
    row = f"| {r['seed']} | {r['cores']} | {r['cpu']} | {r['code']} | {m:.4f} | {n:.4f} |"
    assert row in TINY, row
  shown = re.search(
      r"three evaluations \(steps ([\d,]+), ([\d,]+), ([\d,]+)\): MLM accuracy ([\d.]+), "
      r"([\d.]+), ([\d.]+); NSP accuracy ([\d.]+), ([\d.]+), ([\d.]+) on (\d+) pairs while "
      r"the held-out NSP loss rises ([\d.]+), ([\d.]+), ([\d.]+):", tiny)
  assert shown, "reports/tiny_recipes.md's three evaluations of the record"
  g = shown.groups()
  assert [int(x.replace(",", "")) for x in g[:3]] == [e["step"] for e in evals]
  assert int(g[2].replace(",", "")) == bert_tiny.get_config().train.num_steps
  assert list(g[3:6]) == [f"{e['mlm_accuracy']:.4f}" for e in evals]
  assert list(g[6:9]) == [f"{e['nsp_accuracy']:.4f}" for e in evals]
  assert int(g[9]) == FIRST_RUN["eval_examples"]
  assert list(g[10:13]) == [f"{e['nsp_loss']:.2f}" for e in evals]
  assert FIRST_RUN["conditions"]["cores"] == 2 and FIRST_RUN["conditions"]["devices"] == 1


def _cores() -> int:
  """The cores this process may use, as XLA's CPU runtime counts them (its affinity)."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("BERTJAX_TEST_README_RUN"),
                    reason="README's first command in full: 1,500 steps, about 4 minutes "
                    "on 2 idle cores; BERTJAX_TEST_README_RUN=1 runs it")
def test_first_command_repeats_its_record(tmp_path):
  """The first command as a user runs it (one CPU device, XLA's default settings)
  prints the record's line exactly under the record's conditions (cores, libraries,
  Python); elsewhere its data figures (the baseline) still agree and the rest may differ
  in rounding (reports/tiny_recipes.md)."""
  conditions = FIRST_RUN["conditions"]
  argv = FIRST_RUN["command"].replace("/tmp/", f"{tmp_path}/").split()
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  # A user's settings, not the suite's (tests/conftest.py): one device, and XLA's
  # optimisations and fusion emitters on.
  for name in ("JAX_NUM_CPU_DEVICES", "JAX_DISABLE_MOST_OPTIMIZATIONS",
               "JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
    env.pop(name, None)
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(
      "--xla_cpu_use_fusion_emitters=false", "").strip()
  out = subprocess.run([sys.executable if w == "python" else w for w in argv], cwd=REPO,
                       env=env, capture_output=True, text=True, check=True).stdout
  printed = out.strip().splitlines()[-1]
  same = (_cores() == conditions["cores"] and jax.__version__ == conditions["jax"]
          and sys.version.split()[0] == conditions["python"])
  if same:
    assert printed == FIRST_RUN["printed"], (printed, conditions)
  else:
    baseline = f" vs {FIRST_RUN['evals'][-1]['mlm_accuracy_most_frequent_baseline']:.4f} "
    assert baseline in printed, printed
