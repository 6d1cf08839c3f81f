"""The soak benchmark (`python -m bertjax.benchmark soak`) on a few steps, so it keeps
working: one sample per checkpoint, the checkpoint counts, the windows and the verdict."""

import os

import pytest

from bertjax import benchmark
from bertjax.benchmarks import soak
from tests.helpers import tiny_config


@pytest.mark.slow
def test_soak_runs_a_few_steps(tmp_path):
  assert "soak" in benchmark.available()
  config = tiny_config(num_steps=8, max_to_keep=2, eval_batches=1)
  config.data.tokenizer.path = os.path.join(os.path.dirname(__file__), "fixtures", "tokenizer")
  config.model.vocab_size = 400  # that tokenizer's: none is trained
  config.data.max_seq_length, config.data.max_predictions_per_seq = 32, 5
  config.data.dupe_factor = 1
  words = "the model reads a short sentence and predicts the hidden words again".split()
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n\n".join(  # 40 documents of 6 sentences
      "\n".join(" ".join(words[(d + s + k) % len(words)] for k in range(9)) + "."
                for s in range(6)) for d in range(40)))
  config.data.corpus = str(corpus)
  result = soak.run(config, str(tmp_path / "run"), every=2)
  samples = result["samples"]
  assert [s.step for s in samples] == [2, 4, 6, 8]
  assert [s.checkpoints for s in samples] == [0, 1, 2, 2]  # max_to_keep=2
  assert result["final_checkpoints"] == 2 and all(s.rss_mb > 0 for s in samples)
  judged = soak.verdict(result, batch_size=8, max_to_keep=2, warmup_windows=1,
                        max_rss_growth_mb=1e6, min_throughput_ratio=0.0)
  assert [w["steps"] for w in judged["windows"]] == ["3-4", "5-6", "7-8"]
  assert all(w["steps_per_s"] > 0 and w["steps_per_cpu_s"] > 0 for w in judged["windows"])
  assert judged["checks"]["checkpoint_counts"]["ok"] and judged["passed"]
  strict = soak.verdict(result, batch_size=8, max_to_keep=3, warmup_windows=1,
                        max_rss_growth_mb=-1.0, min_throughput_ratio=1e9)
  assert not any(c["ok"] for c in strict["checks"].values()) and not strict["passed"]
  assert "soak FAIL" in soak.table(result, strict).splitlines()[-1]
