"""retrieval: an embedding model (search, RAG, clustering) trained contrastively from any
pretrained encoder, on (anchor, positive[, negatives]) pairs, evaluated on a corpus in
BEIR's layout, exported as a sentence-transformers folder. The defaults are the
ModernBERT paper's single-vector (DPR-style) BEIR protocol (Warner et al. 2024, section
3.1.2): CachedMultipleNegativesRankingLoss, batch 512, lr 8e-5, one epoch of MS MARCO
triplets; the GradCache mini-batch (64) and the warm-up (10%) are not given there.

  python -m bertjax.finetune --config=configs/finetune/retrieval.py \
      --config.init_from=MODEL --config.data.train=triplets.jsonl \
      --config.data.dev=BEIR_DIR --workdir=/tmp/retrieval
  python -m bertjax.convert --to=hf --src=/tmp/retrieval --dst=/tmp/retrieval_st
  # A pod's plan: ModernBERT-base (its recipe's model section, no init_from), 32k pairs.
  python -m bertjax.benchmark plan --config=configs/finetune/retrieval.py:modernbert_base \
      --topology=v5p-8 --batch_size=32768 --mesh=-1,1,1
"""

import importlib

from configs.finetune import base


def get_config(arg=None):
  """`arg`: a pretraining recipe of configs/ (e.g. 'modernbert_base') whose model
  section is the encoder's when there is no init_from (from scratch, or a pod's plan)."""
  c = base.get_config()
  if arg:
    c.model = importlib.import_module(f"configs.{arg}").get_config().model
  c.task.name = "retrieval"
  c.task.max_seq_length = 256  # Tokens of a query or document, prompt and specials included.
  # Pooling of the token states (sentence-transformers' modes): 'cls', 'mean', 'max',
  # 'mean_sqrt_len_tokens', 'weightedmean', 'lasttoken'; '' the init_from
  # sentence-transformers folder's, else 'mean'.
  c.task.pooling = ""
  c.task.normalize = True  # L2-normalised embeddings (the exported folder's Normalize).
  # Prefixes of queries and documents (e.g. 'query: ', 'passage: '), stored with the
  # model; '' the init_from folder's prompts ('query'; 'document' / 'passage'), if any.
  c.task.query_prompt = ""
  c.task.document_prompt = ""
  # Lower-case every text, its prompt included, before tokenizing (sentence-transformers'
  # do_lower_case, stored with the model); on too where the init_from folder says true.
  c.task.do_lower_case = False
  # 'mnrl' (MultipleNegativesRankingLoss, InfoNCE over every document of the global
  # batch), or a teacher's scores distilled: 'margin_mse' or 'kl' (teacher_column).
  c.task.loss = "mnrl"
  c.task.scale = 20.0  # mnrl: similarities times this (temperature 0.05).
  c.task.similarity = "cosine"  # 'cosine' or 'dot' (scores of every loss).
  c.task.symmetric = False  # mnrl: also each positive against every query.
  c.task.temperature = 1.0  # kl: both distributions' temperature.
  # Matryoshka: the loss summed over the embeddings' leading dims (each times its
  # weight; () = 1 each), e.g. (768, 512, 256, 128, 64); () the whole width only.
  c.task.matryoshka_dims = ()
  c.task.matryoshka_weights = ()
  # GradCache: embed each column of the batch this many texts at a time without keeping
  # activations (memory set by it, not the batch; the same gradient); 0 all at once.
  c.task.mini_batch_size = 64
  # The training files' columns (sentence-transformers' names); negative_columns ()
  # takes 'negative' or 'negative_1..k' when present.
  c.task.anchor_column = "anchor"
  c.task.positive_column = "positive"
  c.task.negative_columns = ()
  # A column of teacher scores: [positive, negatives...] or their margins (distillation).
  c.task.teacher_column = ""
  c.task.qrels_split = "test"  # data.dev in BEIR's layout: its qrels/<split>.tsv.
  c.task.eval_at_start = False  # Also score the starting model (its zero-shot figure).
  # JSON lines, Parquet or CSV of pairs; several sources as 'NAME=PATH,NAME=PATH' (each
  # batch from one source). data.dev: a BEIR directory, or scored pairs (sentence1,
  # sentence2, score) for the Spearman correlation of their similarities.
  c.data.train = ""
  c.data.dev = ""
  c.train.batch_size = 512  # Pairs a step: every other example's documents are negatives.
  c.train.learning_rate = 8e-5
  c.train.num_epochs = 1
  c.train.eval_every = 0  # Steps between dev evaluations (0: at the end only).
  c.train.eval_batch_size = 128  # Texts embedded at once in evaluation.
  return c
