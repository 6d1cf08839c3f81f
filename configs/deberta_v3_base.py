"""DeBERTa-v3-base (He et al. 2021, "DeBERTaV3: Improving DeBERTa using ELECTRA-Style
Pre-Training with Gradient-Disentangled Embedding Sharing", arXiv 2111.09543): 12 post-LN
layers, H=768, I=3072, A=12, disentangled attention (content, c2p and p2c terms over 256
log buckets of relative positions, the position keys through the content projections,
the relative embeddings layer-normed), no absolute positions, no token types, a
128,100-row SentencePiece vocabulary; 184,551,780 parameters with the MLM head
(183,831,552 in the encoder: Hugging Face's counts, tests/test_deberta_numerics.py).

The model is Hugging Face's `microsoft/deberta-v3-base` config.json (`python -m
bertjax.convert --to=bertjax` imports that checkpoint: its released weights are the
replaced-token-detection discriminator, without an MLM head).

The objective is replaced-token detection ('rtd', bertjax/objectives/rtd.py), as the
authors' released pretraining code gives it (github:microsoft/DeBERTa; the paper's
appendix table could not be read on this machine, which reaches no arXiv: every number
below cites the file it comes from):

- A generator of the discriminator's width and half its depth (rtd_base.json
  `generator`: 6 layers), sampling each masked token from its softmax (rtd_model.py
  `topk_sampling`: `torch.multinomial`, temperature 1); gradient-disentangled embedding
  sharing (rtd_base.json `"embedding_sharing": "gdes"`: the family's default here);
  loss = generator MLM + 10 x the discriminator's (rtd_task.py `--rtd_lambda`, default
  10, which rtd.sh does not set). Their run trains the two networks by two trainers
  (`--decoupled_training True`), each with its own Adam state and gradient clipping;
  here both are one state under one optimizer, whose Adam moments are per parameter
  (GDES: each parameter receives exactly one of the two losses, so the updates are the
  same) and whose global-norm clipping is over both networks' gradients together.
- Rows of 512 tokens (experiments/language_model/rtd.sh: `max_seq_length=512`); the
  corpus concatenated and cut into lines of 510 tokens plus [CLS] and [SEP]
  (prepare_data.py, README "We concatenate all documents into a single text"): packed
  rows crossing documents, no document isolation, no NSP, no token types.
- Batch 256, 1,000,000 steps, 10,000 warm-up steps, peak learning rate 1e-4 (rtd.sh
  `deberta-v3-base`: `--train_batch_size 256 --warmup 10000 --learning_rate 1e-4`,
  `--num_training_steps 1000000`), then linear decay to 0 measured from step 0
  (DeBERTa/optims/lr_schedulers.py `warmup_linear`, the default `lr_schedule`).
- Adam with decoupled weight decay 0.01, b1 0.9, b2 0.999, eps 1e-6, gradient clipping
  at global norm 1 (DeBERTa/optims/args.py defaults); mixed precision (rtd.sh
  `--fp16 True`: bfloat16 on TPUs and GPUs here).
- Masking 15% of the tokens, every chosen one replaced by [MASK] (RTD's generator input:
  DeBERTa/apps/tasks/rtd_task.py `NGramMaskGenerator(..., keep_prob=0, mask_prob=1)`,
  `mask_lm_prob` 0.15), at most ceil(512 x 0.15 / 10) x 10 = 80 predictions a row
  (mlm_task.py `max_preds_per_seq`). Not reproduced: their masker picks one token in
  each window of int(1 / 0.15) = 6 (bertjax draws the 15% uniformly).
- Dropout 0.1 on hidden states and attention probabilities, initializer range 0.02,
  LayerNorm eps 1e-7 (rtd_base.json `discriminator`).
- Tokenizer: their spm.model (128,000 pieces, [MASK] after them) as
  `--config.data.tokenizer.path`, or one trained on the corpus in the same layout
  (`sentencepiece_bert`, cased).

  python -m bertjax.data.prepare --config=configs/deberta_v3_base.py --input=/data/text \
      --tokenizer=/data/deberta-v3-base/spm.model --output=/data/prepared --workers=64
  python -m bertjax.main --config=configs/deberta_v3_base.py --workdir=gs://bucket/dv3 \
      --config.data.corpus=/data/prepared --config.data.tokenizer.path=/data/prepared/tokenizer
"""

import ml_collections

from configs import bert_base, model_section


def model_config() -> ml_collections.ConfigDict:
  """DeBERTa-v3-base's `config.model`: the family's defaults (bertjax/model/deberta.py:
  Hugging Face's DebertaV2Config for microsoft/deberta-v3-base)."""
  return model_section("deberta")


def get_config(arg=None):
  c = bert_base.get_config(arg)
  c.model = model_config()
  c.objectives = ("rtd",)  # Replaced-token detection (no NSP).
  c.rtd = ml_collections.ConfigDict()
  c.rtd.discriminator_weight = 10.0  # rtd_task.py --rtd_lambda.
  c.rtd.embedding_sharing = ""  # '': the family's, GDES (rtd_base.json).
  # The generator: config.model at these sizes (rtd_base.json `generator`).
  c.generator = ml_collections.ConfigDict({"num_layers": 6})
  c.data.max_seq_length = 512  # rtd.sh max_seq_length.
  c.data.length_phases = ()  # 512 throughout.
  c.data.max_predictions_per_seq = 80  # ceil(512 x 0.15 / 10) x 10.
  c.data.masked_lm_prob = 0.15  # mask_lm_prob.
  c.data.mask_token_prob = 1.0  # Every chosen token becomes [MASK] ...
  c.data.random_token_prob = 0.0  # ... none random, none kept (keep_prob=0, mask_prob=1).
  c.data.packing = "full_sentences"  # Rows cut from the concatenated corpus ...
  c.data.isolate_documents = False  # ... attending across documents.
  c.data.tokenizer.kind = "sentencepiece_bert"  # DeBERTa's spm.model layout ...
  c.data.tokenizer.lowercase = False  # ... cased ...
  c.data.tokenizer.vocab_size = 128100  # ... when trained here.
  c.train.batch_size = 256  # --train_batch_size.
  c.train.num_steps = 1_000_000  # --num_training_steps.
  c.train.learning_rate = 1e-4  # --learning_rate.
  c.train.warmup_steps = 10_000  # --warmup.
  c.train.schedule = "linear"  # warmup_linear: to 0, measured from step 0.
  c.train.decay_start = "step0"
  c.train.weight_decay = 0.01
  c.train.b1 = 0.9
  c.train.b2 = 0.999
  c.train.eps = 1e-6
  c.train.max_grad_norm = 1.0
  return c
