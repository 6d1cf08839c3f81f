"""ELECTRA through the tools, against transformers on the same weights: Hugging Face
discriminator (ElectraForPreTraining) and generator (ElectraForMaskedLM) directories
read by `load_pretrained` (the replaced-token logits, the MLM logits), `python -m
bertjax.convert` both ways (the workdir's outputs, then transformers' on the exported
directory and its tokenizer), token embeddings (`Embedder`), `fill_mask` with the
generator (and one line with the discriminator), and the one-line errors of a
checkpoint of another family."""

import json
import os
import shutil

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from bertjax import api, convert as convert_cli  # pylint: disable=wrong-import-position
from bertjax.data.tokenizer import load_tokenizer  # pylint: disable=wrong-import-position
from bertjax.embeddings import extract  # pylint: disable=wrong-import-position
from bertjax.errors import CheckpointError  # pylint: disable=wrong-import-position
from bertjax.tasks import finetune  # pylint: disable=wrong-import-position
from bertjax.train import pretrain  # pylint: disable=wrong-import-position
from configs import bert_tiny  # pylint: disable=wrong-import-position
from configs.finetune import glue  # pylint: disable=wrong-import-position
from tests.helpers import hf_outputs, load_hf  # pylint: disable=wrong-import-position
from tests.electra_helpers import TEXTS, hf_electra  # pylint: disable=wrong-import-position
from tests.tasks_helpers import fixture  # pylint: disable=wrong-import-position

# network -> (Hugging Face class, its logits' name in bertjax)
NETWORKS = {"discriminator": ("ElectraForPreTraining", "rtd_logits"),
            "generator": ("ElectraForMaskedLM", "mlm_logits")}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
  """network -> a tiny Hugging Face directory of it (generator: embeddings of 16
  projected to 24, as the released generators are narrower than their
  discriminators)."""
  root = tmp_path_factory.mktemp("hf")
  return {"discriminator": hf_electra(str(root / "d"), NETWORKS["discriminator"][0]),
          "generator": hf_electra(str(root / "g"), NETWORKS["generator"][0],
                                  hidden_size=24, intermediate_size=32)}


@pytest.fixture(scope="module")
def workdirs(hf_dirs, tmp_path_factory):
  """network -> `python -m bertjax.convert --to=bertjax` of its directory."""
  root = tmp_path_factory.mktemp("converted")
  for name, src in hf_dirs.items():
    convert_cli.main(["--to=bertjax", f"--src={src}", f"--dst={root / name}"])
  return {name: str(root / name) for name in hf_dirs}


def _masked_diff(ours, theirs, mask) -> float:
  return float(np.abs(np.asarray(ours) - np.asarray(theirs))[mask.astype(bool)].max())


# The generator's both ways slow: fill_mask below reads its directory and workdir
# against transformers' probabilities in the fast tier.
@pytest.mark.parametrize("network", [
    "discriminator", pytest.param("generator", marks=pytest.mark.slow)])
def test_convert_both_ways_keeps_the_logits(network, hf_dirs, workdirs, tmp_path):
  """The Hugging Face directory and its converted workdir give transformers' logits
  (the discriminator's one per token, the generator's over the vocabulary) on padded
  rows; `convert --to=hf` of the workdir writes the same class, which transformers
  loads with the same logits and whose tokenizer gives bertjax's ids."""
  cls, key = NETWORKS[network]
  reference = load_hf(hf_dirs[network])
  for source in (hf_dirs[network], workdirs[network]):
    ours = api.load_pretrained(source).logits(TEXTS)
    ids, mask = ours["input_ids"], ours["attention_mask"]
    assert mask.min() == 0
    ref = hf_outputs(reference, ids, mask).logits.numpy()
    diff = _masked_diff(ours[key], ref, mask)
    print(f"{cls} from {os.path.basename(source)}: max |dlogits|={diff:.2e}")
    assert diff < 1e-5
  exported = str(tmp_path / "hf")
  convert_cli.main(["--to=hf", f"--src={workdirs[network]}", f"--dst={exported}"])
  with open(os.path.join(exported, "config.json")) as f:
    assert json.load(f)["architectures"] == [cls]
  assert _masked_diff(hf_outputs(load_hf(exported), ids, mask).logits.numpy(), ref,
                      mask) < 1e-5
  theirs = transformers.AutoTokenizer.from_pretrained(exported)
  np.testing.assert_array_equal(theirs(TEXTS, padding=True)["input_ids"], ids)


