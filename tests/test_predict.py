"""`bertjax.predict` on fine-tuned workdirs of every task kind, and what those workdirs
become: its predictions are the loop's own dev predictions (same weights, same
decoding), written per example next to the input fields, or as GLUE test-server files;
`python -m bertjax.convert --to=hf` writes the Hugging Face *For<Task> model (BERT- and
RoBERTa-style encoders) that transformers loads and that predicts the same; `init_from`
a fine-tuned workdir (intermediate fine-tuning) drops or keeps its head. The SQuAD run
is also the test that a whole span-QA fine-tuning run goes through the finetune."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from bertjax import api, convert as convert_cli
from bertjax.checkpoint import workdir as workdir_lib
from bertjax.tasks import predict
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import CheckpointError, DataError
from bertjax.tasks import base, get_task, finetune
from configs.finetune import glue, ner, squad, swag
from tests.tasks_helpers import FIXTURES, fixture, fixture_tokenizer, tiny_finetune

# run -> (config, arg, train, dev, RoBERTa-style encoder?, Hugging Face class)
RECIPES = {
    "sst2": (glue.get_config, "sst2", "sst2_train.tsv", "sst2_dev.tsv", False,
             "BertForSequenceClassification"),
    "stsb": (glue.get_config, "stsb", "stsb_train.tsv", "stsb_dev.tsv", True,
             "RobertaForSequenceClassification"),
    "ner": (ner.get_config, "ner", "conll_train.txt", "conll_dev.txt", False,
            "BertForTokenClassification"),
    "squad": (squad.get_config, "v2", "squad_v2.json", "squad_v2.json", False,
              "BertForQuestionAnswering"),
    "swag": (swag.get_config, None, "swag_train.csv", "swag_dev.csv", True,
             "RobertaForMultipleChoice"),
}


def _byte_level_bpe(directory: str) -> str:
  """A RoBERTa-style byte-level BPE trained on the fixtures' text."""
  lines = []
  for name in sorted(os.listdir(FIXTURES)):
    if name.endswith((".tsv", ".csv", ".txt", ".json")):
      with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        lines += f.read().replace("\t", " ").replace(",", " , ").splitlines()
  tok_lib.train_tokenizer(lines, "byte_level_bpe", vocab_size=500, lowercase=False).save(
      directory)
  return directory


def _roberta_style(config):
  """The tiny encoder with RoBERTa's layout: no pooler, no segments, offset positions."""
  m = config.model
  m.type_vocab_size, m.pad_token_id, m.position_offset = 1, 1, 2
  m.pooler, m.nsp, m.layer_norm_eps = False, False, 1e-5
  m.max_position_embeddings = config.task.max_seq_length + 2
  return config


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """One short fine-tuning run per task kind: {run: (config, workdir, dev scores)}."""
  wordpiece = fixture_tokenizer(str(tmp_path_factory.mktemp("vocab")))
  bpe = _byte_level_bpe(str(tmp_path_factory.mktemp("bpe")))
  out = {}
  for name, (get_config, arg, train, dev, roberta, _) in RECIPES.items():
    c = tiny_finetune(get_config() if arg is None else get_config(arg),
                      bpe if roberta else wordpiece, num_epochs=2)
    if roberta:
      _roberta_style(c)
    c.data.train, c.data.dev = fixture(train), fixture(dev)
    workdir = str(tmp_path_factory.mktemp(name))
    out[name] = (c, workdir, finetune.run(c, workdir))
  return out


def _dev_predictions(workdir):
  with open(os.path.join(workdir, "dev_predictions.json")) as f:
    return json.load(f)


@pytest.mark.slow
def test_predictions_match_the_loops_dev_predictions(runs):
  _, workdir, _ = runs["sst2"]
  records = predict.predict(workdir, fixture("sst2_dev.tsv"))
  assert [r["prediction"] for r in records] == _dev_predictions(workdir)
  assert set(records[0]) == {"text_a", "text_b", "prediction"}  # No gold label echoed.
  _, workdir, _ = runs["ner"]
  records = predict.predict(workdir, fixture("conll_dev.txt"))
  assert [r["prediction"] for r in records] == _dev_predictions(workdir)
  assert all(len(r["prediction"]) == len(r["words"]) for r in records)


@pytest.mark.slow
def test_squad_run_goes_through_the_loop_and_predicts_answer_text(runs):
  _, workdir, scores = runs["squad"]
  assert {"exact", "f1", "HasAns_exact", "NoAns_exact", "loss"} <= set(scores)
  records = predict.predict(workdir, fixture("squad_v2.json"))
  assert {r["id"]: r["prediction"] for r in records} == _dev_predictions(workdir)
  for r in records:  # Answers are cut from the passage (or '' for no answer).
    assert r["prediction"] in r["context"]


