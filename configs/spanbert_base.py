"""SpanBERT-base (Joshi et al. 2020): BERT-base's shape, no NSP, single contiguous
segments of up to 512 tokens, span masking (span lengths ~ Geometric(0.2) clipped at
10 words, whole words, span-level 80/10/10, 15% budget) and the span-boundary
objective (SBO) added to the MLM loss. Cased WordPiece, 2.4M steps of 256 x 512.

  python -m bertjax.main --config=configs/spanbert_base.py --workdir=/tmp/spanbert \
      --config.data.corpus='/data/*.txt' --config.data.tokenizer.path=vocab.txt
"""

from configs import bert_base


def get_config(arg=None):
  c = bert_base.get_config(arg)
  c.model.nsp = False
  c.model.sbo = True  # The span-boundary objective head and loss.
  c.model.sbo_max_positions = 32  # Relative positions embedded (longer merged spans clip).
  c.data.max_seq_length = 512
  c.data.max_predictions_per_seq = 80
  c.data.masking = "span"
  c.data.span_geometric_p = 0.2
  c.data.max_span_length = 10
  c.data.tokenizer.lowercase = False
  c.train.num_steps = 2_400_000
  return c
