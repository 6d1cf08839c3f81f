"""An embedding model trained end to end (issue 45): `bertjax.finetune` with the
retrieval recipe on docstring pairs (the worked example's data at a tiny size), scored
on a BEIR split before and after, resumed, exported to a folder that
sentence-transformers loads, its hard negatives mined and trained on; and the same run
on two processes (gloo) against one."""

import json
import os
import sysconfig

import numpy as np
import pytest

from bertjax import convert
from bertjax.benchmarks import retrieval_example
from bertjax.tasks import embedding, finetune, mining
from configs.finetune import retrieval as retrieval_config
from tests import faults


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """Docstring pairs of the json and email packages: train.jsonl and a BEIR split."""
  directory = str(tmp_path_factory.mktemp("retrieval_data"))
  stdlib = sysconfig.get_paths()["stdlib"]
  pairs = retrieval_example.docstring_pairs([os.path.join(stdlib, p)
                                              for p in ("json", "email")])
  assert len(pairs) > 60
  return retrieval_example.write_dataset(directory, pairs[:80], 16)


def _config(model, data, **task):
  c = retrieval_config.get_config()
  c.init_from, c.data.train, c.data.dev = model, data["train_path"], data["beir"]
  c.task.max_seq_length, c.task.mini_batch_size, c.task.eval_at_start = 32, 8, True
  c.train.batch_size, c.train.learning_rate, c.train.log_every = 16, 1e-3, 2
  c.train.num_epochs = 2
  c.train.eval_batch_size, c.train.checkpoint_every = 16, 4
  for k, v in task.items():
    c.task[k] = v
  return c


@pytest.mark.slow
def test_train_score_resume_export_mine(tiny_hf_bert, data, tmp_path):
  workdir = str(tmp_path / "run")
  dev = finetune.run(_config(tiny_hf_bert, data), workdir)
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  scored = [r for r in rows if r["split"] == "dev"]
  assert [r["step"] for r in scored] == [0, 8]  # At the start and at the end.
  assert set(retrieval_example.METRICS) <= set(dev) and 0 <= dev["ndcg@10"] <= 1
  assert json.load(open(os.path.join(workdir, "dev_results.json"))) == pytest.approx(dev)
  assert scored[-1]["ndcg@10"] == pytest.approx(dev["ndcg@10"])
  losses = faults.losses(workdir)
  assert losses[8] < losses[2]
  # Rerun: resumed at the end, nothing trained or scored again.
  finetune.run(_config(tiny_hf_bert, data), workdir)
  assert faults.losses(workdir) == losses
  # A sentence-transformers folder that encodes as the workdir does.
  folder = str(tmp_path / "st")
  convert.main(["--to=hf", f"--src={workdir}", f"--dst={folder}"])
  sentence_transformers = pytest.importorskip("sentence_transformers")
  theirs = sentence_transformers.SentenceTransformer(folder, device="cpu")
  ours = embedding.load_encoder(workdir)
  texts = [json.loads(line)["anchor"] for line in open(data["train_path"])][:6]
  np.testing.assert_allclose(ours.encode(texts, "query"), theirs.encode_query(texts),
                             atol=1e-5)
  # Hard negatives mined with the trained model, then trained on as triplets.
  triplets = str(tmp_path / "triplets.jsonl")
  counts = mining.mine_file(data["train_path"], triplets, ours.encode, range_max=10,
                            num_negatives=2)
  first = json.loads(open(triplets).readline())
  assert set(first) == {"anchor", "positive", "negative_1", "negative_2"}, counts
  c = _config(tiny_hf_bert, data, eval_at_start=False)
  c.data.train, c.data.dev = triplets, ""
  c.train.batch_size = 8  # Mined negatives are other pairs' positives: fewer fit a batch.
  finetune.run(c, str(tmp_path / "triplets_run"))
  assert len(faults.losses(str(tmp_path / "triplets_run"))) >= 2


@pytest.mark.slow
def test_two_processes_train_as_one(tiny_hf_bert, data, tmp_path):
  """2 processes x 4 devices (gloo) against 1 x 8: every process feeds its half of each
  batch, in-batch negatives come from both, and the losses of every step are the same."""
  from tests.test_multihost import _finish, _launch
  base = retrieval_config.get_config()
  flags = [f"--config.init_from={tiny_hf_bert}", f"--config.data.train={data['train_path']}",
           "--config.task.max_seq_length=32", "--config.task.mini_batch_size=8",
           "--config.train.batch_size=16", "--config.train.log_every=1",
           "--config.train.learning_rate=0.001", "--config.compilation_cache_dir="]
  assert base.task.mini_batch_size != 8 and base.train.batch_size != 16
  losses = {}
  for processes in (1, 2):
    workdir = str(tmp_path / f"p{processes}")
    _finish(_launch(workdir, str(tmp_path), processes, flags,
                    "configs/finetune/retrieval.py", "bertjax.finetune", processes))
    losses[processes] = faults.losses(workdir)
  assert sorted(losses[1]) == sorted(losses[2]) and len(losses[1]) >= 4
  np.testing.assert_allclose([losses[2][s] for s in sorted(losses[2])],
                             [losses[1][s] for s in sorted(losses[1])], rtol=1e-5)
