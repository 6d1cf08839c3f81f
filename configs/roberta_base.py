"""RoBERTa-base (Liu et al. 2019): BERT-base's shape, a 50k byte-level BPE vocabulary
(GPT-2's scheme: <s>=0 <pad>=1 </s>=2 <unk>=3 ... <mask> last), no NSP, no segment
embeddings in use, positions offset past the padding index, dynamic masking, rows of
FULL-SENTENCES packed to 512 tokens for every step (no short phase).

Reproduces the pretraining of Table 9's RoBERTa-base column (appendix): batch 8k
sequences of 512, 500k steps, peak lr 6e-4 after 24k warm-up steps then linear decay,
Adam b1 0.9, b2 0.98, eps 1e-6, weight decay 0.01, dropout 0.1, no gradient clipping.
The paper's result tables (4-7) are for RoBERTa-large; RoBERTa-base's GLUE dev results
are in fairseq's RoBERTa README (MNLI 87.6, SST-2 94.8, ...).

  python -m bertjax.data.train_tokenizer --input='/data/*.txt' --kind=byte_level_bpe \
      --vocab_size=50265 --nolowercase --output=/data/roberta_bpe
  python -m bertjax.main --config=configs/roberta_base.py --workdir=/tmp/roberta \
      --config.data.corpus='/data/*.txt' --config.data.tokenizer.path=/data/roberta_bpe

(`--config.data.tokenizer.path=/path/roberta-base`, a Hugging Face directory with
vocab.json + merges.txt, uses RoBERTa's own vocabulary.)
"""

from configs import bert_base


def get_config(arg=None):
  c = bert_base.get_config(arg)
  c.model.vocab_size = 50265
  c.model.max_position_embeddings = 514
  c.model.type_vocab_size = 1
  c.model.pad_token_id = 1
  c.model.position_offset = 2
  c.model.layer_norm_eps = 1e-5
  c.model.initializer_cutoff_factor = 0.0  # fairseq's init_bert_params: an untruncated normal
  c.objectives = ("mlm",)  # No NSP: packed rows of full sentences.
  c.model.pooler = False
  c.data.max_seq_length = 512
  c.data.max_predictions_per_seq = 80
  c.data.length_phases = ()  # Full-length sequences throughout.
  c.data.tokenizer.kind = "byte_level_bpe"
  c.data.tokenizer.lowercase = False
  c.data.tokenizer.vocab_size = 50265
  c.train.batch_size = 8192
  c.train.num_steps = 500_000
  c.train.learning_rate = 6e-4
  c.train.warmup_steps = 24_000
  c.train.b2 = 0.98
  c.train.max_grad_norm = 0.0
  return c
