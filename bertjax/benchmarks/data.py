"""`python -m bertjax.benchmark data`: input-pipeline throughput per CPU core.

  python -m bertjax.benchmark data --seq=128 --batch=32 --repeat=4

Both paths run in this one process (one core) on the same text (the embedded corpus,
`--repeat` times) and the same WordPiece vocabulary:
(a) pre-tokenized: packed [N, seq] examples -> the grain training stream (shuffle,
    batching, 80/10/10 masking of each whole batch) -> masked batches;
(b) raw text -> masked batches: bertjax (batched tokenization, packing, the stream of
    (a)) next to Hugging Face (`tokenizers` encode_batch, concatenate-and-chunk into
    rows of `seq`, `DataCollatorForLanguageModeling` with numpy tensors).
Reports examples/s and tokens/s per core for each, and (b)'s speed-up over HF.
"""

from __future__ import annotations

import json
import time

from absl import flags
import numpy as np

from bertjax.data import corpus, masking, pipeline, pretraining
from bertjax.data.tokenizer import train_tokenizer
from configs import bert_base

_SEQ = flags.DEFINE_integer("seq", 128, "Sequence length.")
_BATCH = flags.DEFINE_integer("batch", 32, "Examples per batch.")
_REPEAT = flags.DEFINE_integer("repeat", 4, "Copies of the embedded corpus in the text.")
_VOCAB = flags.DEFINE_integer("vocab_size", 8192, "WordPiece vocabulary trained first.")


def _rate(examples: int, tokens: int, seconds: float) -> dict[str, float]:
  return {"examples_per_s": round(examples / seconds, 1),
          "tokens_per_s": round(tokens / seconds, 1), "seconds": round(seconds, 3)}


def _masked_batches(examples, mask_cfg, batch: int) -> tuple[int, int]:
  """One pass of the grain stream over `examples`; (examples, real tokens) produced."""
  it = iter(pipeline.make_train_dataset(examples, mask_cfg, batch_size=batch, seed=0,
                                        nsp=False))
  n = tokens = 0
  for _ in range(len(examples) // batch):
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


def main(argv):
  del argv
  seq, batch = _SEQ.value, _BATCH.value
  documents = corpus.load_documents("embedded") * _REPEAT.value
  tok = train_tokenizer([s for d in documents for s in d], kind="wordpiece",
                        vocab_size=_VOCAB.value)
  data_cfg = bert_base.get_config().data
  data_cfg.max_seq_length = seq
  data_cfg.max_predictions_per_seq = int(np.ceil(0.15 * seq))
  mask_cfg = masking.MaskingConfig.create(data_cfg, tok)
  results = {"seq": seq, "batch": batch, "cores": 1}

  tokenized = pretraining.tokenize_documents(documents, tok)
  packed = pretraining.create_packed_examples(tokenized, tok, max_seq_length=seq)
  start = time.perf_counter()
  results["a_pretokenized_bertjax"] = _rate(*_masked_batches(packed, mask_cfg, batch),
                                            time.perf_counter() - start)

  start = time.perf_counter()
  packed = pretraining.create_packed_examples(
      pretraining.tokenize_documents(documents, tok), tok, max_seq_length=seq)
  results["b_raw_text_bertjax"] = _rate(*_masked_batches(packed, mask_cfg, batch),
                                        time.perf_counter() - start)
  sentences = [s for d in documents for s in d]
  hf_tools = _hf_tools(tok)
  start = time.perf_counter()
  results["b_raw_text_hf"] = _rate(*_hf(sentences, *hf_tools, seq, batch),
                                   time.perf_counter() - start)
  results["b_speedup_over_hf"] = round(results["b_raw_text_bertjax"]["examples_per_s"]
                                       / results["b_raw_text_hf"]["examples_per_s"], 2)
  print(json.dumps(results, indent=1))
