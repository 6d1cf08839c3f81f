"""Replaced-token detection ('rtd', ELECTRA's: Clark et al. 2020, google-research/electra
run_pretraining.py): a generator, a small masked LM of the discriminator's family
(its sizes `config.generator`, `FamilyConfig.generator`), predicts the
masked tokens; a token sampled from its softmax (Gumbel-max at temperature 1, from
the whole vocabulary, no gradient through the sample: ELECTRA's `sample_from_softmax`
with `disallow_correct=False`) replaces each masked position of the ORIGINAL row
(ELECTRA's `unmask` then `scatter_update`; a prediction of weight 0 replaces
nothing); the discriminator's 'rtd' head predicts at every non-padding position
(`attention_mask`; [CLS] and [SEP] included, as ELECTRA's `input_mask`; a held-out
batch's filler rows count nothing: `real_tokens`) whether its token was replaced: a
sample equal to the original counts as original.

A row's samples are drawn from its own key (`corrupt`): in training the step's key of
the row (`bertjax.objectives.base.row_keys`: the step's key and the row's index in the
step's batch, `Objective.row_keys`), held out `EVAL_SEED`'s key of the row (its index
in the held-out batch). So a row is corrupted alike in one batch, in any micro-batch
of gradient accumulation and on any device of the mesh, and an accumulated step
without dropout equals the whole batch's (tests/test_rtd.py). (Before per-row keys,
one key drew the whole [B, P, V] noise of a batch or micro-batch: a seed's run now
samples other tokens than it did then; the generator's dropout and the discriminator's
keep their keys.)

  loss = generator MLM (mean cross-entropy over the predictions)
         + lambda x discriminator BCE (mean over the non-padding tokens)

lambda is `config.rtd.discriminator_weight` (ELECTRA's disc_weight, 50).

Parameters: one tree {'discriminator': {'encoder', 'rtd'}, 'generator': {'encoder',
'mlm'}} under one optimizer state and one checkpoint. The networks share their
embeddings as each paper does (`config.rtd.embedding_sharing`, default the family's,
`SHARING`):
- 'tied' (ELECTRA's "electra/embeddings" scope): word, position and token-type tables
  and their LayerNorm (`TIED`) are one array each, in the discriminator's tree only;
  the generator reads them there (`generator_params`) and its MLM head decodes with
  the shared word table; each network keeps its own embedding projection.
- 'gdes' (DeBERTa-v3's gradient-disentangled embedding sharing, microsoft/DeBERTa
  RTDModel): the generator owns the word (and absolute position) tables (`GDES`); the
  discriminator's tree holds a residual of each, initialised to zero, and reads
  stop_gradient(generator's) + residual (`discriminator_params`): the generator's MLM
  alone trains the shared table, the discriminator only its residual. Folded together
  for export and fine-tuning.
The generator is `config.model` at `config.generator`'s sizes (`FamilyConfig.generator`:
ELECTRA 1/4 to 1/2 the width, DeBERTa-v3 half the depth; a size of 0 the family's
fraction, `GENERATOR_FRACTIONS`). Continued pretraining (`bertjax.train.continued`)
puts a discriminator's and a generator's checkpoints in the tree as the sharing says
(`Networks.place`). Export takes the
discriminator (`Networks.exported`); the generator (`load_pretrained(...,
network='generator')`, fill_mask) is assembled with what it shares.

Metrics: generator_loss, generator_accuracy (its argmax at the masked positions),
rtd_loss (the BCE), rtd_accuracy, rtd_precision and rtd_recall of "replaced" (logit >
0), replaced_fraction (of the non-padding tokens).

Shapes: B batch, T length, P predictions per row, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from bertjax import model as model_lib
from bertjax.errors import ConfigError
from bertjax.objectives import mlm
from bertjax.objectives.base import (Network, Networks, Objective, apply, example_weights,
                                     row_keys)

# The family's embedding sharing (config.rtd.embedding_sharing overrides it).
SHARING = {"electra": "tied", "deberta": "gdes"}
# 'tied': the generator's parameters under encoder/embeddings that are the discriminator's.
TIED = ("word_embeddings", "position_embeddings", "token_type_embeddings", "LayerNorm")
# 'gdes': the tables the discriminator reads as the generator's plus its residual.
GDES = ("word_embeddings", "position_embeddings")
DISCRIMINATOR_WEIGHT = 50.0  # lambda where a config has no config.rtd (ELECTRA's).
# A size config.generator sets to 0: this fraction of the discriminator's (at least 1;
# 1 for a size not listed). ELECTRA: a quarter of the width, heads and FFN at every
# layer (Table 6; configure_pretraining.py generator_hidden_size 0.25); DeBERTa-v3: half
# the depth at the same width (rtd_base.json `generator`).
GENERATOR_FRACTIONS = {"electra": {"hidden_size": 0.25, "num_heads": 0.25,
                                   "intermediate_size": 0.25},
                       "deberta": {"num_layers": 0.5}}
EVAL_SEED = 0  # the sampling key of held-out batches (no rng in evaluation)


def _rtd_settings(config) -> dict:
  return dict(config.get("rtd") or {})


def discriminator_weight(config) -> float:
  """lambda: `config.rtd.discriminator_weight`, ELECTRA's 50 without it."""
  return float(_rtd_settings(config).get("discriminator_weight", DISCRIMINATOR_WEIGHT))


