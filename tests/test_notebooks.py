"""The Colab notebooks (launch/colab/*.ipynb) run top to bottom in a fresh kernel with
small settings in place of their parameter cell, and every notebook in the repository
is committed without outputs.

The kernels run on one CPU device (a notebook on Colab sees the runtime's devices, not
the suite's 8 fake ones) and inherit the suite's JAX_COMPILATION_CACHE_DIR
(tests/conftest.py), so a second run of the suite compiles little."""

import ast
import glob
import os
import re

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLAB = os.path.join(ROOT, "launch", "colab")
NOTEBOOKS = ("pretrain.ipynb", "finetune.ipynb", "embeddings.ipynb")

# Small settings per notebook: each name must be one its parameter cell assigns.
CI_PARAMETERS = {
    "pretrain.ipynb": lambda tmp, model: {
        "WORKDIR": str(tmp / "bert_tiny"),
        "OVERRIDES": {
            "train.num_steps": 30, "train.batch_size": 16, "train.warmup_steps": 3,
            "train.log_every": 5, "train.eval_every": 30, "train.checkpoint_every": 30,
            "train.eval_batches": 4, "data.max_seq_length": 64, "data.dupe_factor": 1,
            "model.max_position_embeddings": 64, "data.tokenizer.vocab_size": 1024,
            "model.vocab_size": 1024},
    },
    "finetune.ipynb": lambda tmp, model: {  # a tiny BERT of MiniLM's vocabulary
        "WORKDIR": str(tmp / "finetune"), "NUM_EPOCHS": 1, "TAGGER_EPOCHS": 4,
        "MODEL_DIR": model,
    },
    "embeddings.ipynb": lambda tmp, model: {
        "STATS_TEXTS": 100, "OUT_DIR": str(tmp / "embeddings"),
    },
}


def assigned_names(source: str) -> set[str]:
  return {t.id for node in ast.parse(source).body if isinstance(node, ast.Assign)
          for t in node.targets if isinstance(t, ast.Name)}


def with_parameters(nb, parameters: dict):
  """`nb` with `parameters` assigned at the end of its cell tagged 'parameters'."""
  (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
  unknown = set(parameters) - assigned_names(cell.source)
  assert not unknown, f"not parameters of the notebook: {sorted(unknown)}"
  cell.source += "\n# CI settings\n" + "".join(f"{k} = {v!r}\n" for k, v in parameters.items())
  return nb


def cell_text(cell) -> str:
  """The stream and plain-text outputs of a code cell, joined."""
  parts = []
  for out in cell.get("outputs", []):
    if out.output_type == "stream":
      parts.append(out.text)
    elif "data" in out and "text/plain" in out.data:
      parts.append(out.data["text/plain"])
  return "".join(parts)


def execute(name: str, tmp_path, model: str = "") -> tuple[str, list]:
  """Runs notebook `name` with its CI parameters (`model`: a Hugging Face directory
  for those that take one); returns (the text its code cells printed, stderr and
  displayed values included, and those cells). A cell that raises fails the test
  (nbclient raises CellExecutionError)."""
  nb = with_parameters(nbformat.read(os.path.join(COLAB, name), as_version=4),
                       CI_PARAMETERS[name](tmp_path, model))
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="1", JAX_PLATFORMS="cpu",
             BERTJAX_PLOT="1")  # As a user runs them: the run's plot written.
  client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                   resources={"metadata": {"path": COLAB}})
  client.execute(env=env)
  code = [c for c in nb.cells if c.cell_type == "code"]
  return "".join(cell_text(c) for c in code), code


@pytest.mark.slow
def test_pretrain_notebook(tmp_path):
  text, cells = execute("pretrain.ipynb", tmp_path)
  assert re.search(r"JAX [\d.]+: 1 CPU device", text)
  first, last = map(float, re.search(
      r"train loss ([\d.]+) at step 5 -> ([\d.]+) at step 30", text).groups())
  assert last < first - 0.3, (first, last)
  assert re.search(r"held-out MLM accuracy [\d.]+ at step 30 vs [\d.]+", text)
  # The loop wrote the plot at the end of the run and the notebook shows it.
  assert os.path.getsize(tmp_path / "bert_tiny" / "training.png") > 10_000
  assert any("image/png" in o.get("data", {}) for c in cells for o in c.outputs)
  # Its fill_mask lines (a log line the first apply writes may come between).
  assert re.search(r"please turn \[MASK\] homework in \.\n(?:.*\n)*?  mask 1: \S+ 0\.\d{3}", text)


@pytest.mark.slow
def test_finetune_notebook(tmp_path, tiny_hf_bert):
  """With MODEL_DIR a tiny BERT (the embeddings notebook runs the default, MiniLM)."""
  text, _ = execute("finetune.ipynb", tmp_path, tiny_hf_bert)
  assert re.search(r"encoder: L=1 H=32", text)
  accuracy = float(re.search(r"classifier dev: accuracy ([\d.]+)", text).group(1))
  assert 0.0 <= accuracy <= 1.0
  assert re.search(r"tagger dev: .*\bf1 [\d.]+", text)
  assert len(re.findall(r"^prediction [01]  \S", text, re.M)) == 6
  assert "predicted tags:" in text


@pytest.mark.slow
def test_embeddings_notebook(tmp_path):
  text, cells = execute("embeddings.ipynb", tmp_path)
  raw, standardized = map(float, re.search(
      r"anisotropy raw ([\d.-]+), standardized ([\d.-]+)", text).groups())
  assert abs(standardized) < raw
  accuracy, mfs = map(float, re.search(
      r"1-NN accuracy ([\d.]+)\s+most-frequent-sense ([\d.]+)", text).groups())
  assert accuracy > mfs
  assert os.path.getsize(tmp_path / "embeddings" / "bank.png") > 10_000
  assert any("image/png" in o.get("data", {}) for c in cells for o in c.outputs)


def repository_notebooks() -> list[str]:
  return sorted(p for p in glob.glob(os.path.join(ROOT, "**", "*.ipynb"), recursive=True)
                if "/.ipynb_checkpoints/" not in p)


def test_colab_notebooks_are_the_ones_tested():
  assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(COLAB, "*.ipynb"))) \
      == sorted(NOTEBOOKS)


@pytest.mark.parametrize("path", repository_notebooks(),
                         ids=lambda p: os.path.relpath(p, ROOT))
def test_notebook_is_committed_without_outputs(path):
  nb = nbformat.read(path, as_version=4)
  nbformat.validate(nb)
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert cell.outputs == [] and cell.execution_count is None, (
          f"{os.path.relpath(path, ROOT)} has outputs: clear them before committing "
          "(jupyter nbconvert --clear-output --inplace).")
