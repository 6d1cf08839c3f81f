"""A published mmBERT (issue 59, item 4; none is downloadable here, so a random
transformers ModernBertForMaskedLM with mmBERT's config stands in): loaded exactly,
continued with the decay phase's settings (configs/continued.py:mmbert) on two of the
shipped languages, exported for transformers and fine-tuned."""

import json
import os

import jax
import numpy as np
import pytest

from bertjax.train import pretrain
from configs import mmbert_tiny
from tests.test_mmbert_recipe import gemma_like
from tests.test_tokenizer import CORPUS

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def published(tmp_path_factory):
  """A published mmBERT folder's stand-in (none is downloadable here): transformers'
  ModernBertForMaskedLM with mmBERT-base's config (256,000 pieces, Gemma's special ids,
  both thetas 160,000, no biases, LayerNorm eps 1e-5 without bias) at 2 layers of
  H=64 (a test's size; the full size is test_full_size_parameter_counts'), random
  weights moved off their initial values, and the Gemma-style tokenizer."""
  torch = pytest.importorskip("torch")
  directory = str(tmp_path_factory.mktemp("mmbert"))
  torch.manual_seed(0)
  model = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
      vocab_size=256_000, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=2, max_position_embeddings=8192, norm_eps=1e-5, norm_bias=False,
      global_rope_theta=160_000.0, local_rope_theta=160_000.0, local_attention=16,
      global_attn_every_n_layers=3, pad_token_id=0, eos_token_id=1, bos_token_id=2,
      cls_token_id=2, sep_token_id=1))
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
  model.save_pretrained(directory)
  lines = open(os.path.join(mmbert_tiny.CORPUS, "isl.txt"), encoding="utf-8").read().split("\n")
  transformers.PreTrainedTokenizerFast(
      tokenizer_object=gemma_like([x for x in lines if x][:400] + list(CORPUS)),
      bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
      mask_token="<mask>", cls_token="<bos>", sep_token="<eos>",
      model_max_length=8192).save_pretrained(directory)
  return directory, model.eval()


def _logits_equal(ours_dir: str, hf_model, texts) -> None:
  """bertjax's MLM logits of `ours_dir` equal `hf_model`'s on `texts` (padded), rtol 1e-4."""
  import torch  # pylint: disable=g-import-not-at-top
  from bertjax.checkpoint.pretrained import load_pretrained  # pylint: disable=g-import-not-at-top
  from bertjax.model import modernbert as mb  # pylint: disable=g-import-not-at-top
  ours = load_pretrained(ours_dir)
  batch = ours.tokenizer(texts, max_length=32)
  model = mb.FAMILY.pretraining(ours.config)
  mine = jax.jit(lambda p: model.apply({"params": p}, batch["input_ids"],
                                       attention_mask=batch["attention_mask"]))(ours.params)
  with torch.no_grad():
    theirs = hf_model(input_ids=torch.from_numpy(batch["input_ids"]).long(),
                      attention_mask=torch.from_numpy(batch["attention_mask"]).long()).logits
  real = batch["attention_mask"].astype(bool)
  np.testing.assert_allclose(np.asarray(mine["mlm_logits"])[real], theirs.numpy()[real],
                             rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_published_mmbert_continues_exports_and_fine_tunes(published, tmp_path):
  """The folder loads exactly (bertjax's logits are transformers'); configs/continued.py
  :mmbert continues it on two of the shipped languages with the decay phase's settings
  (5% masking, 160,000 for both thetas: the folder's); the export loads in
  transformers with bertjax's logits; and the continued workdir fine-tunes (SST-2's
  fixture, one epoch)."""
  import torch  # pylint: disable=g-import-not-at-top
  from bertjax import convert as convert_cli  # pylint: disable=g-import-not-at-top
  from bertjax.checkpoint import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from configs import continued as continued_config  # pylint: disable=g-import-not-at-top
  from configs.finetune import glue  # pylint: disable=g-import-not-at-top
  from tests.tasks_helpers import fine_tune_and_predict, shorten  # pylint: disable=g-import-not-at-top
  folder, hf_model = published
  texts = ["Skráin fannst ekki", "Villa kom upp við að opna skrána", "the cat sat"]
  _logits_equal(folder, hf_model, texts)
  c = continued_config.get_config("mmbert")
  c.init_from = folder
  c.model.dtype = "float32"
  c.compilation_cache_dir = ""
  c.data.corpus = ""
  c.data.languages = ",".join(f"{n}={os.path.join(mmbert_tiny.CORPUS, n)}.txt"
                              for n in ("isl", "fao"))
  c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 6
  c.train.update(batch_size=8, num_steps=6, warmup_steps=1, decay_fraction=5 / 6,
                 eval_every=6, eval_batches=1, checkpoint_every=6, log_every=2,
                 learning_rate=1e-3)
  workdir = str(tmp_path / "continued")
  pretrain.run(c, workdir)
  model = workdir_lib.load_config(workdir).model
  assert (model.global_rope_theta, model.local_rope_theta, model.vocab_size) == (
      160_000.0, 160_000.0, 256_000)
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert {"isl/mlm_loss", "fao/mlm_loss"} <= set(rows[-1])
  exported = str(tmp_path / "hf")
  convert_cli.main(["--to=hf", f"--src={workdir}", f"--dst={exported}"])
  back = transformers.AutoModelForMaskedLM.from_pretrained(exported).eval()
  _logits_equal(workdir, back, texts)
  assert not torch.allclose(back.model.embeddings.tok_embeddings.weight,
                            hf_model.model.embeddings.tok_embeddings.weight)
  f = shorten(glue.get_config("sst2"), "sst2_train.tsv", "sst2_dev.tsv", "bucket")
  f.init_from = exported
  f.compilation_cache_dir = ""
  fine_tune_and_predict(f, str(tmp_path / "sst2"))