@pytest.mark.slow
def test_predict_on_jsonl_without_gold(runs, tmp_path):
  _, workdir, _ = runs["ner"]
  src = tmp_path / "in.jsonl"
  src.write_text(json.dumps({"words": ["Mary", "visited", "Unbelievablecorporationworks"]})
                 + "\n")
  out = tmp_path / "out.jsonl"
  # What `python -m bertjax.predict --checkpoint --input --output` does (the README
  # runs the program itself, on a TSV).
  assert predict.write(workdir, str(src), str(out), "test", "") == (str(out), 1)
  (record,) = [json.loads(line) for line in out.read_text().splitlines()]
  assert record["words"] == ["Mary", "visited", "Unbelievablecorporationworks"]
  assert len(record["prediction"]) == 3
  with pytest.raises(CheckpointError, match="task.json"):
    predict.predict(str(tmp_path), str(src))
  # As a pretrained encoder (init_from, embeddings): the encoder, and the task head.
  pretrained = api.load_pretrained(workdir)
  assert set(pretrained.params) == {"encoder"} and not pretrained.has_mlm
  assert pretrained.head.name == "tagging" and "B-PER" in pretrained.head.labels
  assert pretrained.head.labels == workdir_lib.task_info(workdir)["labels"]


def _hf_outputs(torch, model, task_name: str, arrays: dict) -> dict:
  """The Hugging Face model's outputs on bertjax's feature rows, in the form of the
  task's `predict_outputs` (what its decoder reads)."""
  inputs = {k: torch.from_numpy(arrays[k].astype(np.int64)) for k in base.TOKEN_KEYS}
  with torch.no_grad():
    out = model(**inputs)
  if task_name == "squad":
    return {"start_logits": out.start_logits.numpy(), "end_logits": out.end_logits.numpy()}
  if task_name == "tagging":
    return {"tags": out.logits.numpy().argmax(-1), "logits": out.logits.numpy()}
  return {"logits": out.logits.numpy()}


