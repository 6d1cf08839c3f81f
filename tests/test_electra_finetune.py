"""ELECTRA through fine-tuning: each task head against transformers' ElectraFor* on the
same weights (ElectraForSequenceClassification's ElectraClassificationHead,
ForTokenClassification, ForQuestionAnswering, ForMultipleChoice's SequenceSummary),
their dropouts where transformers has them, and the task families fine-tuned cheaply
from a Hugging Face discriminator directory or its converted workdir, `predict`, and
the export to ElectraFor<Task> (equal outputs, labels)."""

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bertjax import convert as convert_cli  # pylint: disable=wrong-import-position
from bertjax.hf import electra as conv  # pylint: disable=wrong-import-position
from bertjax.tasks import base, get_task  # pylint: disable=wrong-import-position
from configs.finetune import glue, ner, span_ner, squad, swag  # pylint: disable=wrong-import-position
from tests.electra_helpers import hf_config, hf_electra  # pylint: disable=wrong-import-position
from tests.helpers import hf_outputs, perturb  # pylint: disable=wrong-import-position
from tests.tasks_helpers import export_matches, fine_tune_and_predict, fixture, shorten  # pylint: disable=wrong-import-position

T = 20


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """A Hugging Face ElectraForPreTraining (the discriminator) directory."""
  return hf_electra(str(tmp_path_factory.mktemp("hf")))


@pytest.fixture(scope="module")
def workdir(hf_dir, tmp_path_factory):
  """`python -m bertjax.convert --to=bertjax` of the discriminator."""
  out = str(tmp_path_factory.mktemp("converted") / "wd")
  convert_cli.main(["--to=bertjax", f"--src={hf_dir}", f"--dst={out}"])
  return out


# ---- The heads against transformers ------------------------------------------------

HEADS = {  # bertjax task -> its task config
    "classification": glue.get_config("mnli").task, "tagging": ner.get_config().task,
    "squad": squad.get_config().task, "multiple_choice": swag.get_config().task}


