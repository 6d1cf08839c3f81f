"""Pretraining fidelity: held-out masked-LM of bertjax's pretraining against the PyTorch
loop (transformers' model of the family, `hf_reference.pretraining_optimizer` and
`train_step`) on real text, over seeds, with each process's whole time.

  python -m benchmarks pretrain_fidelity --seeds=0,1,2 --arms=hf,bertjax,\
bertjax_stream,bertjax_per_token,bertjax_specials,bertjax_numpy_rng,bertjax_normal_init,\
bertjax_hf_init
  python -m benchmarks pretrain_fidelity --config=configs/bert_tiny.py
  python -m benchmarks pretrain_fidelity --layout=lines --packages=all --max_mb=8 \
      --held_out_rows=packed --arms=hf,bertjax,bertjax_lines_apart

The text: the docstrings of the installed Python packages (`docstrings.documents`: the
standard library and the packages of --packages, in sorted files), --layout: each
docstring of 8 words or more a document, its whitespace collapsed into one line
('one_line'), or each of 2 lines or more a document of its lines, one a line, each
line's whitespace collapsed ('lines': a document of several lines, as BERT's corpus
layout); --max_mb of it; --held_out of the documents held out (a fixed draw). One
tokenizer for every arm, trained by bertjax on the training documents' text (the
family's kind). The recipes (`recipe`, of --config's family; any field can be
overridden, --config.FIELD=VALUE):
- modernbert (configs/modernbert_tiny.py): its model (L=4, H=128, A=4, I=192, a window of 32,
  global attention every third layer, theta 160k / 10k) with one length (rows of 128),
  no dropout, 30% masking (80/10/10), rows packed across documents with a separator
  between two and without isolation (the recipe's rows isolate them, no separator),
  StableAdamW (fully decoupled weight decay 1e-5 off norms and biases, betas 0.9 / 0.98,
  eps 1e-6, no clipping), lr 3e-3 after 100 warm-up steps, held, 1-sqrt to 0 over the
  last 20%, batch 32, 800 steps;
- bert (configs/bert_tiny.py): its recipe (L=2, H=128, A=2, WordPiece, AdamW, 15%, linear decay,
  clipping 1.0, batch 32, 1,500 steps) without NSP (MLM on packed rows both sides).
The arms, each in a process of its own (`--only`), timed whole (start to exit):
- `hf`: `hf_loop`: transformers' model built from the same config (its own
  initialisation, `torch.manual_seed(seed)`), the training documents' lines each
  tokenized alone by the tokenizer's Hugging Face export (transformers' run_mlm.py on a
  text file: a line an example), concatenated into one stream and cut into rows of
  T - 2 tokens between [CLS] and [SEP], a new order every epoch,
  `DataCollatorForLanguageModeling` at the recipe's rate (80/10/10);
- `bertjax`: `bertjax.train.pretrain.run` with the recipe (bertjax's own data
  pipeline: a document's lines as one running text, `data.line_breaks='space'`),
  exported through `bertjax.hf`; `bertjax_<variant>`: the same with one of VARIANTS
  changed (what differs from the loop by design; `bertjax_hf_init` starts from the
  loop's initial weights through `config.init_from`).
Every model is scored by `score` on the same rows, 15% of their tokens masked
(80/10/10) by a fixed draw: --held_out_rows 'documents' (each held-out document alone,
[CLS] document [SEP], longer ones in windows of T - 2) or 'packed' (the loop's rows of
the held-out documents), each document's lines tokenized each alone ('lines', the
loop's way) and as one running text ('running', bertjax's default): the two differ
only where a document has several lines, and a model scores best on the way it was
trained (docs/pretraining.md). Prints each run and each arm's mean and standard
deviation over seeds; results go to --json, scores of a finished model are kept in
runs.json (a rerun with other held-out rows scores the same models again).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import statistics
import subprocess
import sys
import time

import ml_collections
import numpy as np
from absl import flags
from ml_collections import config_flags

from benchmarks import docstrings
from bertjax import writes

_START = time.time()  # This process's start, near enough (its imports come after).

EVAL_RATE = 0.15  # Held-out masking (the ModernBERT authors evaluate at 15%).
EVAL_SEED = 1234  # The held-out masks' draw, the same for every model.

# bertjax_<name> -> the config fields ("section.field") that arm changes, and why.
VARIANTS = {
    # The documents' tokens back to back, no separator token between documents.
    "stream": {"data.packing": "stream"},
    # Each document of a packed row attending only to itself (positions restarting), as
    # configs/modernbert_base.py and modernbert_tiny.py pack; with and without the
    # separators between documents.
    "isolated": {"data.isolate_documents": True},
    "stream_isolated": {"data.packing": "stream", "data.isolate_documents": True},
    # Each token chosen with probability p (transformers' collator, the authors'),
    # instead of round(p x candidates) per row; room for the draws above the mean.
    "per_token": {"data.masked_lm_draw": "per_token", "data.max_predictions_per_seq": 30},
    # [CLS] and [SEP] may be chosen too (the authors' packer masks any non-padding).
    "specials": {"data.mask_special_tokens": True},
    # Masks drawn from numpy's PCG64 (one Generator a batch) instead of bertjax's
    # per-row SplitMix64 streams (`masking.RowStreams`).
    "numpy_rng": {},
    # An untruncated normal initialisation (transformers'), instead of BERT's truncated
    # at 2 standard deviations (google-research/bert's).
    "normal_init": {"model.initializer_cutoff_factor": 0.0},
    # Each line of a document tokenized alone (`lines_apart`: the loop's rows, its first
    # word as a text's first word), instead of the lines as one running text.
    "lines_apart": {"data.line_breaks": "apart"},
    # The loop's own initial weights for the seed (`save_hf_init`), read through
    # `config.init_from` (`run_arm`), instead of bertjax's draw.
    "hf_init": {},
}
ARMS = ("hf", "bertjax", *(f"bertjax_{v}" for v in VARIANTS))


def write_corpus(directory: str, documents: list[str], held_out: float) -> dict:
  """train.txt and held_out.txt (a document a line, blank lines between: bertjax's text
  format) in `directory`, `held_out` of the documents drawn with a fixed seed."""
  rng = np.random.default_rng(0)
  out = rng.random(len(documents)) < held_out
  paths = {}
  for split, keep in (("train", ~out), ("held_out", out)):
    paths[split] = os.path.join(directory, f"{split}.txt")
    with open(paths[split], "w") as f:
      f.write("\n\n".join(d for d, k in zip(documents, keep) if k) + "\n")
  return {**paths, "documents": len(documents), "held_out_documents": int(out.sum()),
          "mb": round(sum(len(d.encode()) for d in documents) / 1e6, 2)}


def read_documents(path: str) -> list[str]:
  with open(path) as f:
    return [d for d in f.read().split("\n\n") if d.strip()]


def recipe(config, steps: int):
  """bertjax's config of the run (the module docstring): `config` (a recipe file's,
  copied) changed as the family's recipe says, before the paths."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.lock()  # A field the recipe file lacks fails here (renamed upstream).
  steps = steps or (800 if c.model.family == "modernbert" else 1500)
  if c.model.family == "modernbert":
    c.model.global_rope_theta_phases = ()
    c.model.attention_output_dropout = 0.0
    c.data.length_phases = ()
    # Issue 31's setting, the arms' base: rows packed across documents with a separator
    # between two, no isolation (the recipe itself isolates them, with no separator).
    c.data.packing, c.data.isolate_documents = "full_sentences", False
    c.train.batch_warmup_tokens = c.train.batch_warmup_sizes = 0
    c.train.learning_rate_restarts = ()
    c.train.warmup_steps = 100
    c.train.decay_fraction = 0.2
    c.train.final_lr_fraction = 0.0
  else:
    c.objectives, c.model.pooler = ("mlm",), False
  c.model.dtype = "float32"
  c.train.warmup_steps = min(c.train.warmup_steps, steps // 8)  # Short (test) runs.
  c.train.num_steps = steps
  c.train.checkpoint_every = c.train.eval_every = steps
  c.train.eval_batches = 1
  c.train.log_every = max(1, steps // 8)
  c.data.eval_fraction = 1e-6  # bertjax's own held-out: 2 documents (scored: `score`).
  return c


def arm_config(config, steps: int, arm: str, train_path: str, tokenizer: str,
               seed: int):
  """The recipe of `arm` on the corpus, with the shared tokenizer and `seed` (locked:
  a variant's field that the config lacks fails)."""
  c = recipe(config, steps)
  c.seed = seed
  c.data.corpus = train_path
  c.data.tokenizer.path = tokenizer
  for k, v in VARIANTS.get(arm.removeprefix("bertjax_"), {}).items():
    section, field = k.split(".")
    c[section][field] = v
  return c


def train_tokenizer(config, train_path: str, directory: str) -> dict[str, str]:
  """The shared tokenizer, trained by bertjax on the training documents (as text), in
  bertjax's format and as Hugging Face reads it: {'bertjax': dir, 'hf': dir}."""
  from bertjax.data import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  from bertjax.hf import convert, files  # pylint: disable=g-import-not-at-top
  t = config.data.tokenizer
  tok = tok_lib.train_tokenizer(read_documents(train_path), kind=t.kind,
                                vocab_size=t.vocab_size, lowercase=t.lowercase)
  out = {"bertjax": os.path.join(directory, "tokenizer"),
         "hf": os.path.join(directory, "tokenizer_hf")}
  tok.save(out["bertjax"])
  files.save_hf_tokenizer(out["hf"], tok, tokenizer_json=convert.family_table(
      config.model.family).TOKENIZER_JSON)
  return out


def hf_model(config):
  """transformers' model of the run's model (`config.model` with the heads its
  objectives read, as `pretrain.run` builds it; its family's table), initialised by
  transformers."""
  import transformers  # pylint: disable=g-import-not-at-top
  from bertjax import objectives as objectives_lib  # pylint: disable=g-import-not-at-top
  from bertjax.hf import convert  # pylint: disable=g-import-not-at-top
  cfg = objectives_lib.check(config).model
  hf_json, _ = convert.family_table(cfg.family).pretraining_model(cfg)
  cls = getattr(transformers, hf_json["architectures"][0])
  return cls(cls.config_class(**hf_json, attn_implementation="sdpa"))


def save_hf_init(config, seed: int, path: str) -> None:
  """The loop's initial model for `seed` (`hf_loop`'s) saved to `path`."""
  import torch  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  hf_model(config).save_pretrained(path)


def lines_apart(documents: list[str], tokenizer) -> list[list[int]]:
  """Each document's ids: its lines tokenized each alone (a line's first word as a
  text's first), concatenated: how transformers' run_mlm.py reads a text file, a line
  an example (the loop's rows, the held-out rows made the loop's way)."""
  lines = [line for d in documents for line in d.split("\n")]
  ids = iter(tokenizer(lines, add_special_tokens=False)["input_ids"])
  return [[t for _ in d.split("\n") for t in next(ids)] for d in documents]


def running_text(documents: list[str], tokenizer) -> list[list[int]]:
  """Each document's ids: its lines as one running text (joined by a space), as
  bertjax's text reader gives them to the tokenizer by default
  (`data.line_breaks='space'`)."""
  return tokenizer([d.replace("\n", " ") for d in documents],
                   add_special_tokens=False)["input_ids"]


# --held_out_text: how the held-out documents' lines are tokenized.
HELD_OUT_TEXTS = {"lines": lines_apart, "running": running_text}


def stream_rows(documents: list[str], tokenizer, length: int) -> np.ndarray:
  """[N, length] rows of the documents' tokens back to back (no separators; each line
  tokenized alone, `lines_apart`), T - 2 a row between [CLS] and [SEP]; the last
  partial row dropped."""
  ids = np.concatenate([np.asarray(x, np.int64) for x in lines_apart(documents, tokenizer)])
  body = length - 2
  n = len(ids) // body
  rows = np.empty((n, length), np.int64)
  rows[:, 0], rows[:, -1] = tokenizer.cls_token_id, tokenizer.sep_token_id
  rows[:, 1:-1] = ids[:n * body].reshape(n, body)
  return rows


def hf_loop(config, train_path: str, tokenizer_dir: str, seed: int, out_dir: str) -> dict:
  """The PyTorch loop (the module docstring); saves the model to `out_dir`. Returns
  its phases' seconds and counts."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from bertjax.benchmarks import hf_reference  # pylint: disable=g-import-not-at-top
  t0 = time.time()
  torch.manual_seed(seed)
  tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
  rows = stream_rows(read_documents(train_path), tok, config.data.max_seq_length)
  t_data = time.time()
  model = hf_model(config)
  ref = hf_reference.pretraining_optimizer(model, config.train)
  rate = (config.data.masked_lm_prob_phases[0][1] if config.data.masked_lm_prob_phases
          else config.data.masked_lm_prob)
  collate = transformers.DataCollatorForLanguageModeling(tok, mlm_probability=rate,
                                                         seed=seed)
  order = torch.Generator().manual_seed(seed)
  b, perm, losses = config.train.batch_size, [], []
  t_model = time.time()
  for step in range(config.train.num_steps):
    if len(perm) < b:
      perm += torch.randperm(len(rows), generator=order).tolist()
    picked, perm = perm[:b], perm[b:]
    batch = collate([{"input_ids": torch.from_numpy(rows[i])} for i in picked])
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    losses.append(hf_reference.train_step(model, dict(batch), ref.opt, ref.schedule,
                                          ref.max_grad_norm))
    if (step + 1) % 100 == 0:
      print(f"step {step + 1}: loss {np.mean(losses[-100:]):.4f}, "
            f"{time.time() - t_model:.0f} s", file=sys.stderr, flush=True)
  t_steps = time.time()
  model.save_pretrained(out_dir)
  return {"data_s": t_data - t0, "model_s": t_model - t_data, "steps_s": t_steps - t_model,
          "rows": len(rows),
          "final_loss": float(np.mean(losses[-20:])) if losses else float("nan")}


class _NumpyStreams:
  """`masking.RowStreams`'s interface on one numpy Generator (PCG64) for the batch,
  seeded by (seed, the batch's first element): the `bertjax_numpy_rng` arm."""

  def __init__(self, seed: int, index: np.ndarray):
    self._rng = np.random.default_rng([seed, int(np.asarray(index).min())])

  def random(self, shape) -> np.ndarray:
    return self._rng.random(shape)


def bertjax_run(config, workdir: str, out_dir: str, numpy_rng: bool = False) -> dict:
  """`pretrain.run` of `config` in `workdir`, exported to `out_dir`; the seconds of its
  data preparation, its compilations (jax's own account) and the rest."""
  import jax  # pylint: disable=g-import-not-at-top
  from bertjax.checkpoint import pretrained  # pylint: disable=g-import-not-at-top
  from bertjax.data import masking, pipeline  # pylint: disable=g-import-not-at-top
  from bertjax.hf import convert  # pylint: disable=g-import-not-at-top
  from bertjax.train import pretrain  # pylint: disable=g-import-not-at-top
  t0 = time.time()
  spent = {"data_s": 0.0, "compile_s": 0.0}
  build = pipeline.build_pretraining_data

  def timed_build(*args, **kwargs):
    start = time.time()
    try:
      return build(*args, **kwargs)
    finally:
      spent["data_s"] += time.time() - start

  def on_event(event: str, seconds: float, **_):
    if event.startswith("/jax/core/compile/") or event.startswith("/jax/compilation_cache/"
                                                                  "cache_retrieval"):
      spent["compile_s"] += seconds

  jax.monitoring.register_event_duration_secs_listener(on_event)
  pipeline.build_pretraining_data = timed_build
  streams = masking.RowStreams
  if numpy_rng:
    masking.RowStreams = _NumpyStreams
  try:
    pretrain.run(config, workdir)
  finally:
    pipeline.build_pretraining_data, masking.RowStreams = build, streams
    jax.monitoring.unregister_event_duration_listener(on_event)
  run_s = time.time() - t0
  p = pretrained.load_pretrained(workdir)
  convert.save_hf(out_dir, p.params, p.config, p.tokenizer)
  return {**spent, "run_s": run_s, "steps_s": run_s - spent["data_s"] - spent["compile_s"]}


def eval_rows(documents: list[str], tokenizer, length: int, mask_id: int,
              vocab_size: int, rows: str = "documents", text: str = "lines"
              ) -> list[dict[str, np.ndarray]]:
  """Batches of 64 held-out rows, 15% of each row's non-special tokens masked
  (80/10/10, random tokens uniform over the non-special ids) by the fixed draw
  EVAL_SEED: input_ids, attention_mask, labels (-100 but at the masked positions).

  rows='documents': each document alone ([CLS] document [SEP], windows of T - 2);
  'packed': the documents' tokens back to back cut into rows of T - 2 between [CLS]
  and [SEP] (the loop's training rows, `stream_rows`; the last partial row kept).
  text: how a document's lines are tokenized (HELD_OUT_TEXTS: 'lines' each alone, the
  loop's way; 'running' as one running text, bertjax's default).
  """
  special = set(tokenizer.all_special_ids)
  body = length - 2
  ids_of = HELD_OUT_TEXTS[text](documents, tokenizer)
  if rows == "packed":
    ids_of = [[t for ids in ids_of for t in ids]]
  out_rows = []
  for ids in ids_of:
    for i in range(0, len(ids), body):
      out_rows.append([tokenizer.cls_token_id, *ids[i:i + body], tokenizer.sep_token_id])
  rng = np.random.default_rng(EVAL_SEED)
  pool = np.asarray([i for i in range(vocab_size) if i not in special])
  out = []
  for start in range(0, len(out_rows), 64):
    chunk = out_rows[start:start + 64]
    n = max(map(len, chunk))
    ids = np.full((len(chunk), n), tokenizer.pad_token_id, np.int64)
    labels = np.full((len(chunk), n), -100, np.int64)
    mask = np.zeros((len(chunk), n), np.int64)
    for r, row in enumerate(chunk):
      ids[r, :len(row)], mask[r, :len(row)] = row, 1
      candidates = np.asarray([p for p, x in enumerate(row) if x not in special])
      chosen = rng.choice(candidates, max(1, round(EVAL_RATE * len(candidates))),
                          replace=False)
      labels[r, chosen] = ids[r, chosen]
      u = rng.random(len(chosen))
      random_ids = pool[rng.integers(0, len(pool), len(chosen))]
      ids[r, chosen] = np.where(u < 0.8, mask_id, np.where(u < 0.9, random_ids,
                                                            ids[r, chosen]))
    out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
  return out


def score(model_dir: str, batches: list[dict[str, np.ndarray]]) -> dict[str, float]:
  """Held-out MLM accuracy and loss (means over the masked tokens) of the
  transformers model in `model_dir`."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  model = transformers.AutoModelForMaskedLM.from_pretrained(model_dir).eval()
  loss = correct = count = 0.0
  with torch.no_grad():
    for b in batches:
      logits = model(input_ids=torch.from_numpy(b["input_ids"]),
                     attention_mask=torch.from_numpy(b["attention_mask"])).logits
      labels = torch.from_numpy(b["labels"])
      at = labels != -100
      loss += float(torch.nn.functional.cross_entropy(logits[at], labels[at],
                                                      reduction="sum"))
      correct += float((logits[at].argmax(-1) == labels[at]).sum())
      count += float(at.sum())
  return {"accuracy": correct / count, "loss": loss / count, "masked": int(count)}


def define_flags() -> None:
  config_flags.DEFINE_config_file(
      "config", "configs/modernbert_tiny.py", "The family's recipe file (changed as the "
      "module docstring says; its fields as --config.FIELD=VALUE).", lock_config=True)
  flags.DEFINE_list("arms", ["hf", "bertjax"], f"Any of {ARMS}.")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds.")
  flags.DEFINE_integer("steps", 0, "Steps (0: the recipe's, 800 / 1,500).")
  flags.DEFINE_list("packages", list(docstrings.PACKAGES), "site-packages joining the "
                    "standard library's docstrings ('all': every one).")
  flags.DEFINE_integer("max_documents", 0, "Use the first this many documents (0: all).")
  flags.DEFINE_enum("layout", "one_line", docstrings.LAYOUTS, "The documents: each "
                    "docstring one line ('one_line'), or its lines kept, one a line "
                    "('lines').")
  flags.DEFINE_float("max_mb", 0, "The documents until their text holds this many MB "
                     "(0: all).")
  flags.DEFINE_enum("held_out_rows", "documents", ("documents", "packed"), "Held-out "
                    "rows: each document alone, or the documents back to back cut into "
                    "rows (the loop's training rows).")
  flags.DEFINE_float("held_out", 0.05, "Share of the documents held out.")
  flags.DEFINE_string("dir", "", "Working directory (default: a new one in /tmp); a "
                      "rerun with the same one keeps the runs done.")
  flags.DEFINE_integer("torch_threads", 0, "torch's intra-op threads (0: its default).")
  flags.DEFINE_integer("jobs", 1, "Runs at once, each pinned to a core of its own (the "
                       "times of runs side by side compare; of runs beside others, not).")
  flags.DEFINE_string("json", "", "Results file (default: DIR/results.json).")
  flags.DEFINE_string("only", "", "Internal: run this arm here and print its result.")
  flags.DEFINE_integer("seed", 0, "Internal: --only's seed.")


def run_arm(f, arm: str, seed: int, directory: str, setup: dict) -> dict:
  """One arm and seed in this process (`--only`); returns its timings."""
  out_dir = os.path.join(directory, f"{arm}_seed{seed}", "hf")
  c = arm_config(f.config, f.steps, arm, setup["train"], setup["tokenizer"]["bertjax"],
                 seed)
  if arm == "hf":
    return hf_loop(c, setup["train"], setup["tokenizer"]["hf"], seed, out_dir)
  if arm == "bertjax_hf_init":
    c.init_from = os.path.join(directory, f"{arm}_seed{seed}", "init")
    save_hf_init(c, seed, c.init_from)
  return bertjax_run(c, os.path.join(directory, f"{arm}_seed{seed}", "workdir"), out_dir,
                     numpy_rng=arm == "bertjax_numpy_rng")


def prepare(f, directory: str) -> dict:
  """The corpus and the shared tokenizer in `directory` (once: read back after)."""
  path = os.path.join(directory, "setup.json")
  writes.claim(directory, writes.BENCHMARK, "pretrain_fidelity", flag="--dir")
  writes.record(directory, writes.BENCHMARK, "pretrain_fidelity")
  if os.path.exists(path):
    with open(path) as fh:
      return json.load(fh)
  documents = docstrings.documents(docstrings.roots(list(f.packages)), f.layout,
                                  int(f.max_mb * 1e6))
  if f.max_documents:
    documents = documents[:f.max_documents]
  setup = write_corpus(directory, documents, f.held_out)
  setup["tokenizer"] = train_tokenizer(f.config, setup["train"], directory)
  with open(path, "w") as fh:
    json.dump(setup, fh)
  return setup


def summary(xs: list[float]) -> dict:
  return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0}


def train_arm(f, arm: str, seed: int, directory: str, cores: queue.Queue) -> dict:
  """Runs `arm` with `seed` in a process of its own (`--only`); with --jobs above 1,
  pinned to a core of `cores` that no other run holds meanwhile, as `taskset` would.
  Its result with the wall time and the load when it started."""
  cmd = [sys.executable, "-m", "benchmarks", "pretrain_fidelity",
         *[a for a in sys.argv if a.startswith("--config")], f"--dir={directory}",
         f"--only={arm}", f"--seed={seed}", f"--steps={f.steps}",
         f"--torch_threads={f.torch_threads}"]
  core = cores.get()
  pin = None if f.jobs <= 1 else (lambda: os.sched_setaffinity(0, {core}))
  start, load = time.time(), os.getloadavg()[0]
  log = os.path.join(directory, f"{arm}_seed{seed}.log")  # The run's stderr.
  try:
    with open(log, "w") as err:
      done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                            check=False, preexec_fn=pin)
  finally:
    cores.put(core)
  if done.returncode:
    with open(log) as err:
      raise SystemExit(f"{arm}/{seed} failed:\n{err.read()[-3000:]}")
  (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
  return {**json.loads(line[len("RESULT "):]), "wall_s": time.time() - start, "load": load,
          "scores": {}}


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  unknown = sorted(set(f.arms) - set(ARMS))
  if unknown:
    raise SystemExit(f"--arms: unknown {unknown}; use {ARMS}.")
  if f.torch_threads:
    import torch  # pylint: disable=g-import-not-at-top
    torch.set_num_threads(f.torch_threads)
  family = f.config.model.family
  directory = f.dir or os.path.join("/tmp", f"pretrain_fidelity_{family}_{os.getpid()}")
  setup = prepare(f, directory)
  if f.only:
    result = run_arm(f, f.only, f.seed, directory, setup)
    result["process_s"] = time.time() - _START
    print("RESULT " + json.dumps(result), flush=True)
    return
  import transformers  # pylint: disable=g-import-not-at-top
  tok = transformers.AutoTokenizer.from_pretrained(setup["tokenizer"]["hf"])
  c = recipe(f.config, 1)
  held_out = read_documents(setup["held_out"])
  # The held-out rows of --held_out_rows, each text of HELD_OUT_TEXTS (equal unless the
  # documents have several lines): scores under "ROWS/TEXT" in each run.
  batches = {f"{f.held_out_rows}/{text}": eval_rows(
      held_out, tok, c.data.max_seq_length, tok.mask_token_id, c.model.vocab_size,
      f.held_out_rows, text) for text in HELD_OUT_TEXTS}
  print(f"corpus: {setup['documents']} documents ({setup['mb']} MB), "
        f"{setup['held_out_documents']} held out; {directory}", flush=True)
  runs = {}
  results_path = os.path.join(directory, "runs.json")
  if os.path.exists(results_path):
    with open(results_path) as fh:
      runs = json.load(fh)
  todo = [(arm, seed) for seed in map(int, f.seeds) for arm in f.arms
          if f"{arm}/{seed}" not in runs]
  cores = queue.Queue()
  for k in range(max(1, f.jobs)):
    cores.put(sorted(os.sched_getaffinity(0))[k % len(os.sched_getaffinity(0))])
  with concurrent.futures.ThreadPoolExecutor(max(1, f.jobs)) as pool:
    trained = {pool.submit(train_arm, f, arm, seed, directory, cores): f"{arm}/{seed}"
               for arm, seed in todo}
    for future in concurrent.futures.as_completed(trained):
      runs[trained[future]] = future.result()
      with open(results_path, "w") as fh:  # Each run kept as it finishes.
        json.dump(runs, fh, indent=1)
  for seed in map(int, f.seeds):
    for arm in f.arms:
      key = f"{arm}/{seed}"
      r = runs[key]
      for name, rows in batches.items():  # A model is scored once on each kind of rows.
        if name not in r["scores"]:
          r["scores"][name] = score(os.path.join(directory, f"{arm}_seed{seed}", "hf"),
                                    rows)
      with open(results_path, "w") as fh:
        json.dump(runs, fh, indent=1)
      print(f"{key}: held-out accuracy / loss " + "; ".join(
          f"{name} {r['scores'][name]['accuracy']:.4f} / {r['scores'][name]['loss']:.4f}"
          for name in batches) + f", {r['wall_s']:.0f} s (load {r['load']:.1f})",
          flush=True)
  out = {}
  for arm in f.arms:
    done = [runs[f"{arm}/{s}"] for s in map(int, f.seeds)]
    out[arm] = {"wall_s": summary([r["wall_s"] for r in done]), "scores": {
        name: {k: summary([r["scores"][name][k] for r in done]) for k in ("accuracy", "loss")}
        for name in batches}}
    w = out[arm]["wall_s"]
    print(f"{arm} ({len(done)} seeds): " + "; ".join(
        f"{name} accuracy {m['accuracy']['mean']:.4f} +- {m['accuracy']['std']:.4f}, loss "
        f"{m['loss']['mean']:.3f} +- {m['loss']['std']:.3f}"
        for name, m in out[arm]["scores"].items()) + f"; time {w['mean']:.0f} +- "
        f"{w['std']:.0f} s")
  with open(f.json or os.path.join(directory, "results.json"), "w") as fh:
    json.dump({"family": family, "setup": setup, "arms": out, "runs": runs}, fh, indent=1)
