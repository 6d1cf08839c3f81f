"""nomic_bert_tiny: the NomicBERT family at a CPU's size (configs/gte_tiny.py's sizes,
corpus and bert_tiny's schedule): 2 post-LN layers, H=128, A=2, SwiGLU of 256, rotary
base 1,000, 4,096 WordPiece ids trained on the Python documentation that ships with
every Python; configs/nomic_bert_base.py's masking (30% in training, 15% held out), MLM
alone. It reproduces no paper table.

  python -m bertjax.main --config=configs/nomic_bert_tiny.py --workdir=/tmp/nomic_tiny
  python -m bertjax.fill_mask --checkpoint=/tmp/nomic_tiny "please turn [MASK] homework in ."
"""

from configs import gte_tiny, nomic_bert_base


def get_config(arg=None):
  return gte_tiny.tiny(nomic_bert_base, "nomic_bert", arg)
