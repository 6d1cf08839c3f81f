"""DeBERTa-v3-large (He et al. 2021, arXiv 2111.09543): configs/deberta_v3_base.py at
large's shape: 24 layers, H=1024, I=4096, A=16 (Hugging Face's `microsoft/deberta-v3-large`
config.json); 435,191,908 parameters with the MLM head (434,012,160 in the encoder:
Hugging Face's counts, tests/test_deberta_numerics.py). GLUE 91.37 in the paper (its
abstract), by replaced-token detection: the generator has half the depth, 12 layers
(rtd_large.json `generator`).

Pretraining as the base recipe, from the authors' released code (github:microsoft/DeBERTa
experiments/language_model/rtd.sh `deberta-v3-large`: batch 256, 10,000 warm-up steps,
learning rate 1e-4, 1,000,000 steps, rows of 512; rtd_large.json `discriminator`: dropout
0.1, LayerNorm eps 1e-7, initializer range 0.02): see configs/deberta_v3_base.py for
every number's source and how the two networks train.

  python -m bertjax.main --config=configs/deberta_v3_large.py --workdir=gs://bucket/dv3l \
      --config.data.corpus=/data/prepared --config.data.tokenizer.path=/data/prepared/tokenizer
"""

from configs import deberta_v3_base


def get_config(arg=None):
  c = deberta_v3_base.get_config(arg)
  c.model.hidden_size = 1024  # H.
  c.model.num_layers = 24  # L.
  c.model.num_heads = 16  # A (64 each).
  c.model.intermediate_size = 4096  # 4H.
  c.generator.num_layers = 12  # rtd_large.json `generator`.
  return c
