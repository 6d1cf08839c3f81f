"""Contextual embeddings from any bertjax workdir or Hugging Face encoder dir (BERT,
RoBERTa, XLM-R, ModernBERT).

    python -m bertjax.embed --checkpoint=DIR --input=texts.txt --out=vectors.npz \
        [--level=word|token|sentence] [--layers=last|mean4|sum4|concat4|K] [--pool=...]
    python -m bertjax.embed stats --checkpoint=DIR --input=corpus.txt --out=stats.npz
    python -m bertjax.embed similarity --checkpoint=DIR --sentence1=.. --word1=.. \
        --sentence2=.. --word2=.. [--standardize=stats.npz]
    python -m bertjax.embed wsd --checkpoint=DIR --train=FILE --test=FILE
    python -m bertjax.embed plot --checkpoint=DIR --word=WORD --input=FILE --out=plot.png
    python -m bertjax.embed encode --checkpoint=MODEL --input=texts.txt --kind=query \
        --out=vectors.npy

`extract` (the default subcommand) writes an .npz: `vectors` [N, D] float32, and for
each row `text_index` (its input line), `position` (its token / word index in that
text) and `items` (the token or word; the text for sentences). Inputs: text files with
one text a line, JSON lines with a "text" (or "sentence") field, or `embedded` (the
sentences of the corpus that ships with Python, see `bertjax.data.sources`); texts longer than
--max_length are windowed with --overlap tokens shared, not truncated. `stats` writes
the corpus mean / std of the token vectors (for --standardize) and prints the
anisotropy and rogue dimensions before and after z-scoring. `wsd` and `plot` read
sense-labelled JSON lines or SemCor-style XML (see `bertjax.embeddings.wsd`); `plot`
also takes plain text (every occurrence of --word, no senses). `encode` writes the
sentence embeddings [N, E] float32 (.npy) of an embedding model (a retrieval workdir,
a sentence-transformers folder, or any checkpoint with mean pooling:
`bertjax.tasks.embedding.load_encoder`), each text as --kind ('query' or 'document':
its prompt), in batches with a progress bar; of a sparse model (a 'sparse' workdir, a
`SparseEncoder` folder: `bertjax.tasks.sparse`), a CSR matrix [N, V] (.npz, read by
`scipy.sparse.load_npz`), each vector cut to --max_active_dims entries when given; of a
multi-vector model (a 'colbert' workdir, a `MultiVectorEncoder` folder:
`bertjax.tasks.colbert`), each text's scored token vectors (.npz: `vectors` [tokens,
dim] float32, text i's rows offsets[i]:offsets[i + 1] of them).
"""

from __future__ import annotations

import json
import os

from absl import app, flags
import numpy as np
import scipy.sparse

from bertjax import writes
from bertjax.checkpoint.pretrained import load_pretrained
from bertjax.data import sources
from bertjax.embeddings import analysis, extract, plot, wsd
from bertjax.tasks import colbert, embedding, sparse
from bertjax.console import cli
from bertjax.errors import ConfigError, DataError

COMMANDS = ("extract", "stats", "similarity", "wsd", "plot", "encode")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "bertjax workdir or Hugging Face "
                                  "model dir.")
_INPUT = flags.DEFINE_string("input", None, "Texts (a line each, or JSON lines), "
                             "vectors .npz (stats), or sense-labelled examples (plot).")
_OUT = flags.DEFINE_string("out", None, "Output .npz (extract, stats) or .png (plot).")
_LAYERS = flags.DEFINE_string("layers", "last", "last | mean4 | sum4 | concat4 (the last "
                              "four layers) | an integer (0 = embeddings, -1 = last).")
_LEVEL = flags.DEFINE_enum("level", "word", ["token", "word", "sentence"],
                           "extract: one vector per subword, per word or per text.")
_POOL = flags.DEFINE_string("pool", None, "Words: first | mean (default mean). "
                            "Sentences: cls | mean (default cls).")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Windows per batch (rounded up to a "
                              "multiple of the device count).")
_MAX_LENGTH = flags.DEFINE_integer("max_length", 512, "Tokens per window, specials "
                                   "included.")
_OVERLAP = flags.DEFINE_integer("overlap", 128, "Tokens shared by consecutive windows.")
_STANDARDIZE = flags.DEFINE_string("standardize", None, "Statistics .npz from `stats`: "
                                   "z-score the vectors with them.")
_NUM_PAIRS = flags.DEFINE_integer("num_pairs", 20000, "stats: random pairs for the "
                                  "anisotropy estimate.")
_MAX_TEXTS = flags.DEFINE_integer("max_texts", 0, "Use only the first N input texts "
                                  "(0: all).")
