"""UltraBERT-150M's architecture (dmis-lab; English, 32K context): pre-norm Llama blocks
(RMSNorm eps 1e-6, SwiGLU, no biases), sliding-window layers (an inclusive radius of
128 each side, rotary theta 10,000) with every third layer full (theta 2,560,000), a
two-layer MLM prediction head (GELU-tanh) and an untied decoder.

What is known here, and from where: the model card gives hidden 768 (150M) / 1,024
(380M) and a native 32K context; transformers' `UltrabertConfig` gives the layer
pattern, the window, the thetas, the eps and the prediction head's width (768). Not
available offline: the published config.json's depth, heads, MLP width and vocabulary,
and the authors' pretraining settings. The sizes below are therefore ModernBERT-base's
shape (22 layers, 12 heads, a SwiGLU of 1,152, a 50,368-token BPE) at hidden 768, and
the training is configs/modernbert_base.py's recipe (30% masking, StableAdamW, WSD,
1,024-token rows then the long context) with rows of up to 32,768 tokens: placeholders
to check against the paper before a real run. `python -m bertjax.convert --to=bertjax`
imports the published checkpoints with their own config.json whatever this file says.

  python -m bertjax.main --config=configs/ultrabert_base.py --workdir=gs://bucket/ub \
      --config.data.corpus=/data/prepared --config.data.tokenizer.path=/data/tokenizer
"""

from configs import model_section, modernbert_base

PRETRAIN, CONTEXT, DECAY = modernbert_base.PRETRAIN, modernbert_base.CONTEXT, modernbert_base.DECAY
STEPS = PRETRAIN + CONTEXT + DECAY


def get_config(arg=None):
  c = modernbert_base.get_config(arg)
  c.model = model_section(
      "ultrabert", vocab_size=50368, hidden_size=768, num_layers=22, num_heads=12,
      intermediate_size=1152, pad_token_id=50283)  # Placeholders: module docstring.
  c.data.max_seq_length = 32768  # UltraBERT's native context.
  c.data.length_phases = ((PRETRAIN / STEPS, 1024), (CONTEXT / STEPS, 32768),
                          (DECAY / STEPS, 32768))
  c.data.max_predictions_per_seq = 4920  # >= round(0.15 * 32,766) (evaluation's 15%).
  c.train.batch_size = 144  # Rows of 32,768: 4.7M tokens per step, as ModernBERT's.
  return c
