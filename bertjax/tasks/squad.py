"""Span QA (SQuAD v1.1 / v2.0), as in BERT's run_squad: the question is segment A,
the passage segment B; passages longer than the row are cut into windows `doc_stride`
tokens apart; a start and an end vector score every token; answers are the best
(start <= end, at most `max_answer_length` tokens, start in its max-context window)
of the n-best starts and ends; SQuAD 2.0 answers '' when the [CLS] null score beats the
best span by more than `null_score_diff_threshold`. Answers are cut from the original
passage text. Scored by the official EM / F1.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from bertjax.tasks import metrics
from bertjax.model import family_of
from bertjax.tasks import base, readers


class SpanHead(nn.Module):
  config: Any  # the model config (any family)

  @nn.compact
  def __call__(self, out: dict, batch: dict, deterministic: bool) -> dict:
    """-> `start_logits`, `end_logits` [B, T] float32 (padding at -1e9)."""
    family = family_of(self.config)
    x = family.task_features(self.config, out, deterministic, pooled=False,
                             dropout=False)  # [B, T, E]
    logits = family.output_layer(self.config, 2, "qa")(x)
    logits = jnp.where(batch["attention_mask"][..., None] > 0,
                       logits.astype(jnp.float32), -1e9)
    return {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}


@dataclasses.dataclass
class Window:
  """Host data of one feature row: row position -> passage word, and whether the row
  is the token's max-context window."""

  token_to_word: dict[int, int]
  token_to_piece: dict[int, int]  # which subword of its word
  max_context: dict[int, bool]


def _words(context: str) -> tuple[list[str], list[int], list[int]]:
  """Whitespace words of the passage with their character start and end."""
  words, starts, ends = [], [], []
  for i, ch in enumerate(context):
    if ch.isspace():
      continue
    if i == 0 or context[i - 1].isspace():
      words.append("")
      starts.append(i)
      ends.append(i)
    words[-1] += ch
    ends[-1] = i + 1
  return words, starts, ends


def _fold(text: str) -> str:
  return "".join(c for c in unicodedata.normalize("NFD", text.lower())
                 if unicodedata.category(c) != "Mn")


def _improve_span(doc: Sequence[int], start: int, end: int, answer: Sequence[int]
                  ) -> tuple[int, int]:
  """The tightest sub-span of the answer's whole words whose tokens are the answer's
  own ('Elway,' -> 'elway'), as BERT's `_improve_answer_span`."""
  for lo in range(start, end + 1):
    for hi in range(end, lo - 1, -1):
      if list(doc[lo:hi + 1]) == list(answer):
        return lo, hi
  return start, end