_TOP = flags.DEFINE_integer("top", 5, "stats: how many rogue dimensions to list.")
_SENTENCES = [flags.DEFINE_string(f"sentence{k}", None, f"similarity: sentence {k}.")
              for k in (1, 2)]
_WORDS = [flags.DEFINE_string(f"word{k}", None, f"similarity: the word in sentence {k}.")
          for k in (1, 2)]
_TRAIN = flags.DEFINE_string("train", None, "wsd: sense-labelled training examples.")
_TEST = flags.DEFINE_string("test", None, "wsd: sense-labelled test examples.")
_WORD = flags.DEFINE_string("word", None, "plot: the word (or lemma) to plot.")
_SIZE = flags.DEFINE_string("size", "800x600", "plot: WIDTHxHEIGHT in pixels.")
_ANNOTATE = flags.DEFINE_integer("annotate", 6, "plot: how many points get their "
                                 "sentence written next to them.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing --out file.")
_MAX_ACTIVE_DIMS = flags.DEFINE_integer("max_active_dims", 0, "encode, a sparse model: "
                                        "keep each vector's N largest entries (0: all).")
_KIND = flags.DEFINE_enum("kind", "document", list(embedding.KINDS), "encode: the texts "
                          "are queries or documents (the model's prompt of that kind).")


def read_texts(path: str, limit: int = 0) -> list[str]:
  """Non-blank lines of a text file, the "text" / "sentence" of each JSON line, or
  the sentences of the embedded corpus (path 'embedded'); the first `limit` if > 0."""
  if path == sources.EMBEDDED:
    return [s for doc in sources.load_documents(path) for s in doc][:limit or None]
  if not path or not os.path.isfile(path):
    raise DataError(f"input file {path} does not exist; give --input=FILE.")
  with open(path, encoding="utf-8") as f:
    lines = [line.rstrip("\n") for line in f if line.strip()]
  if path.endswith(".jsonl"):
    rows = [_json_line(line, f"{path} text {n}") for n, line in enumerate(lines, 1)]
    if not all(isinstance(r, dict) and ("text" in r or "sentence" in r) for r in rows):
      raise DataError(f"{path}: every JSON line needs a \"text\" or \"sentence\" field.")
    lines = [r.get("text", r.get("sentence")) for r in rows]
  if not lines:
    raise DataError(f"{path} holds no text.")
  return lines[:limit or None]


def _json_line(line: str, where: str):
  try:
    return json.loads(line)
  except json.JSONDecodeError as e:
    raise DataError(f"{where} is not JSON ({e.msg}).") from e


def extract_arrays(embedder: extract.Embedder, texts: list[str], level: str,
                   pool: str | None = None,
                   standardizer: analysis.Standardizer | None = None
                   ) -> dict[str, np.ndarray]:
  """The arrays `extract` saves: vectors [N, D], text_index, position, items [N]."""
  if level == "sentence":
    vectors = embedder.sentences(texts, pool or "cls")
    rows = [(i, 0, t) for i, t in enumerate(texts)]
  else:
    found = (embedder.tokens(texts) if level == "token"
             else [v[:2] for v in embedder.words(texts, pool=pool or "mean")])
    vectors = np.concatenate([v for v, _ in found]) if found else np.zeros((0, 0))
    rows = [(i, p, item) for i, (_, items) in enumerate(found)
            for p, item in enumerate(items)]
  if standardizer is not None:
    vectors = standardizer(vectors)
  return {"vectors": vectors.astype(np.float32),
          "text_index": np.array([r[0] for r in rows], np.int64),
          "position": np.array([r[1] for r in rows], np.int64),
          "items": np.array([r[2] for r in rows], dtype=str)}


def _require(**named) -> None:
  missing = [f"--{k}" for k, v in named.items() if not v]
  if missing:
    raise ConfigError(f"this subcommand needs {' and '.join(missing)}.")


def _output(ext: str = ""):
  """`writes.output_file` of --out (with `ext` appended where numpy appends it): not one
  of the inputs nor inside the checkpoint, an existing one replaced only with
  --overwrite; checked before anything is computed."""
  inputs = {"--input": _INPUT.value, "--checkpoint": _CHECKPOINT.value,
            "--standardize": _STANDARDIZE.value}
  writes.check_not_input(_OUT.value, inputs)  # as given, before numpy's extension
  out = _OUT.value if not ext or _OUT.value.endswith(ext) else _OUT.value + ext
  return writes.output_file(out, _OVERWRITE.value, inputs)


def _embedder() -> extract.Embedder:
  _require(checkpoint=_CHECKPOINT.value)
  return extract.Embedder(load_pretrained(_CHECKPOINT.value), _LAYERS.value,
                          _BATCH.value, _MAX_LENGTH.value, _OVERLAP.value, progress=True)