def embedding_sharing(config, family: str) -> str:
  """'tied' or 'gdes': `config.rtd.embedding_sharing`, or the family's (`SHARING`)."""
  sharing = _rtd_settings(config).get("embedding_sharing") or SHARING.get(family, "tied")
  if sharing not in ("tied", "gdes"):
    raise ConfigError(f"config.rtd.embedding_sharing={sharing!r}: use 'tied' (ELECTRA's) "
                      "or 'gdes' (DeBERTa-v3's), or '' for the family's.")
  return sharing


def generator_config(config, model) -> Any:
  """The generator's model config: `model` (the discriminator) at `config.generator`'s
  sizes, a size of 0 the family's fraction of the discriminator's
  (`GENERATOR_FRACTIONS`); one-line ConfigErrors without config.generator, or for a
  generator larger than the discriminator."""
  sizes = config.get("generator")
  if not sizes:
    raise ConfigError("the 'rtd' objective needs config.generator (the generator's "
                      "hidden_size, num_heads, intermediate_size, num_layers; "
                      "configs/electra_small.py).")
  fractions = GENERATOR_FRACTIONS.get(model_lib.family_of(model).name, {})
  return model.generator({k: v or max(1, int(getattr(model, k) * fractions.get(k, 1)))
                          for k, v in dict(sizes).items()})


def _embeddings(tree: dict) -> dict:
  return tree["encoder"].get("embeddings", {})


def _with_embeddings(tree: dict, embeddings: dict) -> dict:
  """`tree` with encoder/embeddings replaced (dropped when empty)."""
  encoder = {k: v for k, v in tree["encoder"].items() if k != "embeddings"}
  if embeddings:
    encoder["embeddings"] = embeddings
  return {**tree, "encoder": encoder}


def generator_params(params: dict) -> dict:
  """'tied': the generator's whole tree, its own parameters and the discriminator's
  TIED embeddings."""
  shared = {k: v for k, v in _embeddings(params["discriminator"]).items() if k in TIED}
  return _with_embeddings(params["generator"],
                          {**_embeddings(params["generator"]), **shared})


def discriminator_params(params: dict, stop_gradient: bool = False) -> dict:
  """'gdes': the discriminator's whole tree, each GDES table the generator's
  (stop_gradient in training) plus its residual."""
  gen = _embeddings(params["generator"])
  stop = jax.lax.stop_gradient if stop_gradient else (lambda x: x)
  own = dict(_embeddings(params["discriminator"]))
  for name in GDES:
    if name in own:
      own[name] = jax.tree.map(lambda g, r: stop(g) + r, gen[name], own[name])
  return _with_embeddings(params["discriminator"], own)


def _scatter(ids: jax.Array, positions: jax.Array, values: jax.Array,
             weights: jax.Array) -> jax.Array:
  """`ids` [B, T] with `values` [B, P] written at `positions` [B, P] where `weights` >
  0 (a padding prediction, weight 0, writes nothing). A scatter per row (vmapped: the
  row a batch dimension of the scatter), so rows sharded over the data axis stay on
  their devices (a scatter at [arange(B), positions] all-gathered its indices)."""
  ids = jnp.asarray(ids)
  current = jnp.take_along_axis(ids, positions, axis=1)
  delta = jnp.where(weights > 0, values - current, 0).astype(ids.dtype)
  return jax.vmap(lambda row, at, d: row.at[at].add(d))(ids, positions, delta)


