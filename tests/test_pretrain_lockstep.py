"""Pretraining in lockstep with PyTorch: bertjax's jitted pretraining step
(`bertjax.train.state.build_trainer`: the family's model and heads, pretraining's
objective, the optimizer and schedule of `config.train`) against transformers' model
of the family trained by a plain PyTorch loop (`bertjax.benchmarks.hf_reference`:
`pretraining_optimizer`, `train_step`), from the same weights (bertjax's, exported
through `bertjax.hf`), on the same batches with the same masks (bertjax's own data
pipeline on a slice of the embedded corpus), step by step:

- BERT, padded rows: `BertForPreTraining` (MLM + NSP sentence pairs), torch AdamW with
  the Trainer's decay grouping, `get_linear_schedule_with_warmup`, `clip_grad_norm_`;
- BERT, packed rows (FULL-SENTENCES, documents isolated): `BertForMaskedLM`;
- ELECTRA, replaced-token detection (configs/electra_tiny.py's pair, its rows: a
  document's sentences a row, padded): transformers' `ElectraForMaskedLM` generator
  and `ElectraForPreTraining` discriminator sharing their embeddings
  (`hf_reference.rtd_pair`), generator MLM + 50 x the discriminator's BCE, AdamW as
  BERT's; the generator's samples drawn from bertjax's Gumbel noise of the step (each
  row's from its own key, `objectives.base.row_keys`; the same noise, each side's own logits: the
  same replaced tokens);
- ModernBERT, padded rows (a document a row): `ModernBertForMaskedLM`, torch-optimi's
  StableAdamW as the authors build it (fully decoupled weight decay off biases and
  norms, no clipping), their schedules (warm-up, held, a restart at a lower peak with
  a new weight decay, then 1-sqrt to alpha_f);
- ModernBERT, packed rows (FULL-SENTENCES, documents isolated);
- ModernBERT, the one-run recipe (configs/modernbert_base.py's pieces, packed rows):
  rows of 16 tokens then 32 with the batch sized by tokens (16 rows, then 8) after a
  batch-size warm-up (8 rows of 16 for 4 steps), the global layers' rope theta 10k
  then 160k (transformers' inverse frequencies set to the phase's theta, as the
  authors' context-extension run starts with the new theta), the restart at the
  second phase's first step, masking at 30% in training.

Packed rows with documents isolated reach transformers as what they mean: each
document of a row its own row (its tokens, the labels at its masked positions), so
that no token sees another document; the loss is the mean over all masked tokens of
the batch either way. No dropout (the issue's recipe trains without it; the
fine-tuning lockstep test gives transformers bertjax's dropout masks).

After every step of 36 (warm-up, the stable phase, the restart, the decay) the losses
agree to 1e-4 (relative), every parameter to 0.1 of the peak learning rate, the
updates (each step's parameter change, as a whole: the norm of the difference over
the norm of PyTorch's change) to 1e-2 and the movement since the start to 1e-3. Adam
and StableAdamW move a parameter by about the learning rate a step: a different
gradient, schedule, decay mask, bias correction, update clipping or weight decay moves
them apart by whole steps; float32 rounding stays far below.

One child process on one CPU device. `python -m tests.test_pretrain_lockstep` prints
the table of docs/pretraining.md (the largest differences of each run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("optimi")
pytestmark = pytest.mark.slow  # six 36-step runs on each side

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 36
LR = 3e-3  # Peak learning rate of both families' runs.
RUNS = ("bert/padded", "bert/packed", "electra/padded", "modernbert/padded",
        "modernbert/packed", "modernbert/recipe")
THETAS = (10_000.0, 160_000.0)  # The recipe run's global rope theta in each length phase.
SENTENCES = 900  # Of the embedded corpus: enough rows for 36 batches of 8.


def write_corpus(directory: str) -> str:
  """The first SENTENCES sentences of the embedded corpus as a text file, two to a
  document (short documents: several in a packed row)."""
  from bertjax.data import sources  # pylint: disable=g-import-not-at-top
  sentences = [s for d in sources.load_documents("embedded") for s in d][:SENTENCES]
  docs = [sentences[i:i + 2] for i in range(0, len(sentences), 2)]
  path = os.path.join(directory, "corpus.txt")
  with open(path, "w") as f:
    f.write("\n\n".join("\n".join(d) for d in docs) + "\n")
  return path


def run_config(run: str, directory: str):
  """The bertjax config of a run: the family's recipe at a tiny size, float32."""
  from tests import modernbert_helpers  # pylint: disable=g-import-not-at-top
  from tests.helpers import tiny_config  # pylint: disable=g-import-not-at-top
  from tests.tasks_helpers import fixture_tokenizer  # pylint: disable=g-import-not-at-top
  family, layout = run.split("/")
  c = tiny_config(num_steps=STEPS, learning_rate=LR, log_every=1)
  c.data.corpus = write_corpus(directory)
  c.data.max_seq_length = 32
  c.data.max_predictions_per_seq = 6
  c.data.eval_fraction = 0.05
  c.data.dupe_factor = 1
  c.data.length_phases = ()
  c.model.max_position_embeddings = 64
  c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
  if family == "electra":
    from tests.rtd_helpers import rtd_config  # pylint: disable=g-import-not-at-top
    e = rtd_config(num_steps=STEPS, learning_rate=LR, log_every=1)
    e.data.update(corpus=c.data.corpus, max_seq_length=32, max_predictions_per_seq=6,
                  eval_fraction=0.05, dupe_factor=1, length_phases=())
    e.model.max_position_embeddings = 64
    e.model.dropout_rate = e.model.attention_dropout_rate = 0.0
    c = e
  if family in ("bert", "electra"):
    if family == "bert":
      c.data.tokenizer.path = fixture_tokenizer(os.path.join(directory, "tok"))
      c.model.vocab_size = 400
    c.train.warmup_steps = 4
    c.train.decay_start = "warmup_end"  # transformers' linear schedule.
    c.train.weight_decay = 0.1  # Large enough to show in 36 steps.
    c.train.max_grad_norm = 0.5  # Clips some steps.
    if layout == "packed":
      c.objectives, c.model.pooler = ("mlm",), False
      c.data.isolate_documents = True
    return c
  c.data.tokenizer.path = modernbert_helpers.modernbert_tokenizer(
      os.path.join(directory, "tok"))
  c.data.tokenizer.kind = "byte_level_bpe"
  c.data.tokenizer.vocab_size = modernbert_helpers.VOCAB
  c.model = modernbert_helpers.model_section(max_position_embeddings=64)
  c.objectives = ("mlm",)
  c.data.masked_lm_prob = 0.3
  c.data.max_predictions_per_seq = 10
  c.data.packing = "doc_sentences" if layout == "padded" else "full_sentences"
  c.data.isolate_documents = layout == "packed"
  c.train.optimizer = "stable_adamw"
  c.train.schedule = "wsd"
  c.train.warmup_steps = 4
  c.train.learning_rate_restarts = ((0.5, LR / 2, 0.05),)  # From step 18.
  c.train.decay_fraction = 0.25  # The last 9 steps ...
  c.train.final_lr_fraction = 0.001  # ... to 0.001 of the restart's peak.
  c.train.weight_decay = 0.1  # Fully decoupled: 0.1 x lr / peak a step.
  c.train.decouple_lr = True
  c.train.b1, c.train.b2, c.train.eps = 0.9, 0.98, 1e-6
  c.train.max_grad_norm = 0.0
  if layout == "recipe":
    c.data.isolate_documents = True
    c.data.packing = "full_sentences"
    c.data.max_predictions_per_seq = 5  # 15% of 32 (held-out rows) ...
    c.data.masked_lm_prob = 0.15
    c.data.masked_lm_prob_phases = ((1.0, 0.3),)  # ... training at 30%.
    c.data.length_phases = ((0.5, 16), (0.5, 32))
    c.model.global_rope_theta_phases = THETAS
    c.model.global_rope_theta = THETAS[-1]
    c.train.batch_by_tokens = True
    c.train.batch_warmup_tokens, c.train.batch_warmup_sizes = 512, 1
  return c


