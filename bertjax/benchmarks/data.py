"""`python -m bertjax.benchmark data`: input-pipeline throughput per CPU core, and with
`--scale` the cost of preparing and starting on corpora of growing size.

  python -m bertjax.benchmark data --seq=128 --batch=32 --passes=7
  python -m bertjax.benchmark data --scale --sizes_mb=50,200,1000   # see data_scale.py

The paths run in this one process (one core) on the same text (the embedded corpus,
`--repeat` times) and the same WordPiece vocabulary:
(a) pre-tokenized: packed [N, seq] examples -> the grain training stream (shuffle,
    batching, 80/10/10 masking of each whole batch) -> masked batches; the same rows
    read from prepared shards on disk (`prepared` below: what training reads);
(b) raw text -> masked batches: bertjax (tokenization with the per-word cache of
    `bertjax.data.tokenizer`, packing, the stream of (a)) next to Hugging Face
    (`tokenizers` encode_batch, concatenate-and-chunk into rows of `seq`,
    `DataCollatorForLanguageModeling` with numpy tensors).
Rates are per CPU-second of the process (time.process_time over all its threads), so
they measure the cost per core even on a busy machine; run under `taskset -c 0` to
also keep the libraries' threads on one core. (a) runs `--epochs` epochs of masking
over the packed examples. The paths alternate for `--passes` passes, each of (b)'s starting from a freshly loaded
tokenizer (an empty word cache), and the median pass is reported: examples/s and
tokens/s per core for each, and (b)'s speed-up over HF. The word cache gains from
repeated words, so `--repeat` above 1 would flatter it: the default is one copy, and
the share of distinct words in the text is printed (the smaller, the larger the gain).
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
import time

from absl import flags
import ml_collections
import numpy as np

from bertjax.benchmarks import data_scale
from bertjax.data import sources, masking, pipeline, builders, rows as rows_lib
from bertjax.data.tokenizer import load_tokenizer, train_tokenizer

_SEQ = flags.DEFINE_integer("seq", 128, "Sequence length.")
_BATCH = flags.DEFINE_integer("batch", 32, "Examples per batch.")
_REPEAT = flags.DEFINE_integer("repeat", 1, "Copies of the embedded corpus in the text.")
_PASSES = flags.DEFINE_integer("passes", 7, "Alternating timed passes of each path.")
_EPOCHS = flags.DEFINE_integer("epochs", 8, "Epochs over the packed examples in (a).")
_VOCAB = flags.DEFINE_integer("vocab_size", 8192, "WordPiece vocabulary trained first.")
_SCALE = flags.DEFINE_bool("scale", False, "Instead: prepare corpora of growing size and "
                           "start training on them (flags of data_scale.py).")


def _rate(examples: int, tokens: int, seconds: float) -> dict[str, float]:
  return {"examples_per_cpu_s": round(examples / seconds, 1),
          "tokens_per_cpu_s": round(tokens / seconds, 1), "cpu_seconds": round(seconds, 3)}


def _masked_batches(examples, mask_cfg, batch: int, epochs: int = 1) -> tuple[int, int]:
  """`epochs` passes of the grain stream over `examples` (Examples in memory, or a
  row source) with new masks each epoch; (examples, real tokens) produced."""
  rows = len(examples)
  if not isinstance(examples, builders.Examples):
    examples = [pipeline.Phase(None, (examples,), None, mask_cfg)]
  it = iter(pipeline.make_train_dataset(examples, mask_cfg, batch_size=batch, seed=0,
                                        nsp=False))
  n = tokens = 0
  for _ in range(epochs * rows // batch):
    b = next(it)
    n += len(b["input_ids"])
    tokens += int(b["attention_mask"].sum())
  return n, tokens


def _hf_tools(tok):
  """Hugging Face's fast tokenizer over our vocabulary and its MLM collator (built
  before timing, like our tokenizer: importing transformers alone takes ~1 s)."""
  import transformers  # pylint: disable=g-import-not-at-top (heavy, optional)
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok._backend.tok, pad_token="[PAD]", unk_token="[UNK]",  # pylint: disable=protected-access
      cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
  return fast, transformers.DataCollatorForLanguageModeling(
      fast, mlm_probability=0.15, return_tensors="np")


def _hf(sentences: list[str], fast, collator, seq: int, batch: int) -> tuple[int, int]:
  """Hugging Face's run_mlm path: tokenize, group texts into rows, collate with masking."""
  ids = [t for e in fast(sentences, add_special_tokens=False)["input_ids"] for t in e]
  body = seq - 2
  rows = [[fast.cls_token_id, *ids[i:i + body], fast.sep_token_id]
          for i in range(0, len(ids) - body + 1, body)]
  n = tokens = 0
  for i in range(0, len(rows) - batch + 1, batch):
    out = collator([{"input_ids": r} for r in rows[i:i + batch]])
    n += len(out["input_ids"])
    tokens += int(out["attention_mask"].sum()) if "attention_mask" in out else out[
        "input_ids"].size
  return n, tokens


