"""The Apache Beam environment of the Beam tests: a virtual environment beside this
Python that inherits its packages (`--system-site-packages`: jax, numpy, tokenizers,
...) and adds only the `beam` extra of pyproject.toml (apache-beam, and with it
protobuf<7, which shadows the test environment's protobuf 7 there alone).

It is built once per (Python, beam extra) under ~/.cache/bertjax/beam-KEY (20 s on 2
cores with the downloads, 14 s from pip's cache) and reused by later runs (KEY hashes
the extra and the interpreter); a lock lets concurrent runs share it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
import tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_READY = "bertjax-ready.json"  # written last: the environment is complete


def requirements() -> list[str]:
  """The `beam` extra of pyproject.toml."""
  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)["project"]["optional-dependencies"]["beam"]


def _cache_root() -> str:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "bertjax")


def path() -> str:
  """Where the environment of this Python and this beam extra lives."""
  key = json.dumps([requirements(), sys.version, os.path.realpath(sys.executable)])
  return os.path.join(_cache_root(), "beam-" + hashlib.sha256(key.encode()).hexdigest()[:16])


def python(timeout: float = 900) -> tuple[str, dict]:
  """(the environment's python, facts: protobuf and apache-beam versions, seconds the
  build took, or 0 when it was cached). Builds it when missing; raises RuntimeError
  with pip's last lines when it cannot be built (no network to the package index)."""
  venv = path()
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
    # No pip of its own: this Python's pip, run by the environment's interpreter,
    # installs into the environment (and leaves the inherited packages alone).
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    venv], check=True, timeout=120)
    pip = subprocess.run([exe, "-m", "pip", "install", "--disable-pip-version-check", "-q",
                          *requirements()], capture_output=True, text=True,
                         timeout=timeout)
    if pip.returncode != 0:
      raise RuntimeError(f"pip install {' '.join(requirements())} into {venv} failed "
                         f"(exit {pip.returncode}): {(pip.stdout + pip.stderr)[-1500:]}")
    probe = subprocess.run(
        [exe, "-c", "import json, apache_beam, google.protobuf as p; print(json.dumps("
         "{'apache_beam': apache_beam.__version__, 'protobuf': p.__version__}))"],
        capture_output=True, text=True, timeout=120, check=True)
    facts = json.loads(probe.stdout.strip().splitlines()[-1])
    facts["built_seconds"] = round(time.perf_counter() - start, 1)
    with open(ready, "w") as f:
      json.dump(facts, f)
    return exe, {**facts, "build_seconds": facts["built_seconds"]}
