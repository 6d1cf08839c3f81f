"""The special-token layout of a tokenizer whose special tokens are neither BERT's nor
RoBERTa's (EuroBERT's Llama-3 BPE: <|begin_of_text|> <|end_of_text|> <|mask|>, no unk):
where its tokenizer.json's post-processor template places them in a single text's and a
pair's inputs, and which tokens pad, mask and stand for unknown text (`Layout`,
`layout_of`). `bertjax.data.tokenizer.Tokenizer` builds a 'template' style's inputs by
it."""

from __future__ import annotations

import dataclasses
import json
import re

import tokenizers

from bertjax.errors import DataError

TEMPLATE = "template"  # the style of a tokenizer placing its own names (`Layout`)
_MASK_NAMES = ("<|mask|>", "<mask>", "[MASK]")  # a mask token no config names

# A template's part: ('A' | 'B', (), type id) for a text's ids, ('special', ids, type
# id) for special tokens.
Part = tuple[str, tuple[int, ...], int]


@dataclasses.dataclass(frozen=True)
class Layout:
  """A 'template' tokenizer's special tokens: where its tokenizer.json's post-processor
  (TemplateProcessing, alone or in a Sequence) places them in a single text's and a
  pair's inputs, with their token type ids (EuroBERT's `<|begin_of_text|> $A
  <|end_of_text|>`), and which tokens pad, mask and stand for unknown text.

  The template's first and last special token of a single text are the row's [CLS] and
  [SEP] (bos / eos); a pair's template must begin and end with one special token each,
  A before B (what packing, pooling and SQuAD's spans rely on), or hold none at all
  (`$A $B`: the library's default when a tokenizer names no pair template; then pairs
  are refused, single texts work). pad, mask and unk are
  tokenizer_config.json's (special_tokens_map.json's); without one: pad the eos
  (EuroBERT's), mask the vocabulary's <|mask|> / <mask> / [MASK], unk the model's
  unk_token or none (byte-level BPE needs none: `Tokenizer.unk_id` None).
  """

  single: tuple[Part, ...]
  pair: tuple[Part, ...] | None  # None: the template gives pairs no special tokens
  pad_id: int
  mask_id: int
  unk_id: int | None
  special_ids: frozenset[int]  # every special token of the vocabulary (never masked)

  @property
  def cls_id(self) -> int:
    return self.single[0][1][0]

  @property
  def sep_id(self) -> int:
    return self.single[-1][1][0]


def _template_of(state: dict) -> dict | None:
  """The TemplateProcessing of a tokenizer.json's post-processor (alone or in a
  Sequence, as Llama-3's beside ByteLevel), or None."""
  post = state.get("post_processor") or {}
  for p in post.get("processors", []) if post.get("type") == "Sequence" else [post]:
    if (p or {}).get("type") == "TemplateProcessing":
      return p
  return None


def _parts(items: list, special_tokens: dict) -> tuple[Part, ...]:
  parts = []
  for item in items:
    (kind, spec), = item.items()
    if kind == "Sequence":
      parts.append((spec["id"], (), int(spec["type_id"])))
    else:
      parts.append(("special", tuple(special_tokens[spec["id"]]["ids"]), int(spec["type_id"])))
  return tuple(parts)


def _shape(parts: tuple[Part, ...]) -> str:
  """The template's parts as letters: A, B, s (a special token of one id), S (of
  several): 'sAs' for bos $A eos."""
  return "".join(("s" if len(ids) == 1 else "S") if p == "special" else p for p, ids, _ in parts)


def layout_of(tok: tokenizers.Tokenizer, hf_config: dict | None = None) -> Layout:
  """The `Layout` of a tokenizer.json whose special tokens are neither BERT's nor
  RoBERTa's: its post-processor's template, and pad / mask / unk as `hf_config`
  (tokenizer_config.json's `*_token` entries) names them (`Layout`'s defaults without).
  DataError (one line) when it has no template, one bertjax cannot lay rows out by, or
  no mask token."""
  state = json.loads(tok.to_str())
  template = _template_of(state)
  if template is None:
    raise DataError("tokenizer has neither [CLS] (BERT) nor <s> (RoBERTa) in its vocabulary, "
                    "nor a post-processor template (TemplateProcessing) placing its own special "
                    "tokens (EuroBERT's: <|begin_of_text|> $A <|end_of_text|>).")
  try:
    single = _parts(template["single"], template["special_tokens"])
    pair = _parts(template["pair"], template["special_tokens"])
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    raise DataError(f"tokenizer.json's post-processor template is malformed ({e!r}).")
  if _shape(pair) == "AB":  # no pair template given: pairs are refused when built
    pair = None
  if _shape(single) != "sAs" or not (pair is None or re.fullmatch(r"sA[sS]*Bs", _shape(pair))):
    show = lambda parts: " ".join(f"${p}" if p in "AB" else " ".join(map(tok.id_to_token, i))
                                  for p, i, _ in parts or ())
    raise DataError(
        f"tokenizer.json's post-processor template ({show(single)!r}; pair {show(pair)!r}) is "
        "not one bertjax lays rows out by: a single text between one special token each side "
        "(bos $A eos), a pair beginning and ending with one (bos $A ... $B eos).")
  config = hf_config or {}

  def named(key: str) -> int | None:
    value = config.get(key)
    value = value.get("content") if isinstance(value, dict) else value
    if value is None:
      return None
    i = tok.token_to_id(value)
    if i is None:
      raise DataError(f"tokenizer_config.json's {key} {value!r} is not in the vocabulary.")
    return i

  sep = single[-1][1][0]
  pad = named("pad_token")
  mask = named("mask_token")
  if mask is None:
    mask = next((tok.token_to_id(t) for t in _MASK_NAMES if tok.token_to_id(t) is not None),
                None)
  if mask is None:
    raise DataError("tokenizer has no mask token: name it in tokenizer_config.json "
                    f"(mask_token) or add one of {list(_MASK_NAMES)}.")
  unk = named("unk_token")
  if unk is None and (state.get("model") or {}).get("unk_token") is not None:
    unk = tok.token_to_id(state["model"]["unk_token"])
  specials = {t["id"] for t in state.get("added_tokens", []) if t.get("special")}
  specials.update(i for parts in (single, pair or ()) for _, ids, _ in parts for i in ids)
  specials.update(i for i in (pad, mask, unk) if i is not None)
  return Layout(single, pair, sep if pad is None else pad, mask, unk, frozenset(specials))