def _timed(fn) -> dict[str, float]:
  """Rates per CPU-second of this process (all its threads): the cost per core, which
  other work on the machine does not inflate as it does wall time."""
  start = time.process_time()
  examples, tokens = fn()
  return _rate(examples, tokens, time.process_time() - start)


def _median(passes: list[dict[str, float]]) -> dict[str, float]:
  return sorted(passes, key=lambda r: r["cpu_seconds"])[len(passes) // 2]


def _prepared_rows(examples, tok, directory: str) -> rows_lib.FileRows:
  """`examples` written as prepared shards (4 of them) and opened for random access."""
  rows = rows_lib.encode(examples, tok.word_starts(), rows_lib.id_dtype(tok.vocab_size))
  paths = []
  for k, part in enumerate(np.array_split(rows, 4)):
    paths.append(os.path.join(directory, f"part-{k:05d}{rows_lib.SUFFIX}"))
    rows_lib.write(paths[-1], part)
  return rows_lib.FileRows(paths, [len(p) for p in np.array_split(rows, 4)], rows.dtype)


def main(argv):
  if _SCALE.value:
    return data_scale.main(argv)
  del argv
  seq, batch = _SEQ.value, _BATCH.value
  documents = sources.load_documents("embedded") * _REPEAT.value
  sentences = [s for d in documents for s in d]
  words = [w for s in sentences for w in s.split()]
  with tempfile.TemporaryDirectory() as vocab_dir:
    train_tokenizer(sentences, kind="wordpiece", vocab_size=_VOCAB.value).save(vocab_dir)
    tok = load_tokenizer(vocab_dir)
    data_cfg = ml_collections.ConfigDict(dict(  # BERT's masking (configs/bert_base.py)
        max_predictions_per_seq=int(np.ceil(0.15 * seq)), masked_lm_prob=0.15,
        mask_token_prob=0.8, random_token_prob=0.1, masking="token",
        random_token_distribution="uniform", span_geometric_p=0.2, max_span_length=10,
        masked_lm_draw="fixed", mask_special_tokens=False))
    mask_cfg = masking.MaskingConfig.create(data_cfg, tok)
    packed = builders.create_packed_examples(
        builders.tokenize_documents(documents, tok), tok, max_seq_length=seq)
    prepared = _prepared_rows(packed, tok, vocab_dir)
    hf_tools = _hf_tools(tok)

    # Loaded before timing, like Hugging Face's: each pass starts with an empty cache.
    fresh = [load_tokenizer(vocab_dir) for _ in range(_PASSES.value)]

    def ours_raw(i):
      tok, fresh[i] = fresh[i], None  # Its cache is freed after the pass.
      return _masked_batches(builders.create_packed_examples(
          builders.tokenize_documents(documents, tok), tok, max_seq_length=seq),
                             mask_cfg, batch)

    # The objects of the set-up (transformers' import above all) are left out of the
    # garbage collector's full passes, which would otherwise land in random passes.
    gc.collect()
    gc.freeze()
    runs = {"a_pretokenized_bertjax": [], "a_prepared_shards_bertjax": [],
            "b_raw_text_bertjax": [], "b_raw_text_hf": []}
    for i in range(_PASSES.value):
      runs["a_pretokenized_bertjax"].append(
          _timed(lambda: _masked_batches(packed, mask_cfg, batch, _EPOCHS.value)))
      runs["a_prepared_shards_bertjax"].append(
          _timed(lambda: _masked_batches(prepared, mask_cfg, batch, _EPOCHS.value)))
      runs["b_raw_text_bertjax"].append(_timed(lambda: ours_raw(i)))
      runs["b_raw_text_hf"].append(_timed(lambda: _hf(sentences, *hf_tools, seq, batch)))
  results = {"seq": seq, "batch": batch, "cores": 1, "passes": _PASSES.value,
             "sentences": len(sentences), "words": len(words),
             "distinct_word_share": round(len(set(words)) / len(words), 4)}
  results.update({k: _median(v) for k, v in runs.items()})
  speedups = [o["examples_per_cpu_s"] / h["examples_per_cpu_s"]
              for o, h in zip(runs["b_raw_text_bertjax"], runs["b_raw_text_hf"])]
  results["b_speedup_over_hf"] = round(sorted(speedups)[len(speedups) // 2], 2)
  results["b_speedup_over_hf_passes"] = [round(x, 2) for x in speedups]  # in run order
  print(json.dumps(results, indent=1))