@pytest.mark.slow
@pytest.mark.parametrize("run", list(RECIPES))
def test_export_predicts_what_bertjax_predicts(runs, run, tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  _, workdir, _ = runs[run]
  *_, dev, _, hf_class = RECIPES[run]
  exported = str(tmp_path / "hf")
  convert_cli.main(["--to=hf", f"--src={workdir}", f"--dst={exported}"])
  with open(os.path.join(exported, "config.json")) as f:
    hf_config = json.load(f)
  assert hf_config["architectures"] == [hf_class]
  model, info = getattr(transformers, hf_class).from_pretrained(exported,
                                                                output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  finetuned = api.load_finetuned(workdir)
  task = finetuned.task
  if task.labels:  # Label names travel with the model.
    assert [hf_config["id2label"][str(i)] for i in range(len(task.labels))] == task.labels
    assert model.config.label2id == {l: i for i, l in enumerate(task.labels)}
  if run == "stsb":
    assert (hf_config["num_labels"], hf_config["problem_type"]) == (1, "regression")
  examples = task.read(fixture(dev), "dev")
  features = task.featurize(examples, train=False)
  theirs = _hf_outputs(torch, model.eval(), task.name, features.arrays)
  # The logits: transformers' on the export == bertjax's on the workdir.
  batch = {k: np.asarray(v) for k, v in features.arrays.items()}
  ours = jax.jit(base.FinetuneModel(finetuned.model, task.head(finetuned.model)).apply)(
      {"params": finetuned.params}, batch)
  for key in set(theirs) & set(ours) - {"tags"}:
    real = batch["attention_mask"] > 0 if key.endswith("_logits") else slice(None)
    np.testing.assert_allclose(np.asarray(ours[key])[real], theirs[key][real], atol=1e-4,
                               rtol=1e-4, err_msg=key)
  # The predictions: decoded from transformers' outputs == bertjax's (the loop's dev
  # predictions, which are `bertjax.predict`'s: test_predictions_match_...).
  decoded = task.decode(theirs, features, examples)
  if run == "stsb":
    np.testing.assert_allclose(decoded, _dev_predictions(workdir), atol=1e-4)
  else:
    assert decoded == _dev_predictions(workdir)


@pytest.mark.slow
def test_span_ner_has_no_hugging_face_class(runs, tmp_path, capsys):
  workdir = str(tmp_path / "span_ner")
  shutil.copytree(runs["ner"][1], workdir)
  info = workdir_lib.task_info(workdir)
  with open(os.path.join(workdir, "task.json"), "w") as f:
    json.dump(dict(info, name="span_ner"), f)
  with pytest.raises(SystemExit):
    convert_cli.main(["--to=hf", f"--src={workdir}", f"--dst={tmp_path / 'out'}"])
  err = capsys.readouterr().err.strip()
  assert "\n" not in err and "'span_ner' model has no Hugging Face class" in err
  assert not os.path.exists(tmp_path / "out")


@pytest.mark.slow
def test_glue_test_server_files(runs, tmp_path):
  (tmp_path / "test.tsv").write_text(
      "index\tsentence\n" + "".join(f"{i}\tthe movie felt {w} .\n" for i, w in enumerate(
          ["dreadful", "delightful", "dull", "wonderful"])))
  out = tmp_path / "submission"
  assert predict.write(runs["sst2"][1], str(tmp_path / "test.tsv"), glue_dir=str(out)) == (
      str(out / "SST-2.tsv"), 4)
  lines = (out / "SST-2.tsv").read_text().splitlines()
  assert lines[0] == "index\tprediction" and len(lines) == 5
  assert [l.split("\t")[0] for l in lines[1:]] == ["0", "1", "2", "3"]
  assert {l.split("\t")[1] for l in lines[1:]} <= {"0", "1"}
  # STS-B: scores; rows in the test file's index order.
  records = [{"index": 1, "prediction": 2.25}, {"index": 0, "prediction": 4.0}]
  predict.write_glue_tsv(records, "stsb", str(tmp_path / "STS-B.tsv"))
  assert (tmp_path / "STS-B.tsv").read_text() == "index\tprediction\n0\t4.000\n1\t2.250\n"
  with pytest.raises(DataError, match=r"prediction 'positive' is not a label the GLUE "
                     r"server takes for SST-2 \['0', '1'\]"):
    predict.write_glue_tsv([{"prediction": "positive"}], "sst2", str(tmp_path / "x.tsv"))
  # File names: an MNLI model writes three files; CoLA's test file has a header.
  assert [predict.glue_file("mnli", p) for p in (
      "glue/MNLI/test_matched.tsv", "glue/MNLI/test_mismatched.tsv",
      "glue/diagnostic/diagnostic.tsv", "tfds:glue/ax:test", "glue/AX.tsv")] == [
          "MNLI-m", "MNLI-mm", "AX", "AX", "AX"]
  assert predict.glue_file("rte", "RTE/test.tsv") == "RTE"
  with pytest.raises(CheckpointError, match="not a GLUE task"):
    predict.glue_file("", "x.tsv")
  cola = glue.get_config("cola")
  task = get_task("classification")(cola.task, api.load_pretrained(
      runs["sst2"][1]).tokenizer, 32)
  (tmp_path / "cola.tsv").write_text("index\tsentence\n0\tthe cat sat .\n1\tcat the .\n")
  assert [(e["index"], e["text_a"]) for e in task.read(str(tmp_path / "cola.tsv"), "test")
          ] == [(0, "the cat sat ."), (1, "cat the .")]


@pytest.mark.slow
def test_init_from_a_finetuned_workdir(runs, tmp_path):
  """MNLI -> RTE as the BERT paper did, here SST-2 -> STS-B (the head dropped) and
  SST-2 -> SST-2 (the head kept)."""
  source_config, source, _ = runs["sst2"]
  vocab = source_config.tokenizer
  saved = api.load_finetuned(source)
  stsb = tiny_finetune(glue.get_config("stsb"), vocab)
  stsb.tokenizer, stsb.init_from = "", source
  start = finetune.load_start(stsb)
  assert start.head is None and start.model == saved.model
  assert start.tokenizer.vocab_size == saved.tokenizer.vocab_size
  jax.tree.map(np.testing.assert_array_equal, start.encoder_params, saved.params["encoder"])
  # Kept: the run starts from the whole fine-tuned model.
  again = tiny_finetune(glue.get_config("sst2"), vocab)
  again.tokenizer, again.init_from, again.init_keep_head = "", source, True
  start = finetune.load_start(again)
  task = get_task("classification")(again.task, start.tokenizer, 32)
  task.labels = task.fit_labels(task.read(source_config.data.train, "train"))
  features = task.featurize(task.read(source_config.data.dev, "dev"), train=False)
  setup = finetune.build(again, task, start.model, finetune.example_batch(features), 6)
  params = finetune.initial_params(setup, again, start.encoder_params, start.head, task.labels)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(params), saved.params)
  # Kept only when it fits: the same task, the same labels in the same order (checked
  # where `finetune` starts the state).
  again.task.labels = ("1", "0")
  again.data.train, again.data.dev = source_config.data.train, source_config.data.dev
  with pytest.raises(CheckpointError) as e:
    finetune.run(again, str(tmp_path / "swapped"))
  assert "\n" not in str(e.value) and "predicts the labels ['0', '1'], this run has " \
      "['1', '0']" in str(e.value)
  tagging = tiny_finetune(ner.get_config(), vocab)
  tagging.tokenizer, tagging.init_from, tagging.init_keep_head = "", source, True
  with pytest.raises(CheckpointError, match="fine-tuned for task 'classification', this "
                     "run is 'tagging'"):
    finetune.load_start(tagging)