def _standardizer() -> analysis.Standardizer | None:
  return analysis.Standardizer.load(_STANDARDIZE.value) if _STANDARDIZE.value else None


def _extract() -> None:
  _require(input=_INPUT.value, out=_OUT.value)
  with _output(".npz") as out:
    texts = read_texts(_INPUT.value, _MAX_TEXTS.value)
    arrays = extract_arrays(_embedder(), texts, _LEVEL.value, _POOL.value, _standardizer())
    np.savez(out, **arrays, level=_LEVEL.value, layers=_LAYERS.value,
             checkpoint=_CHECKPOINT.value)
  print(f"wrote {_OUT.value}: {arrays['vectors'].shape[0]} {_LEVEL.value} vectors of "
        f"size {arrays['vectors'].shape[1]} from {len(texts)} texts")


def _stats() -> None:
  _require(input=_INPUT.value, out=_OUT.value)
  with _output(".npz") as out:
    if _INPUT.value.endswith(".npz"):
      with np.load(_INPUT.value) as f:
        if "vectors" not in f:
          raise DataError(f"{_INPUT.value} holds no 'vectors'; write it with "
                          "`python -m bertjax.embed --level=token`.")
        vectors = f["vectors"]
    else:
      found = _embedder().tokens(read_texts(_INPUT.value, _MAX_TEXTS.value))
      vectors = np.concatenate([v for v, _ in found])
    standardizer = analysis.Standardizer.fit(vectors)
    standardizer.save(out)
  rep = analysis.report(vectors, standardizer, _TOP.value, _NUM_PAIRS.value)
  print(f"wrote {_OUT.value}: mean/std of {rep['num_vectors']} vectors of size "
        f"{rep['dimensions']}")
  for when in ("raw", "standardized"):
    rogue = ", ".join(f"{d} ({share:.0%})" for d, _, share in rep[f"rogue_dimensions_{when}"])
    print(f"{when:>12}: anisotropy {rep[f'anisotropy_{when}']:.4f}; top dimensions by "
          f"share of the expected cosine: {rogue}")


def _similarity() -> None:
  _require(sentence1=_SENTENCES[0].value, word1=_WORDS[0].value,
           sentence2=_SENTENCES[1].value, word2=_WORDS[1].value)
  sentences = [s.value for s in _SENTENCES]
  spans = [extract.find_word(s, w.value) for s, w in zip(sentences, _WORDS)]
  vectors = _embedder().targets(sentences, spans, _POOL.value or "mean")
  print(f"cosine raw {float(analysis.cosine(vectors[0], vectors[1])):.4f}")
  standardizer = _standardizer()
  if standardizer is not None:
    z = standardizer(vectors)
    print(f"cosine standardized {float(analysis.cosine(z[0], z[1])):.4f}")


def _wsd() -> None:
  _require(train=_TRAIN.value, test=_TEST.value)
  train, test = wsd.read_examples(_TRAIN.value), wsd.read_examples(_TEST.value)
  result = wsd.evaluate(_embedder(), train, test, _POOL.value or "mean", _standardizer())
  print(f"1-NN accuracy {result['accuracy']:.4f}  most-frequent-sense "
        f"{result['mfs_accuracy']:.4f}  ({result['num_test']} test, "
        f"{result['num_train']} train, coverage {result['coverage']:.2f})")


def occurrences(path: str, word: str) -> tuple[list[str], list[extract.Span], list[str] | None]:
  """Sentences, target spans and senses (None for plain text) of `word` in `path`."""
  if path.endswith((".xml", ".jsonl")) and not _is_plain_jsonl(path):
    chosen = [x for x in wsd.read_examples(path)
              if word.lower() in (x.lemma.lower(), x.sentence[slice(*x.span)].lower())]
    return ([x.sentence for x in chosen], [x.span for x in chosen],
            [x.sense for x in chosen])
  sentences, spans = [], []
  for text in read_texts(path, _MAX_TEXTS.value):
    for span in extract.find_all(text, word):
      sentences.append(text)
      spans.append(span)
  return sentences, spans, None


def _is_plain_jsonl(path: str) -> bool:
  """JSON lines without sense labels (texts only)."""
  if not path.endswith(".jsonl"):
    return False
  with open(path, encoding="utf-8") as f:
    first = next((line for line in f if line.strip()), "{}")
  return "sense" not in _json_line(first, f"{path}'s first line")


