"""The Apache Beam environment of the Beam tests: a virtual environment of its own that
adds only the `beam` extra of pyproject.toml (apache-beam, and with it protobuf<7,
which shadows the test environment's protobuf 7 there alone) to the packages of the
environment it serves: the one running these tests, where the project is installed
(`pip install -e ".[test]"`: jax, numpy, tokenizers, absl, ...).

Not `--system-site-packages`: from a virtual environment that inherits the packages of
the base interpreter, not of the environment, which lacks the project's dependencies.
Instead a `.pth` file in the new environment adds the serving environment's site
directories (`site.getsitepackages()` of the running Python, and its user site when it
uses one) after its own, with their `.pth` files (editable installs).

It is built once per (serving environment, Python, beam extra) under
~/.cache/bertjax/beam-KEY (about 20 s on 2 cores with the downloads) and reused by
later runs: KEY hashes the extra, the Python version, `sys.prefix` and the site
directories it adds. A lock lets concurrent runs share it.
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


def requirements() -> list[str]:
  """The `beam` extra of pyproject.toml."""
  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)["project"]["optional-dependencies"]["beam"]


def serving_sites() -> list[str]:
  """The site directories of the running Python's environment, in its path's order."""
  sites = list(site.getsitepackages())
  if site.ENABLE_USER_SITE:
    sites.append(site.getusersitepackages())
  return [os.path.realpath(d) for d in sites if os.path.isdir(d)]


def _cache_root() -> str:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "bertjax")


def path() -> str:
  """Where the Beam environment of this environment and this beam extra lives."""
  key = json.dumps([requirements(), sys.version, os.path.realpath(sys.prefix),
                    serving_sites()])
  return os.path.join(_cache_root(), "beam-" + hashlib.sha256(key.encode()).hexdigest()[:16])


def _run(args: list[str], what: str, timeout: float) -> str:
  out = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
  if out.returncode != 0:
    raise RuntimeError(f"{what} failed (exit {out.returncode}): "
                       f"{(out.stdout + out.stderr)[-1500:]}")
  return out.stdout


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
    # No pip of its own: the serving environment's pip, run by the new interpreter,
    # installs into the new environment and leaves the inherited packages alone.
    _run([sys.executable, "-m", "venv", "--without-pip", venv], "python -m venv", 120)
    own = _run([exe, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               "the new environment's python", 120).strip()
    with open(os.path.join(own, _PTH), "w") as f:  # after `own` on sys.path
      f.write(f"import site; list(map(site.addsitedir, {serving_sites()!r}))\n")
    _run([exe, "-m", "pip", "install", "--disable-pip-version-check", "-q",
          *requirements()], f"pip install {' '.join(requirements())} into {venv}", timeout)
    probe = _run([exe, "-c", "import json, apache_beam, google.protobuf as p; print("
                  "json.dumps({'apache_beam': apache_beam.__version__, "
                  "'protobuf': p.__version__}))"], "importing apache_beam", 120)
    facts = json.loads(probe.strip().splitlines()[-1])
    facts["built_seconds"] = round(time.perf_counter() - start, 1)
    with open(ready, "w") as f:
      json.dump(facts, f)
    return exe, {**facts, "build_seconds": facts["built_seconds"]}
