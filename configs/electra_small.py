"""ELECTRA-Small (Clark et al. 2020): the discriminator L=12, H=256, A=4, FFN 1024,
embeddings of 128 projected to 256 (~14M parameters), and its generator, from the
paper's Table 6 (pre-train hyperparameters):

  layers 12, hidden 256, FFN 1024, heads 4, embedding size 128     Table 6 (Small)
  generator size 1/4 (of hidden size, FFN size and heads)          Table 6
  mask 15%, linear decay, warm-up 10,000 steps, lr 5e-4           Table 6
  Adam eps 1e-6, b1 0.9, b2 0.999, weight decay 0.01              Table 6
  dropout 0.1, attention dropout 0.1, batch 128, 1M steps         Table 6
  discriminator loss weight lambda = 50                           section 3.2 / appendix A
  sequence length 128                                             google-research/electra's
                                                                  configure_pretraining.py

The table's numbers here were checked against google-research/electra
(configure_pretraining.py: lr 5e-4, weight decay 0.01, 10k warm-up, 1M steps, batch
128 at length 128, embedding 128 for small, mask 15% (25% large), disc_weight 50,
generator_hidden_size 0.25 (1/3 base); model/optimization.py: Adam eps 1e-6, b1 0.9,
b2 0.999, global-norm clipping at 1.0, the linear decay measured from step 0) and a
transcription of Table 6 (retarfi/language-pretraining's parameter.json). The masking
is ELECTRA's pretrain_helpers.mask: of the chosen 15%, 85% become [MASK] and 15% stay
(no random tokens), at most int((0.15 + 0.005) * 128) = 19 per row. An example ends
with its document (build_pretraining_dataset.py; ELECTRA also splits it into two
segments, bertjax's rows are one).

The released ELECTRA-Small (google/electra-small-*, "ELECTRA-Small++", 77.4 GLUE test)
was trained longer with a full-width generator (the repository's README:
"we did not use a small generator for that model"): add --config.generator.hidden_size=256
--config.generator.num_heads=4 --config.generator.intermediate_size=1024 for its pair.

config.model is the discriminator, exactly google/electra-small-discriminator's
config.json (its 'rtd' head, the replaced-token detector); config.generator holds the
generator's sizes, the rest of its network is config.model's
(`bertjax.model.electra.generator_config`: the embedding tables, which ELECTRA shares
between the two, keep their shapes). The objective is 'rtd' (bertjax/objectives/rtd.py):
the generator's MLM plus lambda = 50 times the discriminator's replaced-token
detection, both networks in one state; export writes the discriminator, fill_mask
uses the generator.

  python -m bertjax.main --config=configs/electra_small.py --workdir=/tmp/electra_small \
      --config.data.corpus='/data/wiki/*.txt' --config.data.tokenizer.path=vocab.txt
"""

import ml_collections

from configs import bert_base, model_section


def get_config(arg=None):
  c = bert_base.get_config(arg)
  # Replaced-token detection: the generator's MLM + lambda x the discriminator's BCE.
  c.objectives = ("rtd",)
  c.rtd = ml_collections.ConfigDict()
  c.rtd.discriminator_weight = 50.0  # lambda (ELECTRA's disc_weight).
  # How the two networks share embeddings: '' the family's (ELECTRA: 'tied', one array;
  # DeBERTa: 'gdes', the generator's table + a residual only the discriminator trains).
  c.rtd.embedding_sharing = ""
  # ELECTRA-Small's discriminator (E=128 projected to H=256, L=12, A=4, BERT's uncased
  # WordPiece vocabulary): the family's defaults (bertjax/model/electra.py).
  c.model = model_section("electra", rtd=True)  # With its replaced-token-detection head.

  # The generator: these sizes replace config.model's (1/4 of the hidden size, FFN size
  # and heads, Table 6); every other field, the embedding width included, is the
  # discriminator's. Read by bertjax.model.electra.generator_config.
  c.generator = ml_collections.ConfigDict()
  c.generator.hidden_size = 64  # H / 4.
  c.generator.num_heads = 1  # A / 4.
  c.generator.intermediate_size = 256  # FFN / 4.
  c.generator.num_layers = 12  # All of the discriminator's layers (ELECTRA's generator_layers 1.0).

  c.data.max_seq_length = 128  # ELECTRA-Small trains on rows of 128 throughout.
  c.data.length_phases = ()
  c.data.max_predictions_per_seq = 19  # int((mask 0.15 + 0.005) * 128), ELECTRA's.
  c.data.masked_lm_prob = 0.15
  c.data.mask_token_prob = 0.85  # ELECTRA's masking: 85% [MASK] ...
  c.data.random_token_prob = 0.0  # ... no random tokens, 15% unchanged.
  c.data.packing = "doc_sentences"  # A row ends with its document, as ELECTRA's examples.
  c.train.batch_size = 128
  c.train.num_steps = 1_000_000
  c.train.learning_rate = 5e-4
  c.train.warmup_steps = 10_000
  return c
