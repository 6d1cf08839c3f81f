"""nomic-bert-2048 (Nussbaum et al. 2024, "Nomic Embed: Training a Reproducible Long
Context Text Embedder", arXiv 2402.01613, section 4.1): BERT-base's sizes (12 post-LN
layers, H=768, A=12) with rotary positions (base 1,000), SwiGLU (I=3072) and no biases
in the projections, dropout 0, bert-base-uncased's WordPiece vocabulary padded to a
multiple of 64 (30,528); the encoder of nomic-embed-text-v1 / v1.5. The model is
Hugging Face's `NomicBertConfig` defaults (bertjax/model/nomic_bert.py's).

The recipe is the authors' MLM pretraining: the paper (BooksCorpus and a 2023
Wikipedia dump tokenized with bert-base-uncased and packed into 2,048-token rows, 30%
masking, no NSP), the nomic-bert-2048 model card (batch 4k rows of 2,048, 100k steps)
and the training config of github:nomic-ai/contrastors
(src/contrastors/configs/train/mlm.yaml): AdamW, lr 5e-4, betas (0.9, 0.98), eps 1e-6,
weight decay 1e-5, no gradient clipping (max_grad_norm 0), a linear warm-up over 6% of
the steps then a linear decay to 0, held-out masking at 15% (`val_mlm_prob`).
Not reproduced: their DeepSpeed / FlashAttention / bf16 machinery (bertjax's own paths
do that); their rows are packed across documents that attend each other, kept here
(`isolate_documents` False).

  python -m bertjax.main --config=configs/nomic_bert_base.py --workdir=gs://bucket/nomic \
      --config.data.corpus=/data/prepared --config.data.tokenizer.path=/path/vocab.txt
"""

from configs import bert_base, model_section

STEPS = 100_000


def get_config(arg=None):
  c = bert_base.get_config(arg)
  c.objectives = ("mlm",)
  c.model = model_section("nomic_bert")
  c.data.max_seq_length = 2048
  c.data.length_phases = ()
  c.data.masked_lm_prob = 0.15  # The held-out batches' rate (val_mlm_prob) ...
  c.data.masked_lm_prob_phases = ((1.0, 0.3),)  # ... training: 30% throughout.
  c.data.max_predictions_per_seq = 614  # round(0.3 * 2,046)
  c.data.tokenizer.vocab_size = 30528
  c.train.batch_size = 4096
  c.train.num_steps = STEPS
  c.train.learning_rate = 5e-4
  c.train.warmup_steps = 6_000  # 6% of the steps (warmup_pct 0.06).
  c.train.decay_start = "warmup_end"
  c.train.weight_decay = 1e-5
  c.train.b2 = 0.98
  c.train.max_grad_norm = 0.0
  c.train.checkpoint_every = 5_000
  c.train.eval_every = 5_000
  return c
