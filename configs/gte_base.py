"""gte-multilingual-base's encoder (mGTE: Zhang et al. 2024, "mGTE: Generalized
Long-Context Text Representation and Reranking Models for Multilingual Text Retrieval",
arXiv 2407.19669): 12 post-LN layers, H=768, I=3072 (GLU with GELU), A=12, rotary
positions, XLM-R's 250,048-piece SentencePiece vocabulary, 8,192-token context. The
model is Hugging Face's `GteConfig` defaults (bertjax/model/gte.py's); transformers'
`GteForMaskedLM` and the published gte-multilingual-mlm-base import with
`python -m bertjax.convert --to=bertjax`.

The recipe is the MLM pretraining the authors publish on the model card of
Alibaba-NLP/gte-multilingual-mlm-base ("Training Procedure"), in ONE run:

  phase      steps   rows x length   lr      mlm_probability   rope_base
  MLM-2048   250k    8,192 x 2,048   2e-4    0.3               10,000
  MLM-8192    30k    2,048 x 8,192   5e-5    0.3               160,000

- Both phases carry 16,777,216 tokens per step: `batch_by_tokens` with 2,048 rows of
  8,192 (8,192 rows of 2,048 in phase 1).
- Rotary base 10,000 then 160,000 (`model.rope_theta_phases`; inference and export use
  the final 160,000: config.json's `rope_theta`).
- 30% masking in both phases (`masked_lm_prob`), no NSP; the lr drops from 2e-4 to 5e-5
  at the second phase (`learning_rate_restarts` of the 'wsd' schedule).
- Dropout 0.1 (hidden_dropout_prob; attention probabilities 0): the published config.json.
Not published there (kept at configs/bert_base.py's AdamW values: betas (0.9, 0.999),
eps 1e-6, weight decay 0.01, clipping at 1.0, a 10k-step warm-up; the schedule's shape,
here constant per phase and a linear decay to 0 over the last 3k steps): the optimizer
settings, warm-up and decay; the data mixture (c4-en, mC4, SkyPile, Wikipedia,
CulturaX, ...: paper appendix A.1) and its resampling towards long texts in phase 2 (give
each phase's data with `--config.data.corpus`). The English gte-en-mlm-base trained
2,048 then 8,192 tokens at rope base 10,000 then 500,000 with a bert-base-uncased
WordPiece vocabulary and `type_vocab_size=0`:
  --config.model.vocab_size=30528 --config.model.type_vocab_size=0 --config.model.pad_token_id=0
  --config.model.rope_theta=500000 --config.model.rope_theta_phases='(10000.0,500000.0)'
  --config.data.tokenizer.kind=wordpiece

  python -m bertjax.main --config=configs/gte_base.py --workdir=gs://bucket/gte \
      --config.data.corpus=/data/prepared \
      --config.data.tokenizer.path=/path/xlm-roberta-base/sentencepiece.bpe.model
"""

from configs import bert_base, model_section

PRETRAIN, CONTEXT = 250_000, 30_000
STEPS = PRETRAIN + CONTEXT


def get_config(arg=None):
  c = bert_base.get_config(arg)
  c.objectives = ("mlm",)
  c.model = model_section("gte", rope_theta_phases=(10_000.0, 160_000.0))
  c.data.max_seq_length = 8192
  c.data.length_phases = ((PRETRAIN / STEPS, 2048), (CONTEXT / STEPS, 8192))
  c.data.masked_lm_prob = 0.3
  c.data.max_predictions_per_seq = 2458  # round(0.3 * 8,190) at 8,192 (615 at 2,048).
  c.data.isolate_documents = True  # Each document attends only to itself.
  c.data.tokenizer.kind = "sentencepiece"  # XLM-R's pieces (pad id 1).
  c.data.tokenizer.lowercase = False
  c.data.tokenizer.vocab_size = 250048
  c.train.batch_size = 2048  # Rows of 8,192 tokens; 8,192 rows of 2,048 in phase 1.
  c.train.batch_by_tokens = True
  c.train.num_steps = STEPS
  c.train.learning_rate = 2e-4
  c.train.schedule = "wsd"
  c.train.learning_rate_restarts = ((PRETRAIN / STEPS, 5e-5, 0.01),)
  c.train.decay_fraction = 3_000 / STEPS
  c.train.decay_shape = "linear"
  c.train.checkpoint_every = 5_000
  c.train.eval_every = 5_000
  return c