def _batch(task_name: str, pad_id: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  shape = (2, 4, T) if task_name == "multiple_choice" else (3, T)
  lengths = rng.integers(T // 2, T + 1, shape[:-1])
  lengths.flat[0] = T
  mask = (np.arange(T) < lengths[..., None]).astype(np.int32)
  ids = np.where(mask > 0, rng.integers(5, 400, shape), pad_id).astype(np.int32)
  types = (np.arange(T) >= lengths[..., None] // 2).astype(np.int32) * mask
  return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def _ours(task, cfg, params, batch, deterministic=True, rng=None) -> np.ndarray:
  model = base.FinetuneModel(cfg, task.head(cfg))
  # Jitted: one compiled program, not an eager dispatch of every op.
  out = jax.jit(lambda p, b, r: model.apply(
      {"params": p}, b, deterministic=deterministic,
      rngs=None if r is None else {"dropout": r}))(params, batch, rng)
  return np.asarray(np.stack([out["start_logits"], out["end_logits"]], -1)
                    if task.name == "squad" else out["logits"])


def _theirs(task_name: str, model, batch) -> np.ndarray:
  out = hf_outputs(model, batch["input_ids"], batch["attention_mask"],
                   token_type_ids=torch.as_tensor(batch["token_type_ids"]))
  return (np.stack([out.start_logits.numpy(), out.end_logits.numpy()], -1)
          if task_name == "squad" else out.logits.numpy())


@pytest.mark.parametrize("task_name", list(HEADS))
# The projected embedding (16 < hidden 32) is every family's tiny ELECTRA: its heads
# against transformers in tests/test_family_conformance.py.
@pytest.mark.parametrize("embedding", [pytest.param(32, id="unprojected", marks=pytest.mark.slow)])
def test_task_classes_equal_transformers(task_name, embedding):
  """A random transformers ElectraFor<Task> (every weight moved), read through the
  family's table (its task from `architectures`), gives the same outputs in bertjax's
  task model, on padded rows with two token types."""
  cls = conv.TASK_CLASSES[task_name][0]
  config = hf_config(embedding_size=embedding, attn_implementation="eager",
                     num_labels=2 if task_name == "squad" else 3)
  torch.manual_seed(0)
  model = perturb(getattr(transformers, cls)(config))
  state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  cfg, params, task_read = conv.load(dict(config.to_dict(), architectures=[cls]), state)
  assert task_read == task_name
  task = get_task(task_name)(HEADS[task_name], None, T)
  task.labels = ["a", "b", "c"] if task_name in ("classification", "tagging") else []
  batch = _batch(task_name, cfg.pad_token_id)
  ours, ref = _ours(task, cfg, params, batch), _theirs(task_name, model, batch)
  if task_name in ("tagging", "squad"):  # per token: the real ones
    ours, ref = ours[batch["attention_mask"] > 0], ref[batch["attention_mask"] > 0]
  diff = float(np.abs(ours - ref).max())
  print(f"{cls} D={embedding}: max |dlogits|={diff:.2e}")
  assert diff < 1e-5
  # And back: the export writes the same class, labels and every weight it read.
  hf_json, exported = conv.export(params, cfg, task_name, task.labels or None)
  assert hf_json["architectures"] == [cls]
  if task.labels:
    assert list(hf_json["id2label"].values()) == task.labels
  assert set(exported) <= set(state)
  for key, value in exported.items():
    np.testing.assert_array_equal(value, state[key], err_msg=key)


@pytest.mark.slow  # 12 s at load 9 (8 compiles); the heads themselves are fast above.
def test_head_dropouts_are_transformers():
  """In training, sequence classification drops out [CLS] and the head's dense output
  at classifier_dropout (ElectraClassificationHead); multiple choice drops out only
  its summary's output, at summary_dropout (SequenceSummary's summary_last_dropout):
  with that at 0 its training logits are its evaluation ones, whatever
  classifier_dropout is."""
  state = {}
  config = lambda summary, classifier: conv.model_config_from_hf(hf_config(
      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
      classifier_dropout=classifier, summary_last_dropout=summary).to_dict())
  for task_name in ("classification", "multiple_choice"):
    task = get_task(task_name)(HEADS[task_name], None, T)
    task.labels = ["a", "b", "c"] if task_name == "classification" else []
    batch = _batch(task_name, 0)
    # The rates change no parameter and no evaluation: one init and one evaluation.
    cfg = config(0.0, 0.0)
    params = jax.jit(base.FinetuneModel(cfg, task.head(cfg)).init)(
        jax.random.key(0), batch)["params"]
    evaluation = _ours(task, cfg, params, batch)
    for summary, classifier in ((0.0, 0.5), (0.5, 0.0)):
      train = _ours(task, config(summary, classifier), params, batch, False,
                    jax.random.key(1))
      state[task_name, summary] = np.abs(train - evaluation).max()
  assert state["classification", 0.0] > 1e-3 and state["classification", 0.5] == 0
  assert state["multiple_choice", 0.0] == 0 and state["multiple_choice", 0.5] > 1e-3


# ---- Every task family, fine-tuned -------------------------------------------------

# case -> (config, train file, dev file, init_from fixture, batching)
# Each init source, batching mode, pooled and per-token head and the no-class error
# once; every head's export both ways is test_task_classes_equal_transformers', and
# regression and SQuAD through the loop are the task tests' (test_tasks_*) and DeBERTa's
# (test_deberta_tools).
RUNS = {
    "sst2": (lambda: glue.get_config("sst2"), "sst2_train.tsv", "sst2_dev.tsv", "hf_dir", "pack"),
    "ner": (ner.get_config, "conll_train.txt", "conll_dev.txt", "workdir", "pack"),
    "span_ner": (span_ner.get_config, "span_ner_train.jsonl", "span_ner_dev.jsonl", "hf_dir", "max"),
    "swag": (swag.get_config, "swag_train.csv", "swag_dev.csv", "workdir", "bucket"),
}


@pytest.mark.slow  # A fine-tuning run each (and the module's conversion).
@pytest.mark.parametrize("case", RUNS)
def test_fine_tunes_predicts_and_exports(case, request, tmp_path, capsys):
  """One epoch of each case of RUNS from the Hugging Face discriminator or its workdir;
  `predict` gives the dev predictions again; `convert --to=hf` writes the
  ElectraFor<Task> with the labels, whose outputs equal the fine-tuned model's on dev
  rows (span NER: one line saying why not)."""
  make, train, dev, source, batching = RUNS[case]
  c = shorten(make(), train, dev, batching)
  c.init_from = request.getfixturevalue(source)
  workdir = str(tmp_path / "run")
  fine_tune_and_predict(c, workdir)
  exported = str(tmp_path / "hf")
  if c.task.name == "span_ner":
    with pytest.raises(SystemExit):
      convert_cli.main(["--to=hf", f"--src={workdir}", f"--dst={exported}"])
    err = capsys.readouterr().err.strip()
    assert "has no Hugging Face class" in err and "\n" not in err
    return
  export_matches(workdir, exported, fixture(dev), conv.TASK_CLASSES)
