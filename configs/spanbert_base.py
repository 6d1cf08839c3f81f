"""SpanBERT-base (Joshi et al. 2020): BERT-base's shape, no NSP, single contiguous
segments of up to 512 tokens for every step (SpanBERT drops BERT's short-sequence
strategies, the 128-token phase included), span masking (span lengths ~
Geometric(0.2) clipped at 10 words, whole words, span-level 80/10/10, 15% budget) and
the span-boundary objective (SBO) added to the MLM loss. Cased WordPiece, 2.4M steps
of 256 x 512, otherwise BERT's optimiser settings.

Reproduces the "SpanBERT (base & cased)" model of the authors' repository
(facebookresearch/SpanBERT: SQuAD 1.1 / 2.0 dev F1 92.4 / 83.6, coreference 77.4,
TACRED 68.2); the paper's tables (Table 1: SQuAD, Table 5: GLUE, ...) report the large
model, which is this recipe at BERT-large's size.

  python -m bertjax.main --config=configs/spanbert_base.py --workdir=/tmp/spanbert \
      --config.data.corpus='/data/*.txt' --config.data.tokenizer.path=vocab.txt
"""

from configs import bert_base


def get_config(arg=None):
  c = bert_base.get_config(arg)
  c.objectives = ("mlm", "sbo")  # MLM + the span-boundary objective; no NSP.
  c.data.max_seq_length = 512
  c.data.max_predictions_per_seq = 80
  c.data.length_phases = ()  # Full-length segments throughout.
  c.data.masking = "span"
  c.data.span_geometric_p = 0.2
  c.data.max_span_length = 10
  c.data.tokenizer.lowercase = False
  c.train.num_steps = 2_400_000
  return c