def real_tokens(batch: dict) -> jax.Array:
  """[B, T] float32: 1 at the positions the discriminator is scored on, the non-padding
  tokens of real rows (a held-out batch's filler rows, `example_weights` 0, repeat a
  real row with its masks but none of its predictions, so they count nothing)."""
  return (batch["attention_mask"] > 0).astype(jnp.float32) * example_weights(batch)[:, None]


def sample_keys(key: jax.Array, rows: int) -> jax.Array:
  """[B] the rows' sampling keys: `key` itself where it is [B] keys (the train step's
  `row_keys`), else one a row from the single `key` and the row's index (`row_keys`
  of rows 0 .. B-1)."""
  if key.shape:
    return key
  return row_keys(key, jnp.arange(rows, dtype=jnp.int32))


def corrupt(batch: dict, logits: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(the discriminator's input ids [B, T], is-replaced labels [B, T] int32): the
  original row with a token sampled from the generator's `logits` [B, P, V] (Gumbel-max,
  temperature 1, no gradient) at each masked position; replaced where the token
  differs from the original, at non-padding positions. `key`: [B] keys, a row's
  noise ([P, V] Gumbel) drawn from its own (`jax.random.categorical` vmapped over the
  rows), or one key whose rows' keys `sample_keys` makes."""
  positions = batch["masked_lm_positions"].astype(jnp.int32)
  weights = batch["masked_lm_weights"]
  original = _scatter(batch["input_ids"], positions, batch["masked_lm_ids"], weights)
  keys = sample_keys(key, logits.shape[0])
  sampled = jax.vmap(jax.random.categorical)(keys, jax.lax.stop_gradient(logits)).astype(
      original.dtype)
  corrupted = _scatter(original, positions, sampled, weights)
  return corrupted, ((corrupted != original) & (real_tokens(batch) > 0)).astype(jnp.int32)


def _place(gdes: bool):
  """`Networks.place`: the discriminator's checkpoint at its path, the generator's at
  its own, but for what the two share. 'tied': the discriminator's tables (a generator
  checkpoint's copies of them are left). 'gdes': the generator's tables are its
  checkpoint's, else the discriminator's; the discriminator's residual is its
  checkpoint's table less the generator's, so that what it reads is its checkpoint's."""

  def place(loaded: dict[str, dict]) -> dict:
    disc, gen = loaded.get("discriminator", {}), loaded.get("generator", {})
    out = {("discriminator", *p): v for p, v in disc.items()}
    for p, v in gen.items():
      if not gdes and p[:2] == ("encoder", "embeddings") and p[2] in TIED:
        out.setdefault(("discriminator", *p), v)
      else:
        out[("generator", *p)] = v
    if gdes:
      for p, v in disc.items():
        if p[:2] == ("encoder", "embeddings") and p[2] in GDES:
          shared = out.setdefault(("generator", *p), v)
          out[("discriminator", *p)] = v - shared
    return out

  return place


def networks(config, model) -> Networks:
  """The generator and the discriminator (module docstring)."""
  family = model_lib.family_of(model)
  gen_config = generator_config(config, model)
  disc = family.pretraining(model, ("rtd",))
  gen = family.pretraining(gen_config, ("mlm",))
  weight = discriminator_weight(config)
  gdes = embedding_sharing(config, family.name) == "gdes"

  def init(rng):
    d_rng, g_rng = jax.random.split(rng)
    d, g = disc.init_params(d_rng), gen.init_params(g_rng)
    if gdes:  # The residuals start at zero: the discriminator reads the generator's.
      own = dict(_embeddings(d))
      own.update({k: jax.tree.map(jnp.zeros_like, own[k]) for k in GDES if k in own})
      return {"discriminator": _with_embeddings(d, own), "generator": g}
    own = {k: v for k, v in _embeddings(g).items() if k not in TIED}
    return {"discriminator": d, "generator": _with_embeddings(g, own)}

  def gen_params(params):
    return params["generator"] if gdes else generator_params(params)

  def disc_params(params):
    return discriminator_params(params, True) if gdes else params["discriminator"]

  def forward(params, batch, rng):
    if rng is None:
      gen_rng = disc_rng = None
      sample_key = jax.random.key(EVAL_SEED)
    else:  # The rows' keys where the train step gives them (`Objective.row_keys`).
      gen_rng, sample_key, disc_rng = jax.random.split(rng, 3)
      sample_key = batch.get("row_keys", sample_key)
    logits = apply(gen, gen_params(params), batch, gen_rng)["mlm_logits"]
    corrupted, labels = corrupt(batch, logits, sample_key)
    out = apply(disc, disc_params(params), {**batch, "input_ids": corrupted}, disc_rng)
    return {"mlm_logits": logits, "rtd_logits": out["rtd_logits"], "rtd_labels": labels,
            "rtd_weight": jnp.float32(weight)}

  def flops(batch, seq, predictions):
    """The generator's step at its P predictions and the discriminator's at every
    position (its 'rtd' head among its per-token weights; no MLM head)."""
    terms = {f"generator_{k}": v for k, v in family.train_flops(
        gen_config, batch, seq, predictions).items() if k != "total"}
    terms.update({f"discriminator_{k}": v for k, v in family.train_flops(
        model, batch, seq, 0).items() if k not in ("total", "mlm_head")})
    terms["total"] = sum(terms.values())
    return terms

  return Networks(
      init=init, forward=forward, flops=flops, exported="discriminator", place=_place(gdes),
      members={"discriminator": Network(("discriminator",), model, disc,
                                        assemble=discriminator_params if gdes else None),
               "generator": Network(("generator",), gen_config, gen,
                                    assemble=None if gdes else generator_params)})


def _sums(out: dict, batch: dict) -> dict:
  sums = {k.replace("mlm", "generator"): v
          for k, v in mlm.prediction_sums("mlm", out["mlm_logits"], batch).items()}
  logits, labels = out["rtd_logits"], out["rtd_labels"]
  real = real_tokens(batch)
  bce = jnp.sum(optax.sigmoid_binary_cross_entropy(logits, labels) * real)
  predicted = (logits > 0).astype(jnp.float32) * real
  replaced = labels.astype(jnp.float32) * real
  return {**sums, "rtd_loss": bce, "rtd_weighted_loss": out["rtd_weight"] * bce,
          "rtd_correct": jnp.sum(jnp.where(predicted == replaced, real, 0.0)),
          "rtd_true_positives": jnp.sum(predicted * replaced),
          "rtd_predicted": jnp.sum(predicted), "rtd_replaced": jnp.sum(replaced)}


def _counts(batch: dict) -> dict:
  return {"generator": jnp.sum(batch["masked_lm_weights"]),
          "rtd": jnp.sum(real_tokens(batch))}


def _loss(sums: dict, counts: dict) -> jax.Array:
  return (sums["generator_loss"] / jnp.maximum(counts["generator"], 1.0)
          + sums["rtd_weighted_loss"] / jnp.maximum(counts["rtd"], 1.0))


def _metrics(sums: dict, counts: dict) -> dict:
  n, t = jnp.maximum(counts["generator"], 1.0), jnp.maximum(counts["rtd"], 1.0)
  return {"generator_loss": sums["generator_loss"] / n,
          "generator_accuracy": sums["generator_correct"] / n,
          "rtd_loss": sums["rtd_loss"] / t, "rtd_accuracy": sums["rtd_correct"] / t,
          "rtd_precision": sums["rtd_true_positives"] / jnp.maximum(sums["rtd_predicted"], 1.0),
          "rtd_recall": sums["rtd_true_positives"] / jnp.maximum(sums["rtd_replaced"], 1.0),
          "replaced_fraction": sums["rtd_replaced"] / t}


def _check(config) -> None:
  """'rtd' trains alone (its generator is the run's MLM); lambda is positive."""
  names = tuple(config.objectives)
  if names != ("rtd",):
    raise ConfigError(f"config.objectives={names!r}: 'rtd' trains its own generator (an "
                      "MLM) and discriminator; give config.objectives=('rtd',) alone.")
  embedding_sharing(config, config.model.family)
  if not discriminator_weight(config) > 0:
    raise ConfigError(f"config.rtd.discriminator_weight={discriminator_weight(config)} "
                      "must be positive (ELECTRA's lambda is 50).")


OBJECTIVE = Objective(
    name="rtd", fields=mlm.FIELDS, heads=("rtd",), check=_check, sums=_sums,
    counts=_counts, loss=_loss, metrics=_metrics, networks=networks, row_keys=True,
    metric_names=("generator_loss", "generator_accuracy", "rtd_loss", "rtd_accuracy",
                  "rtd_precision", "rtd_recall", "replaced_fraction"))

