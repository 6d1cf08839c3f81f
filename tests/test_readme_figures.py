"""The README's figures that do not depend on the machine are what the code gives:
the recipes' parameter counts, the model FLOPs of the benchmark tables, the embedded
corpus's and its tokenizer's numbers and the fixtures' counts. (tests/test_readme.py
runs the commands, where any number may differ, and checks the exact error lines.)"""

import dataclasses
import importlib
import json
import os
import re

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
with open(os.path.join(REPO, "README.md"), encoding="utf-8") as _f:
  README = _f.read()


def _table(header_cell: str) -> list[list[list[str]]]:
  """The README's tables whose header has `header_cell`: rows of cells (header first)."""
  tables, rows = [], []
  for line in README.splitlines() + [""]:
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
  (table,) = _table("what it reproduces")
  checked = 0
  for row in table[1:]:
    recipe = re.fullmatch(r"`configs/(\w+)\.py`", row[0])
    count = re.search(r"(\d+\.\d)M\b", row[1])
    if recipe and count:
      config = importlib.import_module(f"configs.{recipe.group(1)}").get_config()
      assert round(_encoder_parameters(config) / 1e6, 1) == float(count.group(1)), row[:2]
      checked += 1
  assert checked == 14


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
  tables = _table("GFLOP/step")
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
  assert f"e.g. {total:.3e}".replace("e+", "e") in README  # 1.325e10


def test_embedded_corpus_and_tokenizer_figures(documents, tokenizer):
  sentences = [s for d in documents for s in d]
  words = [w for s in sentences for w in s.split()]
  assert (f"sentences {len(sentences)} | vocab_size {tokenizer.vocab_size} | pad_id "
          f"{tokenizer.pad_id} | cls_id {tokenizer.cls_id} | sep_id {tokenizer.sep_id} | "
          f"mask_id {tokenizer.mask_id} |") in README
  assert f"documents {len(documents)} | sentences {len(sentences):,} |" in README
  assert f"tokenizer: {len(sentences):,}/{len(sentences):,} sentences (100%)" in README
  distinct = 100 * len(set(words)) / len(words)
  assert (f"embedded corpus ({len(sentences):,} sentences, {len(words):,} words, "
          f"{distinct:.1f}% of") in README


def test_fixture_figures():
  def rows(name):
    with open(fixture(name), encoding="utf-8") as f:
      return f.read().splitlines()
  train, dev = len(rows("sst2_train.tsv")) - 1, len(rows("sst2_dev.tsv")) - 1  # headers
  assert f"fixture ({train} training sentences; the {dev} dev sentences" in README
  assert f"# wrote {dev} predictions to /tmp/sst2_dev_predictions.jsonl" in README
  texts = [json.loads(line) for line in rows("wsd_test.jsonl")]
  from configs import bert_tiny  # pylint: disable=g-import-not-at-top
  hidden = bert_tiny.get_config().model.hidden_size
  assert (f"{len(texts)} sentence vectors of size {hidden} from {len(texts)} texts"
          in README)


@pytest.mark.parametrize("recipe", ["bert_base", "bert_large"])
def test_bert_recipes_default_to_the_papers_two_length_phases(recipe):
  """90% of the steps at 128 tokens with 20 predictions, then 512 with 80, as the
  README's table says."""
  from bertjax.data import pipeline  # pylint: disable=g-import-not-at-top
  config = importlib.import_module(f"configs.{recipe}").get_config()
  assert pipeline.length_phases(config.data, config.train.num_steps) == [
      (900_000, 128, 20), (None, 512, 80)]
  assert "90% of the steps at 128 tokens (20 predictions), the last 10% at 512 (80)" in README