class SquadQA(base.Task):
  name = "squad"
  default_metric = "f1"
  # Bucketed batches: a window's logits past its batch's length read as padding.
  token_outputs = {"start_logits": -1e9, "end_logits": -1e9}

  def read(self, path: str, split: str) -> list[dict]:
    examples = readers.read(path, split, readers.read_squad)
    if path.startswith(readers.TFDS_PREFIX):
      examples = readers.squad_records(examples)
    return examples

  def featurize(self, examples: Sequence[dict], train: bool) -> base.Features:
    """Rows: input_ids ... [T], start_positions / end_positions [] (0 = [CLS] when the
    window lacks the answer or there is none)."""
    cfg, tok, T = self.cfg, self.tokenizer, self.max_seq_length
    rows, starts, ends, example_index, meta = [], [], [], [], []
    for n, e in enumerate(examples):
      words, w_start, w_end = _words(e["context"])
      pieces = base.word_pieces(tok, words)
      tok_to_word = [w for w, p in enumerate(pieces) for _ in p]
      tok_to_piece = [k for p in pieces for k in range(len(p))]
      doc = [i for p in pieces for i in p]
      first_tok = np.cumsum([0] + [len(p) for p in pieces])
      answer = None
      if e["answers"] and not e.get("is_impossible"):
        a = e["answers"][0]
        lo, hi = a["answer_start"], a["answer_start"] + len(a["text"])
        inside = [w for w in range(len(words)) if w_start[w] < hi and w_end[w] > lo]
        if inside:
          answer = _improve_span(doc, first_tok[inside[0]], first_tok[inside[-1] + 1] - 1,
                                 tok.tokenize(a["text"]))
      query = tok.tokenize(e["question"])[:cfg.max_query_length]
      offset = len(query) + tok.num_special(True) - 1
      budget = T - len(query) - tok.num_special(True)
      spans, lo = [], 0
      while True:
        spans.append((lo, min(budget, len(doc) - lo)))
        if lo + budget >= len(doc):
          break
        lo += min(budget, cfg.doc_stride)
      for s, length in spans:
        rows.append((query, doc[s:s + length]))
        start = end = 0
        if answer and s <= answer[0] and answer[1] < s + length:
          start, end = answer[0] - s + offset, answer[1] - s + offset
        starts.append(start)
        ends.append(end)
        example_index.append(n)
        max_ctx = {}
        for i in range(length):
          score = lambda sp: min(s + i - sp[0], sp[0] + sp[1] - 1 - s - i) + 0.01 * sp[1]
          best = max((sp for sp in spans if sp[0] <= s + i < sp[0] + sp[1]), key=score)
          max_ctx[offset + i] = best[0] == s
        meta.append(Window({offset + i: tok_to_word[s + i] for i in range(length)},
                           {offset + i: tok_to_piece[s + i] for i in range(length)}, max_ctx))
    arrays = base.encode_rows(tok, rows, T)
    arrays["start_positions"] = np.array(starts, np.int32)
    arrays["end_positions"] = np.array(ends, np.int32)
    return base.Features(arrays, np.array(example_index), meta)

  def head(self, config) -> nn.Module:
    return SpanHead(config)

  def loss(self, outputs, batch):
    w = batch["example_weights"]
    s, _ = base.masked_xent(outputs["start_logits"], batch["start_positions"], w)
    e, count = base.masked_xent(outputs["end_logits"], batch["end_positions"], w)
    return (s + e) / 2, count

  def predict_outputs(self, outputs):
    return outputs

  def _text(self, context: str, pieces: list[list[int]], words, w_start, w_end,
            first: tuple[int, int], last: tuple[int, int]) -> str:
    """Passage text from subword `first` = (word, piece) to `last`, cut inside a word
    where its pieces spell it exactly (e.g. 'Denver.' -> 'Denver')."""
    def bounds(w):
      texts = [self.tokenizer.id_to_token(i).removeprefix("##") for i in pieces[w]]
      if "".join(_fold(t) for t in texts) != _fold(words[w]):
        return None
      return np.cumsum([0] + [len(t) for t in texts])
    lo, hi = w_start[first[0]], w_end[last[0]]
    b = bounds(first[0])
    if b is not None:
      lo += int(b[first[1]])
    b = bounds(last[0])
    if b is not None:
      hi = w_start[last[0]] + int(b[last[1] + 1])
    return context[lo:hi]

  def decode(self, outputs, features, examples):
    """{question id: answer text} ('' for no answer, SQuAD 2.0)."""
    cfg, n_best = self.cfg, self.cfg.n_best_size
    best: dict[int, tuple[float, int, int, int]] = {}
    null: dict[int, float] = {}
    for row, n in enumerate(features.example_index):
      st, en, window = outputs["start_logits"][row], outputs["end_logits"][row], features.meta[row]
      null[n] = min(null.get(n, np.inf), float(st[0] + en[0]))
      for i in np.argsort(-st)[:n_best]:
        for j in np.argsort(-en)[:n_best]:
          if (i not in window.token_to_word or j not in window.token_to_word or j < i
              or j - i + 1 > cfg.max_answer_length or not window.max_context[i]):
            continue
          score = float(st[i] + en[j])
          if n not in best or score > best[n][0]:
            best[n] = (score, row, int(i), int(j))
    answers = {}
    for n, e in enumerate(examples):
      text = ""
      if n in best and not (cfg.version_2 and null[n] - best[n][0] > cfg.null_score_diff_threshold):
        _, row, i, j = best[n]
        text = self._span_text(e, features.meta[row], i, j)
      answers[e["id"]] = text
    return answers

  def _span_text(self, e, window: Window, i: int, j: int) -> str:
    words, w_start, w_end = _words(e["context"])
    pieces = base.word_pieces(self.tokenizer, words)
    return self._text(e["context"], pieces, words, w_start, w_end,
                      (window.token_to_word[i], window.token_to_piece[i]),
                      (window.token_to_word[j], window.token_to_piece[j]))

  def score(self, predictions, examples):
    golds = {e["id"]: [a["text"] for a in e["answers"]] for e in examples}
    return metrics.squad_scores(predictions, golds)
