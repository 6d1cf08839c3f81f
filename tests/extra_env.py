"""A virtual environment of its own for the tests of an optional extra of
pyproject.toml, added to the packages of the environment it serves: the one running
these tests, where the project is installed (`pip install -e ".[test]"`: jax, numpy,
tokenizers, absl, ...). Two extras need one:

- `beam`: apache-beam, and with it protobuf<7, which shadows the test environment's
  protobuf 7 there alone (tests/test_data_prepared.py's Beam test);
- `gpu-plan`: JAX's CUDA plugin, which compiles for GPUs on this CPU; installed beside
  the test environment's jax it would register a CUDA backend in every test process,
  and beside a GPU user's `cuda` extra a second one (tests/test_gpu_target.py).

Not `--system-site-packages`: from a virtual environment that inherits the packages of
the base interpreter, not of the environment, which lacks the project's dependencies.
Instead a `.pth` file in the new environment adds the serving environment's site
directories (`site.getsitepackages()` of the running Python, and its user site when it
uses one) after its own, with their `.pth` files (editable installs).

It is built once per (serving environment, Python, extra) under
~/.cache/bertjax/EXTRA-KEY (about 20 s on 2 cores with the downloads) and reused by
later runs: KEY hashes the extra's requirements, the Python version, `sys.prefix` and
the site directories it adds. A lock lets concurrent runs share it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import site
import subprocess
import sys
import time
import tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_READY = "bertjax-ready.json"  # written last: the environment is complete
_PTH = "bertjax-serving-environment.pth"


def requirements(extra: str) -> list[str]:
  """The `extra` of pyproject.toml."""
  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)["project"]["optional-dependencies"][extra]


def serving_sites() -> list[str]:
  """The site directories of the running Python's environment, in its path's order."""
  sites = list(site.getsitepackages())
  if site.ENABLE_USER_SITE:
    sites.append(site.getusersitepackages())
  return [os.path.realpath(d) for d in sites if os.path.isdir(d)]


def _cache_root() -> str:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "bertjax")


def path(extra: str) -> str:
  """Where the environment of `extra` for this environment lives."""
  key = json.dumps([requirements(extra), sys.version, os.path.realpath(sys.prefix),
                    serving_sites()])
  digest = hashlib.sha256(key.encode()).hexdigest()[:16]
  return os.path.join(_cache_root(), f"{extra}-{digest}")


def _run(args: list[str], what: str, timeout: float) -> str:
  out = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
  if out.returncode != 0:
    raise RuntimeError(f"{what} failed (exit {out.returncode}): "
                       f"{(out.stdout + out.stderr)[-1500:]}")
  return out.stdout


def python(extra: str, probe: str, timeout: float = 900) -> tuple[str, dict]:
  """(the environment's python, facts: what `probe` (Python code) printed as JSON on
  its last line, e.g. versions, and the seconds the build took, or 0 when it was
  cached). Builds it when missing; raises RuntimeError with pip's last lines when it
  cannot be built (no network to the package index)."""
  venv = path(extra)
  exe = os.path.join(venv, "bin", "python")
  os.makedirs(_cache_root(), exist_ok=True)
  with open(venv + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # another run may be building it
    ready = os.path.join(venv, _READY)
    if os.path.exists(ready):
      with open(ready) as f:
        return exe, {**json.load(f), "build_seconds": 0}
    start = time.perf_counter()
    subprocess.run(["rm", "-rf", venv], check=True)  # a build that was cut short
    # No pip of its own: the serving environment's pip, run by the new interpreter,
    # installs into the new environment and leaves the inherited packages alone.
    _run([sys.executable, "-m", "venv", "--without-pip", venv], "python -m venv", 120)
    own = _run([exe, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               "the new environment's python", 120).strip()
    with open(os.path.join(own, _PTH), "w") as f:  # after `own` on sys.path
      f.write(f"import site; list(map(site.addsitedir, {serving_sites()!r}))\n")
    _run([exe, "-m", "pip", "install", "--disable-pip-version-check", "-q",
          *requirements(extra)],
         f"pip install {' '.join(requirements(extra))} into {venv}", timeout)
    facts = json.loads(_run([exe, "-c", probe], f"the {extra} probe", 120)
                       .strip().splitlines()[-1])
    facts["built_seconds"] = round(time.perf_counter() - start, 1)
    with open(ready, "w") as f:
      json.dump(facts, f)
    return exe, {**facts, "build_seconds": facts["built_seconds"]}


def fixture_python(extra: str, probe: str) -> str:
  """`python(extra, probe)` for a test fixture: in CI (CI=true) an environment that
  cannot be built fails the test; elsewhere (no network to the package index) it
  skips."""
  import pytest  # pylint: disable=g-import-not-at-top
  try:
    exe, facts = python(extra, probe)
  except (RuntimeError, OSError, subprocess.SubprocessError) as e:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
      pytest.fail(f"CI runs the {extra} tests in an environment of their own and could "
                  f"not build it at {path(extra)}: {e}")
    pytest.skip(f"no {extra} environment ({path(extra)} cannot be built: {e})")
  print(f"{extra} environment {path(extra)}: {facts}")
  return exe
