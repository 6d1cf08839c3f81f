"""Train a tokenizer with the special tokens the model configs expect.

  # BERT-style WordPiece, uncased (bert_base) or cased (--nolowercase):
  python -m bertjax.data.train_tokenizer --input='/data/en/*.txt' --kind=wordpiece \
      --vocab_size=30522 --output=/data/tok
  # XLM-R style SentencePiece (unigram or bpe) over languages mixed with q ~ p^alpha:
  python -m bertjax.data.train_tokenizer --languages='en=/data/en,sw=/data/sw' \
      --kind=sentencepiece --model_type=unigram --character_coverage=0.9995 \
      --alpha=0.3 --vocab_size=250002 --output=/data/tok
  # RoBERTa's (GPT-2's) byte-level BPE, cased:
  python -m bertjax.data.train_tokenizer --input='/data/en/*.txt' --kind=byte_level_bpe \
      --vocab_size=50265 --nolowercase --output=/data/tok

WordPiece: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4 (configs/bert_*.py, pad 0).
SentencePiece: <s>=0 <pad>=1 </s>=2 <unk>=3 ... <mask> last (configs/xlmr_*.py, pad 1).
Byte-level BPE: <s>=0 <pad>=1 </s>=2 <unk>=3, bytes, merges, <mask> last
(configs/roberta_base.py, pad 1; Hugging Face's RobertaTokenizer gives the same ids).
The output directory is read by `--config.data.tokenizer.path` and `load_tokenizer`.
"""

from __future__ import annotations

import time

from absl import flags
import ml_collections

from bertjax.console import cli
from bertjax.console import progress
from bertjax import writes
from bertjax.data import mixture, multilingual, sources
from bertjax.data import tokenizer as tok_lib


def train(input_spec: str, languages: str, output: str, *, kind: str, vocab_size: int,
          lowercase: bool, model_type: str, character_coverage: float, alpha: float,
          language_counts: str, seed: int, text_field: str,
          line_breaks: str = "space", sample_sentences: int = mixture.SAMPLE_SENTENCES,
          read_sentences: int = mixture.READ_SENTENCES, overwrite: bool = False) -> dict:
  """Trains and saves the tokenizer on a sample of the corpus
  (`mixture.tokenizer_sentences`) into `output`, whole (`writes.export_dir`: not the
  input nor inside it; a non-empty `output` only with `overwrite`, checked before the
  corpus is read); returns a summary (sentences, vocab, ids, seconds)."""
  with writes.export_dir(output, overwrite, {"--input": input_spec},
                         flag="--output") as out:
    return _train(input_spec, languages, out, kind=kind, vocab_size=vocab_size,
                  lowercase=lowercase, model_type=model_type,
                  character_coverage=character_coverage, alpha=alpha,
                  language_counts=language_counts, seed=seed, text_field=text_field,
                  line_breaks=line_breaks, sample_sentences=sample_sentences,
                  read_sentences=read_sentences)


def _train(input_spec: str, languages: str, output: str, *, kind: str, vocab_size: int,
           lowercase: bool, model_type: str, character_coverage: float, alpha: float,
           language_counts: str, seed: int, text_field: str, line_breaks: str,
           sample_sentences: int, read_sentences: int) -> dict:
  start = time.perf_counter()
  data_cfg = ml_collections.ConfigDict({"corpus": input_spec, "languages": languages,
                                        "language_alpha": alpha,
                                        "language_counts": language_counts,
                                        "text_field": text_field,
                                        "line_breaks": line_breaks,
                                        "tokenizer": {"sample_sentences": sample_sentences,
                                                      "read_sentences": read_sentences}})
  sentences = mixture.tokenizer_sentences(data_cfg, seed)
  counted = progress.Progress("tokenizer", len(sentences), "sentences").wrap(sentences)
  tok = tok_lib.train_tokenizer(counted, kind=kind, vocab_size=vocab_size,
                                lowercase=lowercase, model_type=model_type,
                                character_coverage=character_coverage)
  tok.save(output)
  return {"sentences": len(sentences), "vocab_size": tok.vocab_size,
          "pad_id": tok.pad_id, "cls_id": tok.cls_id, "sep_id": tok.sep_id,
          "mask_id": tok.mask_id, "seconds": round(time.perf_counter() - start, 2)}


def main(argv):
  del argv
  f = flags.FLAGS
  summary = train(f.input or "", f.languages, f.output, kind=f.kind,
                  vocab_size=f.vocab_size, lowercase=f.lowercase, model_type=f.model_type,
                  character_coverage=f.character_coverage, alpha=f.alpha,
                  language_counts=f.language_counts, seed=f.seed, text_field=f.text_field,
                  line_breaks=f.line_breaks, sample_sentences=f.sample_sentences,
                  read_sentences=f.read_sentences, overwrite=f.overwrite)
  print(" | ".join(f"{k} {v}" for k, v in summary.items()))


if __name__ == "__main__":
  # Defined only when run as a program, so importing the module defines no flags.
  flags.DEFINE_string("input", None, "Corpus: file, glob, directory (text, JSON lines, "
                      ".gz, .zst, Parquet, Arrow, a datasets directory; local or gs://), "
                      "tfds:NAME, embedded, or a mixture 'NAME:WEIGHT=SPEC,...' (sentences "
                      "drawn by weight).")
  flags.DEFINE_string("languages", "", "Instead of --input: 'en=SPEC,sw=SPEC,...'.")
  flags.DEFINE_float("alpha", 0.3, "Language sampling exponent: q_i ~ p_i^alpha.")
  flags.DEFINE_enum("language_counts", "sentences", list(multilingual.COUNTS),
                    "p_i counts each language's sentences, tokens or characters.")
  flags.DEFINE_enum("kind", "wordpiece", list(tok_lib.KINDS), "Tokenizer kind.")
  flags.DEFINE_enum("model_type", "unigram", ["unigram", "bpe"], "SentencePiece model.")
  flags.DEFINE_integer("vocab_size", 30522, "Vocabulary size (special tokens included).")
  flags.DEFINE_bool("lowercase", True, "Uncased (--nolowercase: cased).")
  flags.DEFINE_float("character_coverage", 0.9995, "SentencePiece character coverage.")
  flags.DEFINE_integer("seed", 0, "Seed of the language sampling.")
  flags.DEFINE_string("text_field", "text", "JSON-lines / TFDS text key, Parquet / "
                      "Arrow text column.")
  flags.DEFINE_enum("line_breaks", "space", list(sources.LINE_BREAKS), "A line break "
                    "inside a document: a space (lines as running text) or 'apart' "
                    "(each line tokenized alone; config.data.line_breaks).")
  flags.DEFINE_integer("sample_sentences", mixture.SAMPLE_SENTENCES, "Sentences trained on "
                       "per source, drawn uniformly from those read (0: all).")
  flags.DEFINE_integer("read_sentences", mixture.READ_SENTENCES, "Sentences read per source "
                       "at most, streamed (0: all).")
  flags.DEFINE_string("output", None, "Directory to write the tokenizer to (new or empty).")
  flags.DEFINE_bool("overwrite", False, "--output may hold files: the tokenizer's replace "
                    "theirs (bertjax.writes).")
  flags.mark_flags_as_required(["output"])
  cli.run(main)