def set_global_theta(hf, theta: float) -> None:
  """transformers' ModernBERT with its global layers' rotary base set to `theta` (its
  inverse frequencies recomputed as its rotary module computes them)."""
  rotary = hf.model.rotary_emb
  rotary.config.rope_parameters["full_attention"]["rope_theta"] = theta
  inv_freq, _ = rotary.compute_default_rope_parameters(rotary.config,
                                                       layer_type="full_attention")
  rotary.full_attention_inv_freq.copy_(inv_freq)


def hf_batch(batch: dict[str, np.ndarray], pad_id: int, nsp: bool) -> dict:
  """transformers' inputs of one bertjax batch: labels [B, T] (-100 but at the masked
  positions); packed rows with `segment_ids` split into a row per document."""
  b, t = batch["input_ids"].shape
  labels = np.full((b, t), -100, np.int64)
  for r in range(b):
    real = batch["masked_lm_weights"][r] > 0
    labels[r, batch["masked_lm_positions"][r][real]] = batch["masked_lm_ids"][r][real]
  if "segment_ids" not in batch:
    out = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
           "labels": labels}
    if "token_type_ids" in batch and nsp is not None:
      out["token_type_ids"] = batch["token_type_ids"]
    if nsp:
      out["next_sentence_label"] = batch["next_sentence_labels"]
    return {k: torch.from_numpy(np.ascontiguousarray(v).astype(np.int64))
            for k, v in out.items()}
  docs = [(r, batch["segment_ids"][r] == s) for r in range(b)
          for s in range(1, int(batch["segment_ids"][r].max()) + 1)]
  n = max(int(at.sum()) for _, at in docs)
  ids = np.full((len(docs), n), pad_id, np.int64)
  doc_labels = np.full((len(docs), n), -100, np.int64)
  mask = np.zeros((len(docs), n), np.int64)
  for i, (r, at) in enumerate(docs):
    k = int(at.sum())
    assert at[np.flatnonzero(at)[0]:][:k].all()  # A document is contiguous.
    ids[i, :k], doc_labels[i, :k], mask[i, :k] = batch["input_ids"][r][at], labels[r][at], 1
  out = {"input_ids": ids, "attention_mask": mask, "labels": doc_labels}
  return {k: torch.from_numpy(v) for k, v in out.items()}


