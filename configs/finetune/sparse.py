"""sparse: a SPLADE retriever (a weight per vocabulary entry, scored by dot products,
served by inverted indexes: Elasticsearch, OpenSearch, Qdrant) trained from any
pretrained encoder with an MLM head on (anchor, positive[, negatives]) pairs, with the
retrieval task's data, GradCache and negatives from the whole mesh
(configs/finetune/retrieval.py: every field there means the same here). The defaults
are sentence-transformers' SPLADE example
(examples/sparse_encoder/training/retrievers/train_splade_nq.py, v6): SpladeLoss with
SparseMultipleNegativesRankingLoss (dot product, scale 1), query / document FLOPS
weights 5e-5 / 3e-5, max pooling of log1p(relu), 256 tokens, batch 12, lr 2e-5, one
epoch; the warm-up (10%) is fine-tuning's.

  python -m bertjax.finetune --config=configs/finetune/sparse.py \
      --config.init_from=MLM_CHECKPOINT --config.data.train=pairs.jsonl \
      --config.data.dev=BEIR_DIR --workdir=/tmp/splade
"""

from configs.finetune import retrieval


def get_config(arg=None):
  """`arg`: as configs/finetune/retrieval.py's (a recipe's model section)."""
  c = retrieval.get_config(arg)
  c.task.name = "sparse"
  # SpladePooling: 'max' (SPLADE v2 and later) or 'sum' (SPLADE v1) over the tokens of
  # the activation of the MLM logits: 'relu' (log1p(relu)) or 'log1p_relu' (log1p twice);
  # '' the init_from SparseEncoder folder's, else 'max' and 'relu'.
  c.task.splade_pooling = ""
  c.task.activation = ""
  # Tokens whose MLM logits are computed at once, in a scan, recomputed in the backward
  # pass: the gradient holds one chunk's [texts, chunk, vocabulary] logits, not every
  # token's (0: every token at once, as sentence-transformers trains).
  c.task.chunk_size = 0
  # Inference-free SPLADE (sentence-transformers' Router.for_query_document): 'static'
  # embeds a query by a trained weight per vocabulary entry for each token it holds
  # (SparseStaticEmbedding, ones at first; no encoder at query time), documents by SPLADE;
  # 'splade' both by SPLADE; '' the init_from model's ('static' for an inference-free
  # one), else 'splade'. query_learning_rate: the query weights' peak learning rate (the
  # schedule's shape; 0: config.train.learning_rate), query_weights_frozen: never
  # trained. sentence-transformers' inference-free recipe (its v5 blog post, "Training
  # and Finetuning Sparse Embedding Models"): lr 1e-3 for them, 2e-5 for the rest,
  # query_regularizer_weight 0, document_regularizer_weight 3e-3.
  c.task.query_encoder = ""
  c.task.query_learning_rate = 1e-3
  c.task.query_weights_frozen = False
  c.task.similarity = "dot"
  c.task.scale = 1.0  # mnrl: SparseMultipleNegativesRankingLoss's scale.
  c.task.normalize = False
  c.task.temperature = 2.0  # kl: SparseDistillKLDivLoss's default.
  # FLOPS regularisers (SpladeLoss): the squared batch mean of the weights, summed over
  # the vocabulary, times these (0: none); a threshold > 0 counts only vectors with more
  # active dimensions than it (FlopsLoss's l0 masking). document_regularizer_only:
  # queries are regularised as documents (symmetric texts), the query weight unused.
  c.task.query_regularizer_weight = 5e-5
  c.task.document_regularizer_weight = 3e-5
  c.task.query_regularizer_threshold = 0
  c.task.document_regularizer_threshold = 0
  c.task.document_regularizer_only = False
  # Evaluation: each vector cut to its N largest entries (sentence-transformers'
  # max_active_dims; 0: every active entry).
  c.task.max_active_dims = 0
  c.task.mini_batch_size = 0  # SpladeLoss reads the batch at once (CachedSpladeLoss: set it).
  c.train.batch_size = 12
  c.train.learning_rate = 2e-5
  return c
