"""GTE and NomicBERT through bertjax's programs: each family's tiny recipe
(configs/gte_tiny.py, configs/nomic_bert_tiny.py, at the tests' sizes) pretrains on the
embedded corpus and its loss falls; the workdir exports to transformers
(AutoModelForMaskedLM and AutoTokenizer with bertjax's logits and ids); it fine-tunes
on a pooled, a per-token and a multiple-choice task, predicts, and exports to the
family's For<Task> classes where transformers has one (one line where it has none)."""

import functools
import os

import numpy as np
import pytest

from bertjax.hf import convert as hf_convert
from bertjax.train import pretrain
from configs import gte_tiny, nomic_bert_tiny
from configs.finetune import glue, ner, swag
from tests import faults
from tests.helpers import hf_outputs, load_hf, tiny_config
from tests.tasks_helpers import export_matches, fine_tune_and_predict, fixture, shorten

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("shared_trainers")  # reruns share one step
TOKENIZER = os.path.join(os.path.dirname(__file__), "fixtures", "tokenizer")
RECIPES = {"gte": gte_tiny, "nomic_bert": nomic_bert_tiny}
TEXTS = ["the cat sat on the mat while the dog ran", "a dog",
         "please turn your homework in"]


def tiny_recipe(family: str):
  """The family's tiny recipe at tiny_config's sizes (20 steps of 8 rows of 32, H=32,
  A=2), on the stored 400-id WordPiece; metrics every 5 steps, one evaluation at the
  end."""
  c = RECIPES[family].get_config()
  small = tiny_config(num_steps=20, log_every=5, eval_every=20, checkpoint_every=20,
                      eval_batches=1)
  c.train = small.train
  c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 10
  c.data.tokenizer.path, c.data.tokenizer.vocab_size = TOKENIZER, 400
  m = c.model
  m.vocab_size, m.hidden_size, m.num_heads, m.intermediate_size = 400, 32, 2, 48
  m.max_position_embeddings, m.dtype = 64, "float32"
  return c


@pytest.fixture(scope="module")
def pretrain_once(tmp_path_factory):
  """family -> the workdir of its tiny recipe, pretrained at the first ask."""

  @functools.cache
  def workdir(family: str) -> str:
    directory = str(tmp_path_factory.mktemp(family))
    pretrain.run(tiny_recipe(family), directory)
    return directory

  return workdir


@pytest.fixture(params=list(RECIPES))
def pretrained(request, pretrain_once):
  return request.param, pretrain_once(request.param)


@pytest.mark.slow
def test_tiny_recipe_trains(pretrained):
  _, workdir = pretrained
  losses = faults.losses(workdir)
  assert sorted(losses) == [5, 10, 15, 20] and losses[20] < losses[5]


@pytest.mark.slow
def test_pretrained_workdir_exports_to_transformers(pretrained, tmp_path):
  """`python -m bertjax.convert --to=hf`: transformers' AutoModelForMaskedLM (the
  family's class) and AutoTokenizer read it with bertjax's logits and ids."""
  from bertjax import api, convert  # pylint: disable=g-import-not-at-top
  family, workdir = pretrained
  exported = str(tmp_path / "hf")
  convert.main(["--to=hf", f"--src={workdir}", f"--dst={exported}"])
  ours = api.load_pretrained(workdir).logits(TEXTS)
  tokens = transformers.AutoTokenizer.from_pretrained(exported)(TEXTS, padding=True)
  np.testing.assert_array_equal(tokens["input_ids"], ours["input_ids"])
  model = load_hf(exported)
  assert type(model).__name__ == hf_convert.family_table(family).TASK_CLASSES[
      "classification"][0].replace("SequenceClassification", "MaskedLM")
  ref = hf_outputs(model, ours["input_ids"], ours["attention_mask"]).logits.numpy()
  real = ours["attention_mask"].astype(bool)
  assert np.abs(ours["mlm_logits"] - ref)[real].max() < 1e-5


# case -> (config, train file, dev file, batching): a pooled head on packed rows, a
# per-token head, multiple choice (bertjax's generic head: no transformers class).
RUNS = {
    "sst2": (lambda: glue.get_config("sst2"), "sst2_train.tsv", "sst2_dev.tsv", "pack"),
    "ner": (ner.get_config, "conll_train.txt", "conll_dev.txt", "max"),
    "swag": (swag.get_config, "swag_train.csv", "swag_dev.csv", "bucket"),
}


@pytest.mark.slow
@pytest.mark.parametrize("family,case", [("gte", "sst2"), ("nomic_bert", "ner"),
                                         ("nomic_bert", "swag")])
def test_fine_tunes_predicts_and_exports(pretrain_once, family, case, tmp_path, capsys):
  """One epoch from the pretrained workdir; `predict` gives the dev predictions again;
  `convert --to=hf` writes the For<Task> class with equal outputs on dev rows, or says
  in one line that transformers has none (multiple choice). Each case runs on one of
  the two families (their task heads, both classes each, are equal to transformers' in
  tests/test_family_conformance.py)."""
  from bertjax import convert as convert_cli  # pylint: disable=g-import-not-at-top
  source = pretrain_once(family)
  make, train, dev, batching = RUNS[case]
  c = shorten(make(), train, dev, batching)
  c.init_from = source
  workdir = str(tmp_path / "run")
  fine_tune_and_predict(c, workdir)
  exported = str(tmp_path / "hf")
  if case == "swag":
    with pytest.raises(SystemExit):
      convert_cli.main(["--to=hf", f"--src={workdir}", f"--dst={exported}"])
    err = capsys.readouterr().err.strip()
    assert "has no Hugging Face class" in err and "\n" not in err
    return
  export_matches(workdir, exported, fixture(dev), hf_convert.family_table(family).TASK_CLASSES)