@pytest.mark.slow
def test_token_embeddings_are_transformers_hidden_states(hf_dirs):
  """`Embedder` on the discriminator (ELECTRA's encoder for downstream use): the last
  layer and the first block's output are transformers' hidden states at each text's
  tokens, [CLS] and [SEP] left out."""
  pretrained = api.load_pretrained(hf_dirs["discriminator"])
  batch = load_tokenizer(hf_dirs["discriminator"])(TEXTS)
  hidden = np.stack([h.numpy() for h in hf_outputs(
      load_hf(hf_dirs["discriminator"]), batch["input_ids"], batch["attention_mask"],
      output_hidden_states=True).hidden_states])  # [L+1, B, T, E]
  for layers in ("last", "1"):
    want = extract.combine_layers(hidden, extract.parse_layers(layers, 2))
    for i, (vectors, _) in enumerate(extract.Embedder(pretrained, layers=layers).tokens(
        TEXTS)):
      n = int(batch["attention_mask"][i].sum()) - 2
      np.testing.assert_allclose(vectors, want[i, 1:n + 1], atol=2e-5)


def test_fill_mask_with_the_generator(hf_dirs, workdirs):
  """`fill_mask` of the generator (directory and workdir) gives transformers' top
  tokens and probabilities; the discriminator, which has no MLM head, says so on one
  line."""
  text = "the movie was [MASK] and the cast was good"
  tok = load_tokenizer(hf_dirs["generator"])
  batch = tok([text])
  position = int(np.flatnonzero(batch["input_ids"][0] == tok.mask_id)[0])
  logits = hf_outputs(load_hf(hf_dirs["generator"]), batch["input_ids"],
                      batch["attention_mask"]).logits.numpy()[0, position]
  probs = np.exp(logits - logits.max())
  probs /= probs.sum()
  top = np.argsort(-probs)[:3]
  for checkpoint in (hf_dirs["generator"], workdirs["generator"]):
    (fillers,) = api.load_pretrained(checkpoint).fill_mask(text, top_k=3)
    assert [t for t, _ in fillers] == [tok.id_to_token(int(i)) for i in top]
    np.testing.assert_allclose([p for _, p in fillers], probs[top], atol=1e-6)
  with pytest.raises(CheckpointError, match=r"no MLM head \(its heads: \['rtd'\]\)") as e:
    api.load_pretrained(hf_dirs["discriminator"]).fill_mask(text)
  assert "\n" not in str(e.value)


def _bert_checkpoint(directory) -> str:
  """A directory whose config.json says BERT (what the family checks read)."""
  os.makedirs(directory)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump({"model_type": "bert", "vocab_size": 400}, f)
  return str(directory)


def test_checkpoints_of_another_family_are_one_line(workdirs, tmp_path):
  """Resuming a pretraining run of ELECTRA with a BERT model section, or resuming an
  ELECTRA fine-tuning run with config.init_from a BERT checkpoint: one line naming
  both families and the fix, before anything is written."""
  run = tmp_path / "pretrain"
  shutil.copytree(workdirs["discriminator"], run)
  with open(run / "run.json", "w") as f:  # as a pretraining run of it
    json.dump({"kind": "pretraining", "task": ""}, f)
  c = bert_tiny.get_config()
  with pytest.raises(CheckpointError, match=r"holds a run of the 'electra' model family "
                     r"but config.model.family='bert': resume with the run's config") as e:
    pretrain.run(c, str(run))
  assert "\n" not in str(e.value)
  run = tmp_path / "finetune"
  shutil.copytree(workdirs["discriminator"], run)
  with open(run / "task.json", "w") as f:  # a fine-tuning run's record, its files
    json.dump({"name": "classification", "labels": ["0", "1"], "num_steps": 6}, f)
  with open(run / "run.json", "w") as f:
    json.dump({"kind": "finetuning", "task": "classification"}, f)
  c = glue.get_config("sst2")
  c.init_from = _bert_checkpoint(tmp_path / "bert")
  c.data.train, c.data.dev = fixture("sst2_train.tsv"), fixture("sst2_dev.tsv")
  before = sorted(os.listdir(run))
  with pytest.raises(CheckpointError, match=r"holds a fine-tuning run of a 'electra' "
                     r"model but config.init_from=.* is a 'bert' checkpoint: use a new "
                     r"--workdir") as e:
    finetune.run(c, str(run))
  assert "\n" not in str(e.value)
  assert sorted(os.listdir(run)) == before