def _plot() -> None:
  _require(word=_WORD.value, input=_INPUT.value, out=_OUT.value)
  try:
    size = tuple(int(x) for x in _SIZE.value.lower().split("x"))
  except ValueError:
    size = ()
  if len(size) != 2 or min(size) < 100:
    raise ConfigError(f"--size={_SIZE.value!r}: give WIDTHxHEIGHT in pixels, each >= 100.")
  with _output() as out:
    sentences, spans, senses = occurrences(_INPUT.value, _WORD.value)
    plot.sense_plot(_embedder(), sentences, spans, out, senses,
                    title=f"'{_WORD.value}': {len(sentences)} occurrences, layers "
                          f"{_LAYERS.value}", size=size, annotate=_ANNOTATE.value,
                    pool=_POOL.value or "mean", standardizer=_standardizer())
  print(f"wrote {_OUT.value}: {len(sentences)} occurrences of {_WORD.value!r}"
        + (f", {len(set(senses))} senses" if senses else ""))


def _encode_length() -> int:
  """encode's cut: --max_length where given, else 0 (the model's own length)."""
  return _MAX_LENGTH.value if _MAX_LENGTH.present else 0


def _encode() -> None:
  _require(checkpoint=_CHECKPOINT.value, input=_INPUT.value, out=_OUT.value)
  if sparse.is_sparse(_CHECKPOINT.value):
    return _encode_sparse()
  late = colbert.is_colbert(_CHECKPOINT.value)
  if _MAX_ACTIVE_DIMS.value:
    raise ConfigError(f"--max_active_dims: {_CHECKPOINT.value} is a "
                      f"{'multi-vector' if late else 'dense embedding'} model; the flag cuts "
                      "a sparse model's vectors.")
  if late:
    return _encode_tokens()
  with _output(".npy") as out:
    texts = read_texts(_INPUT.value, _MAX_TEXTS.value)
    encoder = embedding.load_encoder(_CHECKPOINT.value, _encode_length())
    vectors = encoder.encode(texts, _KIND.value, _BATCH.value, show="encode")
    np.save(out, vectors)
  print(f"wrote {_OUT.value}: {vectors.shape[0]} x {vectors.shape[1]} embeddings "
        f"({encoder.settings.pooling} pooling"
        f"{', normalised' if encoder.settings.normalize else ''})")


def _encode_sparse() -> None:
  """A sparse model's vectors as a CSR matrix (.npz: `scipy.sparse.load_npz`)."""
  if _MAX_ACTIVE_DIMS.value < 0:
    raise ConfigError(f"--max_active_dims={_MAX_ACTIVE_DIMS.value}: use 0 (every active "
                      "entry) or a positive count.")
  with _output(".npz") as out:
    texts = read_texts(_INPUT.value, _MAX_TEXTS.value)
    encoder = sparse.load_encoder(_CHECKPOINT.value, _encode_length())
    matrix = sparse.encode_csr(encoder, texts, _KIND.value, _BATCH.value,
                               _MAX_ACTIVE_DIMS.value, show="encode")
    scipy.sparse.save_npz(out, matrix)
  print(f"wrote {_npz_out()}: {matrix.shape[0]} x {matrix.shape[1]} sparse vectors (CSR), "
        f"{matrix.nnz / max(matrix.shape[0], 1):.1f} active dimensions a text")


def _npz_out() -> str:
  """--out as numpy writes it: with .npz appended where it has none."""
  return _OUT.value if _OUT.value.endswith(".npz") else _OUT.value + ".npz"


def _encode_tokens() -> None:
  """A multi-vector model's token matrices, concatenated (.npz: vectors, offsets)."""
  with _output(".npz") as out:
    texts = read_texts(_INPUT.value, _MAX_TEXTS.value)
    encoder = colbert.load_encoder(_CHECKPOINT.value, _encode_length())
    matrices = encoder.encode(texts, _KIND.value, _BATCH.value, show="encode")
    offsets = np.concatenate([[0], np.cumsum([len(m) for m in matrices])]).astype(np.int64)
    np.savez(out, vectors=np.concatenate(matrices), offsets=offsets)
  print(f"wrote {_npz_out()}: {len(matrices)} texts, {offsets[-1]} token vectors of "
        f"{matrices[0].shape[1]} dimensions (MaxSim)")


def main(argv):
  command = argv[1] if len(argv) > 1 else "extract"
  if command not in COMMANDS or len(argv) > 2:
    raise app.UsageError(f"usage: python -m bertjax.embed [{' | '.join(COMMANDS)}] "
                         f"--flags; got {argv[1:]}.")
  {"extract": _extract, "stats": _stats, "similarity": _similarity, "wsd": _wsd,
   "plot": _plot, "encode": _encode}[command]()


if __name__ == "__main__":
  cli.run(main)
