"""Tokenizers: WordPiece (BERT), byte-level BPE (RoBERTa) and SentencePiece (XLM-R,
DeBERTa-v2 / v3).

One interface, `Tokenizer`, over two well-kept libraries: `tokenizers` (WordPiece, BPE,
any `tokenizer.json`) and `sentencepiece` (`.model` files in one of two layouts: XLM-R's,
with fairseq's id mapping <s>=0 <pad>=1 </s>=2 <unk>=3, spm piece id + 1, <mask> = last
id; or DeBERTa's spm.model, whose pieces hold [PAD] [CLS] [SEP] [UNK] themselves: ids
are the pieces', [MASK] the piece of that name or the id after the last piece, as
transformers' DebertaV2Tokenizer adds it). Inputs are built the way Hugging Face's
tokenizers build them: BERT (and DeBERTa) `[CLS] a [SEP] b [SEP]` with token types
0/1, RoBERTa / XLM-R `<s> a </s></s> b </s>` with token types all 0, longest-first
truncation and right padding to the longest row of the batch. A tokenizer.json with
neither [CLS] nor <s> (EuroBERT's Llama-3 BPE: <|begin_of_text|> <|end_of_text|>
<|mask|>, no unk) has the 'template' style: its inputs as its post-processor's template
(TemplateProcessing) lays them out, its pad / mask / unk named by tokenizer_config.json
(`bertjax.data.templates.Layout`).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm
import tokenizers
from etils import epath
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from bertjax.data import sentencepiece_layouts, sources
from bertjax.data.hf_backend import HFBackend
from bertjax.data.templates import TEMPLATE, Layout, Part, layout_of
from bertjax.data.sentencepiece_layouts import SENTENCEPIECE_FILE, SPM_FILE
from bertjax.errors import ConfigError, DataError

_BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # pad unk cls sep mask
_ROBERTA_SPECIALS = ("<pad>", "<unk>", "<s>", "</s>", "<mask>")
_FAIRSEQ_ORDER = ("<s>", "<pad>", "</s>", "<unk>")  # ids 0..3 of RoBERTa and XLM-R


class Tokenizer:
  """Text -> model inputs, with the special-token layout of `style`.

  style: 'bert' ([CLS] a [SEP] b [SEP], token types 0/1), 'roberta'
  (<s> a </s></s> b </s>, token types all 0) or 'template' (as `layout`, read from a
  tokenizer.json's post-processor: `Layout`).
  """

  def __init__(self, backend: HFBackend | sentencepiece_layouts.SentencePieceBackend,
               style: str, layout: Layout | None = None):
    self._backend = backend
    self.style = style
    self.vocab_size = backend.vocab_size
    self.layout = layout
    if style == TEMPLATE:
      if layout is None:
        raise DataError("a 'template' tokenizer needs its Layout.")
      self.pad_id, self.unk_id, self.mask_id = layout.pad_id, layout.unk_id, layout.mask_id
      self.cls_id, self.sep_id = layout.cls_id, layout.sep_id
      self.special_ids = layout.special_ids
      self.mask_token = backend.id_to_token(self.mask_id)
      return
    names = _BERT_SPECIALS if style == "bert" else _ROBERTA_SPECIALS
    ids = [backend.token_to_id(t) for t in names]
    missing = [t for t, i in zip(names, ids) if i is None]
    if missing:
      raise DataError(f"tokenizer vocabulary lacks the special tokens {missing}.")
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = ids
    self.special_ids = frozenset(ids)
    self.mask_token = names[4]

  def tokenize(self, text: str) -> list[int]:
    """Ids of `text`, without special tokens."""
    return self.tokenize_batch([text])[0]

  def tokenize_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Ids of each text (batched in the library), without special tokens. Lone
    surrogates (which the libraries refuse) are read as U+FFFD."""
    texts = list(texts)
    try:
      return self._backend.encode_batch(texts)
    except TypeError:  # not a str, or a str that is not valid Unicode
      bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
      if bad:
        raise DataError(f"the tokenizer takes text (str), got {bad[0]}.") from None
      return self._backend.encode_batch([sources.repair_unicode(t) for t in texts])

  def tokenize_units(self, documents: Sequence[Sequence[str]]
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Ids of every unit of `documents` (each a list of texts), flat: (ids int32 [N],
    lengths int64 [units]); the same ids as `tokenize_batch` of the units in order, in
    the arrays stage 1 of prepare writes (no list a unit). Lone surrogates as there."""
    try:
      return self._backend.encode_units(documents)
    except TypeError:  # not a str, or a str that is not valid Unicode
      bad = [type(t).__name__ for d in documents for t in d if not isinstance(t, str)]
      if bad:
        raise DataError(f"the tokenizer takes text (str), got {bad[0]}.") from None
      return self._backend.encode_units(
          [[sources.repair_unicode(t) for t in d] for d in documents])

  def num_special(self, pair: bool) -> int:
    """How many special tokens `build_inputs` adds to a single text or a pair."""
    if self.style == TEMPLATE:
      return sum(len(ids) for _, ids, _ in self._template(pair))
    if not pair:
      return 2
    return 3 if self.style == "bert" else 4

  def build_inputs(self, ids_a: Sequence[int], ids_b: Sequence[int] | None = None
                   ) -> tuple[list[int], list[int]]:
    """Adds the special tokens; returns (input ids, token type ids)."""
    if self.style == TEMPLATE:
      ids, types = [], []
      for part, special, type_id in self._template(ids_b is not None):
        piece = ids_a if part == "A" else ids_b if part == "B" else special
        ids.extend(piece)
        types.extend([type_id] * len(piece))
      return ids, types
    a = [self.cls_id, *ids_a, self.sep_id]
    if ids_b is None:
      return a, [0] * len(a)
    if self.style == "bert":
      b = [*ids_b, self.sep_id]
      return a + b, [0] * len(a) + [1] * len(b)
    ids = a + [self.sep_id, *ids_b, self.sep_id]
    return ids, [0] * len(ids)

  def _template(self, pair: bool) -> tuple[Part, ...]:
    if not pair:
      return self.layout.single
    if self.layout.pair is None:
      raise DataError(
          "the tokenizer's post-processor template gives text pairs no special tokens "
          "($A $B), so bertjax cannot lay out pairs as transformers does: give its "
          "tokenizer.json's TemplateProcessing a pair template (e.g. "
          "'<|begin_of_text|> $A <|end_of_text|> $B:1 <|end_of_text|>:1').")
    return self.layout.pair

  def __call__(self, texts: str | Sequence[str],
               text_pairs: str | Sequence[str] | None = None,
               max_length: int = 512) -> dict[str, np.ndarray]:
    """Batch of model inputs: `input_ids`, `token_type_ids`, `attention_mask`, each
    int32 [B, T] with T the longest row (at most `max_length`), right-padded."""
    if isinstance(texts, str):
      texts = [texts]
    if isinstance(text_pairs, str):
      text_pairs = [text_pairs]
    special = self.num_special(text_pairs is not None)
    if max_length < special + 1:
      raise ConfigError(f"max_length={max_length} leaves no room for text next to the "
                        f"{special} special tokens; use at least {special + 1}.")
    ids_a = self.tokenize_batch(texts)
    if text_pairs is None:
      budget = max_length - self.num_special(False)
      rows = [self.build_inputs(a[:budget]) for a in ids_a]
    else:
      if len(text_pairs) != len(texts):
        raise DataError(f"got {len(texts)} texts but {len(text_pairs)} text pairs.")
      budget = max_length - self.num_special(True)
      rows = [self.build_inputs(*truncate_longest_first(a, b, budget))
              for a, b in zip(ids_a, self.tokenize_batch(text_pairs))]
    length = max(len(ids) for ids, _ in rows)
    batch = {k: np.zeros((len(rows), length), np.int32)
             for k in ("input_ids", "token_type_ids", "attention_mask")}
    batch["input_ids"][:] = self.pad_id
    for r, (ids, types) in enumerate(rows):
      batch["input_ids"][r, :len(ids)] = ids
      batch["token_type_ids"][r, :len(ids)] = types
      batch["attention_mask"][r, :len(ids)] = 1
    return batch

  @property
  def library(self) -> tokenizers.Tokenizer | bytes:
    """What the tokenizer is in its library: a `tokenizers.Tokenizer` (WordPiece, BPE,
    any tokenizer.json; not to be modified: `from_library` a changed copy), or a
    SentencePiece model's serialised proto (bytes). `from_library` inverts it."""
    backend = self._backend
    return backend.proto if isinstance(backend, sentencepiece_layouts.SentencePieceBackend) else backend.tok

  def id_to_token(self, i: int) -> str:
    t = self._backend.id_to_token(int(i))
    if t is None:
      raise DataError(f"token id {i} is outside the vocabulary (size {self.vocab_size}).")
    return t

  def token_to_id(self, t: str) -> int | None:
    """The id of token `t`; unk's when it is not one (None for a tokenizer without)."""
    i = self._backend.token_to_id(t)
    return self.unk_id if i is None else i

  def word_starts(self) -> np.ndarray:
    """[vocab] bool: True where a token begins a word (whole-word and span masking).

    WordPiece: every token except `##` continuations; SentencePiece: pieces starting
    with '▁'; byte-level BPE: tokens starting with 'Ġ' (whatever the special tokens'
    style: ModernBERT's BPE has BERT's [CLS] / [SEP]). Special tokens start words.
    """
    tokens = [self._backend.id_to_token(i) or "" for i in range(self.vocab_size)]
    if self._backend.wordpiece:
      starts = np.array([not t.startswith("##") for t in tokens])
    else:
      starts = np.array([t.startswith(("▁", "Ġ")) for t in tokens])
    starts[list(self.special_ids)] = True
    return starts

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`, padding and [CLS]/[SEP] (<s>/</s>) dropped."""
    drop = {self.pad_id, self.cls_id, self.sep_id}
    return self._backend.decode([int(i) for i in ids if int(i) not in drop])

  def save(self, directory: str) -> None:
    """Writes files that `load_tokenizer(directory)` reads back; `directory` may be a
    remote path (gs://...), written through a local copy."""
    if is_remote(directory):
      with tempfile.TemporaryDirectory() as local:
        self._save_local(local)
        _copy_files(epath.Path(local), epath.Path(directory))
      return
    os.makedirs(directory, exist_ok=True)
    self._save_local(directory)

  def _save_local(self, directory: str) -> None:
    self._backend.save(directory)
    if self.style == TEMPLATE:  # the parts its tokenizer.json does not name
      name = self._backend.id_to_token
      roles = {"bos_token": self.cls_id, "eos_token": self.sep_id, "pad_token": self.pad_id,
               "mask_token": self.mask_id, "unk_token": self.unk_id}
      with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast",
                   **{k: name(i) for k, i in roles.items() if i is not None}}, f, indent=2)


def check_same_vocabulary(given: Tokenizer, used: Tokenizer, given_name: str,
                          used_name: str, fix: str) -> None:
  """A one-line ConfigError naming `given_name` (a config field) unless `given` has the
  vocabulary of `used`, the tokenizer `used_name` (a checkpoint) was trained with: the
  same size and the same token at every id."""
  if given.vocab_size != used.vocab_size:
    raise ConfigError(f"{given_name} has {given.vocab_size} tokens but {used_name} was "
                      f"trained with a {used.vocab_size}-token tokenizer: {fix}.")

  def token(tok, i):
    try:
      return tok.id_to_token(i)
    except DataError:  # an id without a token (a gap in a tokenizer.json)
      return None

  for i in range(used.vocab_size):
    if token(given, i) != token(used, i):
      raise ConfigError(f"{given_name} differs from the tokenizer {used_name} was trained "
                        f"with (id {i}: {token(given, i)!r} vs {token(used, i)!r}): {fix}.")


def running_text(document: Sequence[str]) -> list[str]:
  """A document's sentences as its running text holds them: each after the first with
  the space before it that the sentence split (`sources.document_text`) took away.
  What every tokenizer of a document's sentences must be given
  (`builders.tokenize_documents`, `prepare`, tokenizer training): a byte-level BPE
  (RoBERTa's, ModernBERT's) makes another token of a word after a space ('ĠThe') than
  of a text's first word ('The'), so sentences tokenized without it would each start as
  no text does at inference (a paragraph given to fill_mask, fine-tuning, Hugging
  Face's tokenizer of the same text); WordPiece and SentencePiece ignore the space (the
  same ids)."""
  return [s if i == 0 else " " + s for i, s in enumerate(document)]


def unit_texts(document: Sequence[str], line_breaks: str = "space") -> list[str]:
  """The texts a document's units are tokenized as (config.data.line_breaks,
  `sources.LINE_BREAKS`): its sentences as running text ('space', `running_text`), or
  its lines each alone ('apart': a line's first word as a text's first word, as
  transformers' run_mlm.py tokenizes a text file's lines)."""
  return list(document) if line_breaks == "apart" else running_text(document)


def document_unit_texts(text: str, line_breaks: str = "space") -> list[str]:
  """`unit_texts` of a document given as its units joined by newlines
  (`sources.iter_document_texts`), in str methods: no Python step a unit."""
  return (text if line_breaks == "apart" else text.replace("\n", "\n ")).split("\n")


def is_remote(path) -> bool:
  """A path of a remote file system (gs://, s3://...) rather than a local one."""
  return "://" in os.fspath(path)


def _copy_files(src: epath.Path, dst: epath.Path) -> None:
  dst.mkdir(parents=True, exist_ok=True)
  for f in src.iterdir():
    if f.is_file():
      (dst / f.name).write_bytes(f.read_bytes())


def _local_copy(path: str) -> str:
  """A local copy of a remote tokenizer file or directory (the libraries read local
  files only); DataError when it does not exist."""
  src = epath.Path(path)
  if not src.exists():
    raise DataError(f"tokenizer path {path} does not exist.")
  local = epath.Path(tempfile.mkdtemp(prefix="bertjax-tokenizer-"))
  if src.is_dir():
    _copy_files(src, local)
    return os.fspath(local)
  (local / src.name).write_bytes(src.read_bytes())
  return os.fspath(local / src.name)


def truncate_longest_first(a: Sequence[int], b: Sequence[int], max_length: int
                           ) -> tuple[list[int], list[int]]:
  """Cuts the pair to `max_length` ids as Hugging Face's `tokenizers` does
  (longest_first): only the longer side when that suffices, else both to halves."""
  n1, n2 = len(a), len(b)
  if n1 + n2 <= max_length:
    return list(a), list(b)
  swap = n1 > n2
  if swap:
    n1, n2 = n2, n1
  n2 = n1 if n1 > max_length else max(n1, max_length - n1)
  if n1 + n2 > max_length:
    n1 = max_length // 2
    n2 = n1 + max_length % 2
  if swap:
    n1, n2 = n2, n1
  return list(a[:n1]), list(b[:n2])


def _style_of(backend) -> str | None:
  """'bert' or 'roberta' by the special tokens' names; None when neither fits."""
  if backend.token_to_id("[CLS]") is not None:
    return "bert"
  if backend.token_to_id("<s>") is not None:
    return "roberta"
  return None


def _add_specials(tok: tokenizers.Tokenizer, names: Sequence[str]) -> None:
  tok.add_special_tokens([
      tokenizers.AddedToken(t, special=True, lstrip=t == "<mask>", normalized=False)
      for t in names if tok.token_to_id(t) is not None])


def _bert_pipeline(tok: tokenizers.Tokenizer, lowercase: bool, strip_accents=None,
                   chinese_chars: bool = True) -> tokenizers.Tokenizer:
  tok.normalizer = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=chinese_chars, strip_accents=strip_accents,
      lowercase=lowercase)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece(prefix="##")
  return tok


def _from_vocab_txt(path: str, hf_config: dict) -> Tokenizer:
  with open(path, encoding="utf-8") as f:
    vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
  tok = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]",
                                              max_input_chars_per_word=100))
  _bert_pipeline(tok, hf_config.get("do_lower_case", True), hf_config.get("strip_accents"),
                 hf_config.get("tokenize_chinese_chars", True))
  _add_specials(tok, _BERT_SPECIALS)
  return Tokenizer(HFBackend(tok), "bert")


def _from_bpe(vocab_json: str, merges_txt: str) -> Tokenizer:
  tok = tokenizers.Tokenizer(models.BPE.from_file(vocab_json, merges_txt))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  _add_specials(tok, _ROBERTA_SPECIALS)
  return Tokenizer(HFBackend(tok), "roberta")


def _from_proto(proto: bytes, name: str) -> Tokenizer:
  """The Tokenizer of a SentencePiece model's bytes, in its layout's style."""
  try:
    backend = sentencepiece_layouts.SentencePieceBackend(proto)
  except RuntimeError as e:
    raise DataError(f"{name} is not a SentencePiece model ({str(e).splitlines()[0]}).")
  return Tokenizer(backend, "bert" if backend.bert else "roberta")


def _from_sentencepiece(path: str) -> Tokenizer:
  with open(path, "rb") as f:
    return _from_proto(f.read(), path)


def _from_tokenizer_json(path: str, hf_config: dict | None = None) -> Tokenizer:
  try:
    tok = tokenizers.Tokenizer.from_file(path)
  except Exception as e:  # the library raises a bare Exception on malformed JSON
    raise DataError(f"{path} is not a tokenizer.json ({str(e).splitlines()[0]}).")
  return from_library(tok, hf_config)


def from_library(tok: tokenizers.Tokenizer | bytes, hf_config: dict | None = None
                 ) -> Tokenizer:
  """The `Tokenizer` of a `tokenizers.Tokenizer` (its style from its special tokens:
  'bert', 'roberta', else 'template' with `layout_of(tok, hf_config)`) or of a
  SentencePiece model proto (bytes; XLM-R's ids): `Tokenizer.library`'s inverse (a
  'template' tokenizer's pad / mask / unk by `Layout`'s defaults, unless `hf_config`
  names them)."""
  if isinstance(tok, bytes):
    return Tokenizer(sentencepiece_layouts.SentencePieceBackend(tok), "roberta")
  backend = HFBackend(tok)
  style = _style_of(backend)
  if style is None:
    return Tokenizer(backend, TEMPLATE, layout_of(tok, hf_config))
  return Tokenizer(backend, style)


def lowercasing(tokenizer: Tokenizer) -> Tokenizer:
  """A copy of `tokenizer` that lower-cases every text first, as sentence-transformers'
  `do_lower_case` does (its Transformer module): tokenizers' Lowercase normaliser ahead
  of the tokenizer's own unless that is or holds one, so that special tokens written in
  a text ([SEP], <mask>) stay whole; a SentencePiece model's text between them alike."""
  library = tokenizer.library
  if isinstance(library, bytes):
    backend = sentencepiece_layouts.SentencePieceBackend(library, lowercase=True)
  else:
    tok = tokenizers.Tokenizer.from_str(library.to_str())
    norm = tok.normalizer
    own = (list(norm) if isinstance(norm, normalizers.Sequence) else [norm]
           if norm is not None else [])
    if not any(isinstance(n, normalizers.Lowercase) for n in own):
      tok.normalizer = normalizers.Sequence([normalizers.Lowercase(), *own])
    backend = HFBackend(tok)
  return Tokenizer(backend, tokenizer.style, tokenizer.layout)


def _hf_config(directory: str) -> dict:
  """A Hugging Face tokenizer folder's settings: special_tokens_map.json's names
  overridden by tokenizer_config.json's ({} when it has neither)."""
  config = {}
  for name in ("special_tokens_map.json", "tokenizer_config.json"):
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      try:
        with open(path, encoding="utf-8") as f:
          config.update(json.load(f))
      except (ValueError, TypeError) as e:
        raise DataError(f"{path} is not a JSON object ({e}).")
  return config


def load_tokenizer(path: str) -> Tokenizer:
  """Reads a vocab.txt, a SentencePiece .model, a tokenizer.json, or a directory
  holding one of them (Hugging Face model dirs included: tokenizer.json, vocab.txt
  with tokenizer_config.json's do_lower_case, sentencepiece.bpe.model, or
  vocab.json + merges.txt). A tokenizer.json with neither BERT's nor RoBERTa's special
  tokens (EuroBERT's Llama-3 BPE) is read by its post-processor's template and its
  folder's tokenizer_config.json (`Layout`)."""
  path = os.fspath(path)
  if is_remote(path):
    path = _local_copy(path)
  if not os.path.exists(path):
    raise DataError(f"tokenizer path {path} does not exist.")
  if os.path.isfile(path):
    if path.endswith(".json"):  # its folder's tokenizer_config.json names its specials
      return _from_tokenizer_json(path, _hf_config(os.path.dirname(path) or "."))
    if path.endswith(".model"):
      return _from_sentencepiece(path)
    if path.endswith(".txt"):
      return _from_vocab_txt(path, {})
    raise DataError(f"{path}: unrecognised tokenizer file; give a vocab.txt, a "
                    "SentencePiece .model or a tokenizer.json.")
  join = lambda name: os.path.join(path, name)
  hf_config = _hf_config(path)
  if os.path.isfile(join("tokenizer.json")):
    return _from_tokenizer_json(join("tokenizer.json"), hf_config)
  if os.path.isfile(join("vocab.txt")):
    return _from_vocab_txt(join("vocab.txt"), hf_config)
  spm_files = sorted(n for n in os.listdir(path) if n.endswith(".model"))
  if spm_files:
    return _from_sentencepiece(join(spm_files[0]))
  if os.path.isfile(join("vocab.json")) and os.path.isfile(join("merges.txt")):
    return _from_bpe(join("vocab.json"), join("merges.txt"))
  raise DataError(f"{path} holds no tokenizer (tokenizer.json, vocab.txt, a SentencePiece "
                  ".model, or vocab.json + merges.txt).")


# What train_tokenizer trains.
KINDS = ("wordpiece", "sentencepiece", "sentencepiece_bert", "byte_level_bpe")


def _continuing_pieces(tok: tokenizers.Tokenizer, texts: list[str]) -> list[str]:
  """'##c' for every character c that continues a word of `texts` as `tok` normalises
  and pre-tokenises them (the pieces WordPiece's trainer starts from), sorted."""
  chars = set()
  for text in texts:
    for word, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text)):
      chars.update(word[1:])
  return ["##" + c for c in sorted(chars)]


def train_tokenizer(texts: Iterable[str], kind: str = "wordpiece", vocab_size: int = 30522,
                    lowercase: bool = True, model_type: str = "unigram",
                    character_coverage: float = 0.9995) -> Tokenizer:
  """Trains a vocabulary of at most `vocab_size` ids on `texts`.

  kind='wordpiece': BERT-style WordPiece via `tokenizers` with [PAD]=0 [UNK]=1
  [CLS]=2 [SEP]=3 [MASK]=4. kind='sentencepiece': a SentencePiece `model_type`
  ('unigram' or 'bpe') model covering `character_coverage` of the characters, with
  XLM-R's ids (<s>=0 <pad>=1 </s>=2 <unk>=3, pieces, <mask> last).
  kind='sentencepiece_bert': the same with DeBERTa-v3's layout (its spm.model:
  [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3 as pieces, [MASK] after the last piece; inputs
  [CLS] a [SEP] b [SEP], token types 0 / 1).
  kind='byte_level_bpe': RoBERTa's (GPT-2's) byte-level BPE via `tokenizers`, with
  RoBERTa's ids (<s>=0 <pad>=1 </s>=2 <unk>=3, the 256 bytes and the merges, <mask>
  last); `lowercase` adds a lowercasing normalizer (RoBERTa is cased: pass False).
  """
  if kind == "byte_level_bpe":
    tok = tokenizers.Tokenizer(models.BPE())
    if lowercase:
      tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1, special_tokens=list(_FAIRSEQ_ORDER),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    _add_specials(tok, _FAIRSEQ_ORDER)
    tok.add_special_tokens([tokenizers.AddedToken("<mask>", special=True, lstrip=True,
                                                  normalized=False)])
    return Tokenizer(HFBackend(tok), "roberta")
  if kind == "wordpiece":
    texts = list(texts)
    tok = _bert_pipeline(tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]")), lowercase)
    # The trainer numbers the '##' pieces it creates in hash-map order, and ties between
    # merges are broken by those numbers: the vocabulary changed from run to run
    # (huggingface/tokenizers#1794). Given first, sorted, every '##' piece has its number
    # before training starts, and the training is deterministic.
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=[*_BERT_SPECIALS, *_continuing_pieces(tok, texts)])
    tok.train_from_iterator(texts, trainer)
    # The pieces were given as special tokens: rebuild them as ordinary vocabulary.
    tok = _bert_pipeline(tokenizers.Tokenizer(models.WordPiece(
        tok.get_vocab(), unk_token="[UNK]")), lowercase)
    _add_specials(tok, _BERT_SPECIALS)
    return Tokenizer(HFBackend(tok), "bert")
  if kind in ("sentencepiece", "sentencepiece_bert"):
    model = io.BytesIO()
    ids = (dict(vocab_size=vocab_size - 2, unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
           if kind == "sentencepiece" else
           dict(vocab_size=vocab_size - 1, pad_id=0, pad_piece="[PAD]", bos_id=1,
                bos_piece="[CLS]", eos_id=2, eos_piece="[SEP]", unk_id=3,
                unk_piece="[UNK]"))
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(texts), model_writer=model, model_type=model_type,
          hard_vocab_limit=False, character_coverage=character_coverage,
          normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
          minloglevel=2, **ids)
    except RuntimeError as e:
      raise DataError(f"SentencePiece training failed: {str(e).splitlines()[0]}")
    return _from_proto(model.getvalue(), "the trained model")
  raise DataError(f"train_tokenizer kind={kind!r}: use one of {list(KINDS)}.")
