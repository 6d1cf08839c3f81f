"""rerank: a reranker (cross-encoder) from any pretrained encoder or a published
cross-encoder folder, trained on labeled pairs, labeled lists or triplets as
sentence-transformers 6's CrossEncoderTrainer is, scored by reranking a first stage.
The defaults are sentence-transformers' documented recipe: BinaryCrossEntropyLoss on
mined hard negatives (`python -m bertjax.mine --output_format=labeled-pair`), one
logit, Sigmoid scores; lr 2e-5, batch 64 (its MS MARCO example), one epoch, warm-up 10%.

  python -m bertjax.finetune --config=configs/finetune/rerank.py \
      --config.init_from=MODEL --config.data.train=labeled_pairs.jsonl \
      --config.data.dev=rerank_samples.jsonl --workdir=/tmp/rerank
  # LambdaLoss on labeled lists (mine --output_format=labeled-list), groups of 16:
  #   --config.task.loss=lambda --config.task.group_size=16
  python -m bertjax.convert --to=hf --src=/tmp/rerank --dst=/tmp/rerank_ce
  # sentence_transformers.CrossEncoder('/tmp/rerank_ce').predict([(query, document)])
"""

import importlib

from configs.finetune import base


def get_config(arg=None):
  """`arg`: a pretraining recipe of configs/ whose model section is the encoder's when
  there is no init_from (from scratch, or a pod's plan)."""
  c = base.get_config()
  if arg:
    c.model = importlib.import_module(f"configs.{arg}").get_config().model
  c.task.name = "rerank"
  # Tokens of a (query, document) pair, special tokens included; a longer pair is cut
  # longest side first (the tokenizer's truncation='longest_first', as CrossEncoder).
  c.task.max_seq_length = 512
  # Logits a pair: 1 (a relevance score), or classes for 'cross_entropy'.
  c.task.num_labels = 1
  # The score = activation(logits): '' Sigmoid for one label, identity for several
  # (CrossEncoder's default), or the init_from cross-encoder folder's; 'sigmoid', 'identity'.
  c.task.activation = ""
  # Loss by name (bertjax/tasks/rerank_losses.py, each sentence-transformers 6.2.0's):
  # 'bce', 'cross_entropy', 'mse', 'mnrl', 'margin_mse', 'lambda', 'ranknet',
  # 'listnet', 'listmle', 'plistmle', 'adrmse'.
  c.task.loss = "bce"
  # The activation applied to the logits inside the loss: '' the loss's own default
  # (MNRL: 'sigmoid'; the others: 'identity'), or 'sigmoid' / 'identity'.
  c.task.loss_activation = ""
  c.task.pos_weight = 0.0  # bce: the positive term's weight (0: none, i.e. 1).
  c.task.scale = 10.0  # mnrl: activated logits times this.
  # mnrl: documents of other examples added to each group as negatives (0: none).
  c.task.num_negatives = 4
  # lambda: weighting scheme 'ndcg2pp' (NDCGLoss2++, mu below), 'ndcg2', 'ndcg1',
  # 'lambdarank', 'none'; lambda_k: NDCG@k's cut (0: the whole list); sigma; log base.
  c.task.lambda_scheme = "ndcg2pp"
  c.task.lambda_k = 0
  c.task.sigma = 1.0
  c.task.mu = 10.0
  c.task.reduction_log = "binary"
  # listmle / plistmle: the ranking a list is scored by: 'input' (the list's own order,
  # best first: respect_input_order=True) or 'labels' (by label, ties in input order).
  c.task.list_order = "input"
  c.task.adrmse_alpha = 1.0  # adrmse: the sigmoid's sharpness in the approximate ranks.
  # The encoder reads this many rows (pairs, or packed rows) at a time under GradCache,
  # any loss: memory of one mini-batch, the whole batch's gradient (sentence-
  # transformers' CachedMultipleNegativesRankingLoss is 'mnrl' with this). 0: at once.
  c.task.mini_batch_size = 0
  # (query, document) pairs a training example: 0 the longest list of the data (1 for
  # labeled pairs); shorter lists padded, longer ones refused. One shape: one compile.
  c.task.group_size = 0
  # The training file's columns ('' finds query/anchor, document/positive/..., label/
  # labels/score/scores; negative or negative_1..k for triplets / n-tuples).
  c.task.query_column = ""
  c.task.document_column = ""
  c.task.label_column = ""
  # Dev: reranking samples (JSON lines: query, positive, documents or negative) or a
  # BEIR directory (qrels_split) with a first stage: 'bm25', a TREC run file or an
  # embedding model; its top first_stage_k candidates are reranked.
  c.task.first_stage = "bm25"
  c.task.first_stage_k = 100
  c.task.qrels_split = "test"
  c.task.always_rerank_positives = True
  c.task.at_k = 10  # MRR@k and nDCG@k.
  # 'auto': labeled pairs (groups of one) packed several to a row of max_seq_length,
  # each isolated (bertjax/tasks/batching.py); lists and tuples bucketed.
  c.task.batching = "auto"
  c.data.train = ""
  c.data.dev = ""
  c.train.batch_size = 64  # Groups a step (each of group_size pairs).
  c.train.learning_rate = 2e-5
  c.train.num_epochs = 1
  c.train.eval_batch_size = 64  # Pairs scored at once in evaluation.
  return c
