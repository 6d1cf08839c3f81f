"""Both families in bfloat16 (the GPU and TPU default: bf16 activations, float32
weights, float32 softmax and LayerNorm statistics) against Hugging Face in float32, on
padded rows and, for ModernBERT, packed rows: the relative error of every layer's
hidden states and of the MLM logits stays within a bound of bf16 rounding, which a
defect breaks (positions cast to bf16, a padding leak; see BOUND). transformers'
own bf16 (torch.autocast, which keeps norms and softmax in float32) is reported beside
it as the yardstick. On the CPU attention runs on the XLA path; under
`BERTJAX_TEST_PLATFORM=gpu` on cuDNN and the Pallas kernel (the paths a GPU run
takes: see the start-up log)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.hf import convert
from bertjax.model import family_of
from tests.helpers import perturb

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

B, T = 3, 320  # Positions past 256, where bfloat16 stops holding every integer.
LENGTHS = (T, 203, 17)
# The bound on ||ours - fp32|| / ||fp32|| over real positions (the worst layer's hidden
# states; the MLM logits). Measured on the CPU (XLA path): BERT 0.0062 / 0.0082,
# ModernBERT 0.0060 / 0.0078 (transformers' autocast: 0.0026-0.0057; ours keeps the
# residual stream in bf16, autocast in float32). Rotary angles computed in bf16 give
# ModernBERT 0.026 / 0.029, padding keys attended 0.10-0.14. One extra bf16
# rounding (the softmax or the LayerNorm statistics in bf16: 0.0061-0.0081 / 0.0079-
# 0.0101) stays within bf16's own error: no comparison with float32 sees it.
BOUND = 0.015
VOCAB = 512
SMALL = dict(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=4,
             num_attention_heads=4, intermediate_size=256)
SHARPEN = 2.0  # q and k weights doubled: peaked attention, where positions matter.


def _sharpened(model):
  """perturb(model) with q and k weights times SHARPEN (attention logits x4): a random
  model's attention is near uniform, which would hide errors in positions or scores."""
  model = perturb(model)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith(("query.weight", "key.weight")):
        p.mul_(SHARPEN)
      elif name.endswith("Wqkv.weight"):  # [3 * E, E]: q and k first.
        p[:2 * p.shape[0] // 3].mul_(SHARPEN)
  return model


def _bert():
  torch.manual_seed(0)
  config = transformers.BertConfig(**SMALL, max_position_embeddings=T,
                                   attn_implementation="eager")
  return _sharpened(transformers.BertForMaskedLM(config))


def _modernbert():
  torch.manual_seed(0)
  config = transformers.ModernBertConfig(
      **SMALL, global_attn_every_n_layers=3, local_attention=32, pad_token_id=0,
      bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
      max_position_embeddings=T, attn_implementation="eager")
  return _sharpened(transformers.ModernBertForMaskedLM(config))


def _ours(hf_model, dtype):
  """(family, config in `dtype`, params) of the transformers model."""
  state = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
  hf_json = hf_model.config.to_dict()
  cfg, params, _ = convert.table_of(hf_json).load(hf_json, state)
  cfg = dataclasses.replace(cfg, dtype=dtype, param_dtype=jnp.float32)
  return family_of(cfg), cfg, params


def _our_outputs(hf_model, dtype, ids, mask, segment_ids=None):
  """(hidden states [L+1, B, T, E], MLM logits [B, T, V]) float32."""
  family, cfg, params = _ours(hf_model, dtype)

  def both(m, ids, **kw):
    hidden = m.encoder(ids, output_hidden_states=True, **kw)["hidden_states"]
    return hidden.astype(jnp.float32), m(ids, **kw)["mlm_logits"].astype(jnp.float32)

  inputs = dict(attention_mask=jnp.asarray(mask))
  if segment_ids is not None:
    inputs["segment_ids"] = jnp.asarray(segment_ids)
  apply = jax.jit(lambda p, ids, kw: family.pretraining(cfg).apply(
      {"params": p}, ids, method=both, **kw))
  return tuple(np.asarray(x) for x in apply(params, jnp.asarray(ids), inputs))


def _hf_outputs(hf_model, ids, mask=None, bf16=False):
  with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
    out = hf_model(torch.as_tensor(ids, dtype=torch.long), output_hidden_states=True,
                   attention_mask=None if mask is None else torch.as_tensor(mask))
  return (np.stack([h.float().numpy() for h in out.hidden_states]),
          out.logits.float().numpy())


def _relative(ours, ref, real):
  """||ours - ref|| / ||ref|| over the real positions ([..., B, T, X], real [B, T])."""
  d, r = ours[..., real, :], ref[..., real, :]
  return float(np.linalg.norm(d - r) / np.linalg.norm(r))


def _padded():
  rng = np.random.default_rng(0)
  mask = (np.arange(T)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
  ids = np.where(mask > 0, rng.integers(3, VOCAB, (B, T)), 0).astype(np.int32)
  return ids, mask


@pytest.fixture(scope="module", params=["bert", "modernbert"])
def family_model(request):
  return request.param, {"bert": _bert, "modernbert": _modernbert}[request.param]()


@pytest.mark.slow
def test_padded_rows_in_bf16_match_hf_fp32(family_model):
  name, hf_model = family_model
  ids, mask = _padded()
  real = mask.astype(bool)
  ref = _hf_outputs(hf_model, ids, mask)
  theirs = _hf_outputs(hf_model, ids, mask, bf16=True)
  ours = _our_outputs(hf_model, jnp.bfloat16, ids, mask)
  fp32 = _our_outputs(hf_model, jnp.float32, ids, mask)
  errors = {}
  for what, i in (("hidden", 0), ("logits", 1)):
    def rel(o, r, i=i):  # The worst layer's hidden states; the logits.
      return (max(_relative(o[i][k], r[i][k], real) for k in range(len(r[i]))) if i == 0
              else _relative(o[i], r[i], real))
    errors[what] = (rel(ours, ref), rel(theirs, ref), rel(fp32, ref))
    print(f"{name} padded {what}: bertjax bf16 {errors[what][0]:.4f}, transformers "
          f"autocast bf16 {errors[what][1]:.4f}, bertjax fp32 {errors[what][2]:.1e}")
  for what, (ours_bf16, _, ours_fp32) in errors.items():
    assert ours_fp32 < 1e-5, (name, what)
    assert 1e-4 < ours_bf16 < BOUND, (name, what, ours_bf16)  # Really bf16, and close.


def test_packed_rows_in_bf16_match_each_document_in_fp32():
  """ModernBERT's packed rows (the Pallas kernel's case on a GPU) against transformers
  on each document alone in float32."""
  hf_model = _modernbert()
  rng = np.random.default_rng(1)
  docs = [rng.integers(3, VOCAB, n).astype(np.int32) for n in (170, 90, 41)]
  ids, seg = np.zeros((1, T), np.int32), np.zeros((1, T), np.int32)
  at = 0
  for s, doc in enumerate(docs):
    ids[0, at:at + len(doc)], seg[0, at:at + len(doc)] = doc, s + 1
    at += len(doc)
  hidden, logits = _our_outputs(hf_model, jnp.bfloat16, ids, (seg > 0).astype(np.int32),
                                seg)
  refs = [_hf_outputs(hf_model, doc[None]) for doc in docs]
  ref_hidden = np.concatenate([r[0] for r in refs], axis=2)  # [L+1, 1, 301, E]
  ref_logits = np.concatenate([r[1] for r in refs], axis=1)
  real = np.ones((1, at), bool)
  err_hidden = max(_relative(hidden[k][:, :at], ref_hidden[k], real)
                   for k in range(len(ref_hidden)))
  err_logits = _relative(logits[:, :at], ref_logits, real)
  print(f"modernbert packed: hidden {err_hidden:.4f}, logits {err_logits:.4f}")
  assert 1e-4 < err_hidden < BOUND and 1e-4 < err_logits < BOUND
