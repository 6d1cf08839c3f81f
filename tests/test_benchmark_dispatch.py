"""The two benchmark programs: `python -m bertjax.benchmark NAME` runs the package's
measuring tools (bertjax/benchmarks/), `python -m benchmarks NAME` the repository's
reproductions (benchmarks/, run from a checkout's root, not installed). A name has one
home; a reproduction named to the package's program says, in one line, where it went."""

import os
import subprocess
import sys

import pytest

import benchmarks
from benchmarks import __main__ as reproductions
from bertjax import benchmark

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _exit(main, monkeypatch, capsys, *argv: str) -> tuple[int, list[str]]:
  """(exit status, stderr lines) of a dispatcher's `main` on `argv` (this process)."""
  monkeypatch.setattr(sys, "argv", ["prog", *argv])
  with pytest.raises(SystemExit) as e:
    main()
  return e.value.code, capsys.readouterr().err.strip().splitlines()


def test_each_name_has_one_home():
  tools, kept = set(benchmark.available()), set(reproductions.available())
  assert not tools & kept, tools & kept
  assert {"plan", "train", "profile", "data", "soak", "kernels", "hf_reference"} <= tools
  assert {"pretrain_fidelity", "fidelity", "finetune", "electra_claim", "continued_hf",
          "retrieval_example", "search", "gpu", "levers"} <= kept
  assert "__main__" not in kept and os.path.dirname(benchmarks.__file__) == os.path.join(
      REPO, "benchmarks")


@pytest.mark.parametrize("where", ["root", "elsewhere"])
def test_a_reproduction_named_to_the_package_says_where_it_went(
    where, tmp_path, monkeypatch, capsys):
  """From the checkout's root, and from another folder (bertjax installed from this
  checkout: its root is found beside the package)."""
  monkeypatch.chdir(REPO if where == "root" else tmp_path)
  code, err = _exit(benchmark.main, monkeypatch, capsys, "retrieval_example", "--dir=x")
  assert code == 2 and len(err) == 1, err
  assert err[0].startswith("error: `retrieval_example` is a reproduction")
  assert ("run `python -m benchmarks retrieval_example` from the checkout's root "
          f"({REPO})") in err[0]


def test_unknown_names_print_each_programs_usage(monkeypatch, capsys):
  code, err = _exit(benchmark.main, monkeypatch, capsys, "nonesuch")
  assert code == 2 and err == [
      f"usage: python -m bertjax.benchmark {{{','.join(benchmark.available())}}} [flags]"]
  code, err = _exit(benchmark.main, monkeypatch, capsys, "__init__")  # not a reproduction
  assert code == 2 and err[0].startswith("usage: python -m bertjax.benchmark")
  code, err = _exit(reproductions.main, monkeypatch, capsys, "plan")  # the package's tool
  assert code == 2 and err == [
      f"usage: python -m benchmarks {{{','.join(reproductions.available())}}} [flags]"]


def test_the_reproductions_run_from_the_checkouts_root():
  """`python -m benchmarks` resolves from the root (the folder is not installed)."""
  proc = subprocess.run([sys.executable, "-m", "benchmarks"], cwd=REPO,
                        capture_output=True, text=True, check=False, timeout=120)
  assert proc.returncode == 2 and proc.stderr.startswith("usage: python -m benchmarks {")
