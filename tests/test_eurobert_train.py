"""EuroBERT and UltraBERT through training: each family's tiny recipe
(configs/<family>_tiny.py, as `python -m bertjax.main` runs it: a tokenizer trained on
the embedded corpus, its masking and optimizer) trains a few steps with a falling loss;
each is fine-tuned from a transformers directory (`config.init_from`), predicts, and
exports to its <Family>For<Task> with equal outputs; a saved folder of EuroBERT's kind
of tokenizer (Llama-3's special tokens) and what bertjax's tokenizer kinds make of it."""

import os

import numpy as np
import pytest

from bertjax.data import tokenizer as tok_lib
from bertjax.errors import DataError
from bertjax.hf import convert
from bertjax.train import pretrain
from configs import eurobert_tiny, ultrabert_tiny
from configs.finetune import glue, ner
from tests import eurobert_helpers as h, faults
from tests.modernbert_helpers import modernbert_tokenizer
from tests.tasks_helpers import export_matches, fine_tune_and_predict, shorten

transformers = pytest.importorskip("transformers")

RECIPES = {"eurobert": eurobert_tiny, "ultrabert": ultrabert_tiny}


@pytest.mark.slow
@pytest.mark.parametrize("family", h.FAMILIES)
def test_tiny_recipe_trains(family, tmp_path):
  """The recipe as configured (its tokenizer trained on the embedded corpus, 30% of
  the tokens masked, packed rows of documents isolated), 12 steps of 8 rows of 64."""
  c = RECIPES[family].get_config()
  assert c.model.family == family and c.data.corpus == "embedded"
  c.data.max_seq_length, c.data.max_predictions_per_seq = 64, 20
  c.train.update(batch_size=8, num_steps=12, warmup_steps=3, log_every=3, eval_every=12,
                 checkpoint_every=12, eval_batches=1)
  pretrain.run(c, str(tmp_path))
  losses = faults.losses(str(tmp_path))
  assert sorted(losses) == [3, 6, 9, 12]
  assert losses[12] < losses[3], losses


@pytest.fixture(scope="module", params=h.FAMILIES)
def hf_dir(request, tmp_path_factory):
  """A tiny random <Family>ForMaskedLM saved with save_pretrained, with a tokenizer of
  its ids (ModernBERT's kind: [CLS] ... [SEP], which bertjax's kinds read)."""
  directory = str(tmp_path_factory.mktemp(request.param))
  h.hf_model(request.param, vocab_size=605, pad_token_id=603, bos_token_id=601,
             eos_token_id=602, **({"mask_token_id": 604} if request.param == "eurobert"
                                  else {})).save_pretrained(directory)
  modernbert_tokenizer(directory)
  return request.param, directory


@pytest.mark.slow
def test_fine_tunes_predicts_and_exports(hf_dir, tmp_path):
  """EuroBERT: SST-2 classification (its 'late' pooling: 'auto' batching buckets, as
  packed examples cannot be pooled after the head's layers); UltraBERT:
  NER tagging in packed rows (documents isolated, rotary positions restarting). Each
  from the transformers directory, predicted, exported to its transformers class with
  equal outputs."""
  family, directory = hf_dir
  if family == "eurobert":
    c, train, dev, batching = glue.get_config("sst2"), "sst2_train.tsv", "sst2_dev.tsv", "auto"
  else:
    c, train, dev, batching = ner.get_config(), "conll_train.txt", "conll_dev.txt", "pack"
  c = shorten(c, train, dev, batching)
  c.init_from = directory
  workdir = str(tmp_path / "run")
  fine_tune_and_predict(c, workdir)
  table = convert.family_table(family)
  from tests.tasks_helpers import fixture  # pylint: disable=g-import-not-at-top
  export_matches(workdir, str(tmp_path / "hf"), fixture(dev), table.TASK_CLASSES,
                 token_types=False)


def test_llama3_tokenizer_folder(tmp_path):
  """EuroBERT's kind of tokenizer (a Llama-3 BPE whose special tokens are
  <|begin_of_text|>, <|end_of_text|>, <|mask|>, no unk): transformers' AutoTokenizer and
  bertjax's `load_tokenizer` read the folder with the same ids (bertjax's 'template'
  style: the post-processor's template, tokenizer_config.json's pad and mask; pairs,
  which this folder's template gives no special tokens, refused with one line:
  tests/test_tokenizer_template.py checks folders with a pair template)."""
  folder = h.llama3_tokenizer(str(tmp_path / "tok"))
  assert os.path.isfile(os.path.join(folder, "tokenizer.json"))
  theirs = transformers.AutoTokenizer.from_pretrained(folder)
  ids = theirs("the cat sat")["input_ids"]
  assert theirs.convert_ids_to_tokens([ids[0], ids[-1]]) == list(h.LLAMA3_SPECIALS[:2])
  assert theirs.mask_token == "<|mask|>"
  ours = tok_lib.load_tokenizer(folder)
  assert ours.style == "template" and ours.unk_id is None
  assert ((ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id) ==
          (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id, theirs.mask_token_id))
  assert ours("the cat sat")["input_ids"].tolist() == [ids]
  assert ours.tokenize("the cat <|mask|> sat") == theirs(
      "the cat <|mask|> sat", add_special_tokens=False)["input_ids"]
  with pytest.raises(DataError, match="pair template") as e:
    ours("the cat", "sat")
  assert "\n" not in str(e.value)
  np.testing.assert_array_equal(theirs("the cat sat", add_special_tokens=False)["input_ids"],
                                ids[1:-1])


@pytest.mark.slow
@pytest.mark.parametrize("family", h.FAMILIES)
def test_tiny_recipe_compiles_for_tpu_with_splash(family):
  """Each tiny recipe's train step (scanned blocks, bfloat16, packed rows, splash
  attention, grouped-query heads repeated) compiles for a v5e-4 with libtpu: splash
  kernels in the scanned body (forward, dq, dkv; UltraBERT's in both branches of its
  `lax.cond`, global and windowed) and no [T, T] buffer."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  if importlib.util.find_spec("libtpu") is None:
    pytest.skip("the TPU compiler (libtpu: the test extra, Linux x86)")
  from bertjax.benchmarks import plan as plan_lib  # pylint: disable=g-import-not-at-top
  config = RECIPES[family].get_config()
  config.model.update(vocab_size=512, max_position_embeddings=512, dtype="bfloat16",
                      attention_impl="splash", scan_layers=True)
  if family == "ultrabert":
    config.model.sliding_window = 64
  config.data.max_seq_length, config.data.max_predictions_per_seq = 512, 64
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = -1, 1, 1
  _, compiled, _ = plan_lib.compile_step(config, plan_lib.topology("v5e-4").devices, 4)
  text = compiled.as_text()
  branches = 2 if family == "ultrabert" else 1
  assert text.count(" conditional(") == (2 if family == "ultrabert" else 0)
  assert text.count('custom_call_target="tpu_custom_call"') == 3 * branches
  assert not re.search(r"\b512,512\]", text)
