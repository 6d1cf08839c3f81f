"""colbert: a multi-vector (late-interaction, ColBERT) retriever trained from any
pretrained encoder on (anchor, positive[, negatives]) pairs, with the retrieval task's
data, GradCache and negatives from the whole mesh (configs/finetune/retrieval.py: every
field there means the same here), scored by MaxSim, exported as a sentence-transformers
`MultiVectorEncoder` folder. The defaults are PyLate's ColBERT model (128 dimensions,
query marker '[Q] ' and document marker '[D] ', queries of 32 tokens expanded with the
mask token and not attended to, documents of 180 tokens, the punctuation skipped in
documents) and its contrastive ModernBERT example (pylate examples/train/contrastive:
batch 64, lr 3e-6, 5 epochs, MaxSim scores at scale 1); the warm-up (10%) is
fine-tuning's.

  python -m bertjax.finetune --config=configs/finetune/colbert.py \
      --config.init_from=MODEL --config.data.train=pairs.jsonl \
      --config.data.dev=BEIR_DIR --workdir=/tmp/colbert
  python -m bertjax.convert --to=hf --src=/tmp/colbert --dst=/tmp/colbert_st
"""

import string

from configs.finetune import retrieval


def get_config(arg=None):
  """`arg`: as configs/finetune/retrieval.py's (a recipe's model section)."""
  c = retrieval.get_config(arg)
  c.task.name = "colbert"
  c.task.dim = 128  # The projection's width: a vector per token.
  # Markers: prefixes of the texts, tokenized with them (sentence-transformers 6's
  # prompts; PyLate's query_prefix / document_prefix).
  c.task.query_prompt = "[Q] "
  c.task.document_prompt = "[D] "
  # Queries cut to this many tokens, specials and marker included; with expansion
  # 'fixed' padded to it with the mask token (ColBERT's query augmentation), every
  # position scored; the encoder attends to them with attend_to_expansion.
  c.task.query_length = 32
  c.task.query_expansion = "fixed"
  c.task.attend_to_expansion = False
  c.task.max_seq_length = 180  # A document's tokens, marker and specials included.
  # Document tokens left out of MaxSim (single vocabulary tokens only).
  c.task.skiplist_words = tuple(string.punctuation)
  c.task.similarity = "dot"
  c.task.scale = 1.0  # mnrl: MaxSim scores times this.
  c.task.normalize = True  # Unit token vectors (the exported folder's Normalize).
  c.task.mini_batch_size = 0  # GradCache mini-batches (CachedMultiVectorMNRL: set it).
  # data.dev (BEIR): '' scores every query against every document by MaxSim; a first
  # stage ('bm25', a TREC run file or an embedding model) has its top first_stage_k
  # candidates reranked instead, for corpora too large to score exactly.
  c.task.first_stage = ""
  c.task.first_stage_k = 100
  c.train.batch_size = 64
  c.train.learning_rate = 3e-6
  c.train.num_epochs = 5
  return c
