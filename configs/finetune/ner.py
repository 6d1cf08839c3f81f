"""Sequence labelling: CoNLL-2003 NER (BIO tags, entity F1) or, with `:pos`, POS
tagging (word accuracy); `:features` is NER by the feature-based approach. Each word's
first subword trains on its tag, and words are decoded from it.

  python -m bertjax.finetune --config=configs/finetune/ner.py --workdir=/tmp/ner \
      --config.init_from=/path/to/bert-base-cased \
      --config.data.train=conll2003/train.txt --config.data.dev=conll2003/valid.txt
  # or the prepared TFDS dataset: --config.data.train=tfds:conll2003 (dev: its 'dev' split)
  # Feature-based (frozen encoder, 2-layer BiLSTM over the last 4 layers concatenated):
  python -m bertjax.finetune --config=configs/finetune/ner.py:features ...
"""

from configs.finetune import base


def get_config(arg="ner"):
  if arg not in ("ner", "pos", "features"):
    raise ValueError(f"configs/finetune/ner.py:{arg}: use ner, pos or features.")
  c = base.get_config()
  c.task.name = "tagging"
  ner = arg != "pos"
  c.task.tag_column = -1 if ner else 1  # CoNLL-2003: NER last, POS second.
  # Words and tags features of a tfds: input (tfds:conll2003: tokens, pos, chunks, ner).
  c.task.tfds_fields = ("tokens", "ner" if ner else "pos")
  # Train every subword of a word on its tag, not only the first (the BERT paper and
  # Hugging Face's run_ner.py label the first; decoding reads the first either way).
  c.task.label_all_subwords = False
  c.task.metrics = ("f1", "precision", "recall", "accuracy") if ner else (
      "accuracy",)  # The first selects the best sweep run.
  c.train.learning_rate = 5e-5
  # The feature-based approach (BERT paper section 5.4): '' fine-tunes the encoder (the
  # default); 'concat_last4' (the last 4 hidden states concatenated) or 'scalar_mix'
  # (ELMo's learned softmax-weighted sum of the blocks' outputs, times a scale) freeze
  # the encoder (no gradient, no optimizer state) and train `tagger` over them.
  c.task.features = ""
  c.task.tagger = "bilstm"  # Over the features: 'bilstm' (then linear) or 'linear'.
  c.task.lstm_size = 768  # BiLSTM units per direction (the paper: 768).
  c.task.lstm_layers = 2  # BiLSTM layers (the paper: 2).
  if arg == "features":  # The paper's best feature-based NER: 96.1 dev F1 (base).
    c.task.features = "concat_last4"
    c.train.learning_rate = 1e-3  # A tagger trained from scratch, not the encoder.
  return c