def lockstep(run: str, steps: int = STEPS) -> dict:
  """Trains both for `steps` steps; returns per-step losses, learning rates and the
  differences of parameters and updates."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from bertjax import objectives as objectives_lib  # pylint: disable=g-import-not-at-top
  from bertjax.benchmarks import hf_reference  # pylint: disable=g-import-not-at-top
  from bertjax.data import phases, pipeline  # pylint: disable=g-import-not-at-top
  from bertjax.data import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  from bertjax.hf import convert as hf_convert  # pylint: disable=g-import-not-at-top
  from bertjax.hf import electra as electra_table  # pylint: disable=g-import-not-at-top
  from bertjax.objectives import rtd  # pylint: disable=g-import-not-at-top
  from bertjax.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import pretrain, state as state_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import step as step_lib  # pylint: disable=g-import-not-at-top

  directory = tempfile.mkdtemp(prefix="pretrain_lockstep_")
  c = run_config(run, directory)
  pretrain.check_config(c)
  tokenizer = tok_lib.load_tokenizer(c.data.tokenizer.path)
  objectives = objectives_lib.from_config(c)
  cfg, nsp = objectives.model, pipeline.sentence_pairs(objectives.fields)
  mesh = mesh_lib.create_mesh(c.mesh, jax.devices()[:1])
  setup = state_lib.build_trainer(c, mesh)
  data = pipeline.build_pretraining_data(
      c.data, tokenizer, batch_size=c.train.batch_size, seed=c.seed, nsp=nsp,
      position_offset=cfg.position_offset, num_steps=c.train.num_steps,
      batch_schedule=phases.BatchSchedule.from_config(c.train),
      phase_inputs=pretrain.phase_inputs(c))
  stream = iter(data.train)
  state = setup.init_state(c)

  table = hf_convert.family_table(cfg.family)
  rtd_run = "rtd" in objectives.names
  if rtd_run:  # The pair: discriminator and generator, their parameters prefixed.
    gen_cfg = rtd.generator_config(c, cfg)
    disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(
        **electra_table.hf_config(cfg, electra_table.PRETRAINING),
        attn_implementation="eager"))
    hf = hf_reference.rtd_pair(c, disc, "eager")
    # The generator samples from the whole vocabulary, [PAD] included: a sampled [PAD]
    # at a real position trains its row in bertjax (as google-research/electra, which
    # has no padding index), where torch's Embedding(padding_idx) gives it no gradient.
    disc.electra.embeddings.word_embeddings.padding_idx = None

    def exported(params) -> dict[str, np.ndarray]:
      params = jax.device_get(params)
      return {**{f"generator.{k}": v for k, v in electra_table.export(
                  rtd.generator_params(params), gen_cfg)[1].items()},
              **{f"discriminator.{k}": v for k, v in electra_table.export(
                  params["discriminator"], cfg)[1].items()}}
  else:
    hf_json, _ = table.pretraining_model(cfg)
    model_class = getattr(transformers, hf_json["architectures"][0])
    hf = model_class(model_class.config_class(**hf_json, attn_implementation="eager"))

    def exported(params) -> dict[str, np.ndarray]:
      return table.export_pretrained(jax.device_get(params), cfg, tokenizer,
                                     c.data.tokenizer.kind)[1]

  hf_params = dict(hf.named_parameters())
  start = exported(state.params)
  missing, unexpected = hf.load_state_dict(
      {k: torch.from_numpy(v) for k, v in start.items()}, strict=False)
  assert not unexpected and set(hf_params) <= set(start), (missing, unexpected)
  ref = hf_reference.pretraining_optimizer(hf, c.train)
  out = {"loss": [], "hf_loss": [], "lr": [], "hf_lr": [], "param_diff": [],
         "update_diff": [], "moved_diff": [], "predictions": [], "documents": [],
         "shapes": [], "rows": [], "replaced": []}
  seen = {}

  def loss_fn(outputs, _):
    seen["replaced"] = getattr(outputs, "replaced", None)
    return outputs.loss
  before_ours = {k: start[k] for k in hf_params}
  before_hf = {k: p.detach().numpy().copy() for k, p in hf_params.items()}
  for step in range(steps):
    batch = next(stream)
    if run.endswith("recipe"):  # The length phase's theta, on both sides.
      theta = THETAS[batch["input_ids"].shape[1] == c.data.max_seq_length]
      np.testing.assert_array_equal(batch["global_rope_theta"], theta)
      set_global_theta(hf, theta)
      out["shapes"].append(list(batch["input_ids"].shape))
    inputs = hf_batch(batch, tokenizer.pad_id, {"bert": nsp, "electra": False}.get(cfg.family))
    if rtd_run:  # The step's sampling noise (`rtd.corrupt`), the masked positions' rows.
      positions, weights = batch["masked_lm_positions"], batch["masked_lm_weights"]
      keys = step_lib.row_keys(jax.random.fold_in(jax.random.key(c.seed), step),
                               np.arange(len(positions), dtype=np.int32))  # a row's own
      noise = np.asarray(jax.vmap(lambda k: jax.random.gumbel(
          k, (positions.shape[1], cfg.vocab_size)))(keys))
      rows = []
      for r in range(len(positions)):
        real = np.flatnonzero(weights[r] > 0)
        rows.append(noise[r, real[np.argsort(positions[r][real], kind="stable")]])
      inputs["gumbel"] = torch.from_numpy(np.concatenate(rows))
    out["hf_lr"].append(ref.opt.param_groups[0]["lr"])
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
      state, metrics = setup.train_step(state, mesh_lib.put_batch(batch,
                                                                  setup.batch_sharding))
    out["hf_loss"].append(hf_reference.train_step(hf, inputs, ref.opt, ref.schedule,
                                                  ref.max_grad_norm, loss_fn))
    if rtd_run:  # The replaced share of the real tokens, each side's.
      real = inputs["attention_mask"].float()
      out["replaced"].append((float(metrics["replaced_fraction"]),
                              float((seen["replaced"] * real).sum() / real.sum())))
    out["loss"].append(float(metrics["loss"]))
    out["lr"].append(float(metrics["learning_rate"]))
    out["predictions"].append(int(batch["masked_lm_weights"].sum()))
    out["documents"].append(len(inputs["input_ids"]))
    out["rows"].append(len(batch["input_ids"]))
    ours = exported(state.params)
    worst, d_update, n_update, d_moved, n_moved = (0.0, ""), 0.0, 0.0, 0.0, 0.0
    for k, p in hf_params.items():
      theirs = p.detach().numpy()
      worst = max(worst, (float(np.abs(ours[k] - theirs).max()), k))
      du = (ours[k] - before_ours[k]) - (theirs - before_hf[k])
      d_update += float(np.sum(du * du))
      n_update += float(np.sum((theirs - before_hf[k]) ** 2))
      d_moved += float(np.sum((ours[k] - theirs) ** 2))
      n_moved += float(np.sum((theirs - start[k]) ** 2))
      before_hf[k] = theirs.copy()
    before_ours = {k: ours[k] for k in hf_params}
    out["param_diff"].append(worst)
    out["update_diff"].append((d_update / max(n_update, 1e-30)) ** 0.5)
    out["moved_diff"].append((d_moved / max(n_moved, 1e-30)) ** 0.5)
  out["moved"] = max(float(np.abs(p.detach().numpy() - start[k]).max())
                     for k, p in hf_params.items())
  out["warmup_steps"] = c.train.warmup_steps
  out["num_steps"] = c.train.num_steps
  return out


def run_all() -> dict:
  """Every run of RUNS ('family/layout' -> its result, or {'error': the exception's last
  lines}), in this process, torch on one thread."""
  import traceback  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(1)
  out = {}
  for run in RUNS:
    try:
      out[run] = lockstep(run)
    except Exception:  # pylint: disable=broad-except
      out[run] = {"error": traceback.format_exc()[-3000:]}
  return out


@pytest.fixture(scope="module")
def runs() -> dict:
  """`run_all` in a child process on one CPU device."""
  code = ("import json; from tests.test_pretrain_lockstep import run_all; "
          "print('RESULT', json.dumps(run_all()))")
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="1")
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                        capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
  out = json.loads(line[len("RESULT "):])
  print("\n" + "\n".join(summary(out)))  # The figures (pytest -s shows them).
  return out


def result(runs: dict, run: str) -> dict:
  r = runs[run]
  assert "error" not in r, r.get("error")
  return r


@pytest.mark.parametrize("run", RUNS)
def test_lockstep(runs, run):
  r = result(runs, run)
  steps = len(r["loss"])
  assert 0 < r["warmup_steps"] < steps == r["num_steps"]  # Warm-up, ..., the decay.
  for step, (ours, theirs) in enumerate(zip(r["loss"], r["hf_loss"])):
    assert ours == pytest.approx(theirs, rel=1e-4), f"loss at step {step}"
  for step, (ours, theirs) in enumerate(zip(r["lr"], r["hf_lr"])):
    assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-9 * LR), f"lr at step {step}"
  for step, (diff, key) in enumerate(r["param_diff"]):
    assert diff < 0.1 * LR, f"{key} after step {step}: {diff:.3g} apart"
  # Step 0 trains at lr 0 (bertjax) and 1e-10 x peak (Composer): no update to compare.
  for step in range(1, steps):
    assert r["update_diff"][step] < 1e-2, f"the updates of step {step} differ"
    assert r["moved_diff"][step] < 1e-3, f"the movement after step {step} differs"
  assert r["moved"] > 3 * LR  # The parameters moved.


def test_the_runs_exercise_what_they_claim(runs):
  """Packed rows hold several documents (transformers gets more rows than bertjax);
  ELECTRA's generator replaces the same tokens on both sides; the ModernBERT schedule restarts at half the peak and decays to 0.001 of it."""
  for run in RUNS:
    r = result(runs, run)
    several = any(d > rows for d, rows in zip(r["documents"], r["rows"]))
    assert several == (not run.endswith("padded")), run
  # ELECTRA: the same tokens replaced on both sides, a share of the rows every step.
  replaced = result(runs, "electra/padded")["replaced"]
  assert len(replaced) == STEPS and all(0 < ours == pytest.approx(theirs, abs=1e-6)
                                        for ours, theirs in replaced), replaced
  lr = result(runs, "modernbert/packed")["hf_lr"]
  assert max(lr) == pytest.approx(LR) and lr[18:27] == [pytest.approx(LR / 2)] * 9
  assert lr[-1] < LR / 2 * 0.2
  # The recipe: warm-up batches of 8 rows of 16, then 16 rows of 16, then 8 of 32.
  shapes = result(runs, "modernbert/recipe")["shapes"]
  assert shapes == [[8, 16]] * 4 + [[16, 16]] * 14 + [[8, 32]] * 18


def summary(runs: dict) -> list[str]:
  """One line per run: the largest differences over its steps (docs/pretraining.md);
  the updates from step 1 on (step 0 trains at lr 0 in bertjax, 1e-10 x peak in
  Composer's schedule)."""
  lines = []
  for key, r in runs.items():
    if "error" in r:
      lines.append(f"{key}: ERROR {r['error'][-800:]}")
      continue
    loss = max(abs(a - b) / abs(b) for a, b in zip(r["loss"], r["hf_loss"]))
    lr = max(abs(a - b) for a, b in zip(r["lr"], r["hf_lr"]))
    diff, param = max(map(tuple, r["param_diff"]))
    update, moved = max(r["update_diff"][1:]), max(r["moved_diff"][1:])
    lines.append(f"{key}: {len(r['loss'])} steps; loss {loss:.1e} (relative); lr "
                 f"{lr:.1e}; a parameter {diff:.1e} ({diff / LR:.1e} x peak lr, {param}); "
                 f"a step's update {update:.1e}, the movement {moved:.1e} (relative); "
                 f"moved {r['moved']:.1e}")
  return lines


if __name__ == "__main__":  # python -m tests.test_pretrain_lockstep: the figures.
  print("\n".join(summary(run_all())))
