"""Builds .wheels/: the Python 3.12 manylinux x86_64 wheels of what bertjax imports
that the GPU machines' image lacks (they reach no package index), for
launch/gpu_check.sh to install there with `pip --no-index --find-links`.

  python launch/gpu_wheels.py [--dest .wheels]

Carried: grain, array_record, ml_collections and tensorboardX (pyproject.toml's
dependencies, each pinned to the version installed here, which the suite runs with),
and their dependencies that the image does not have; a dependency the image has is
carried too where the bundle asks for a version of it (a lower bound the image's may
miss: pip then takes the wheel). pytrec-eval-terrier is carried alone (ALONE: its
numpy >= 1.15.1 and scipy >= 1.1.0 would bring 50 MiB of wheels the image's versions
make useless; every requirement of such a wheel must be a package of the image, or the
build stops). Not carried: tensorflow-datasets, which bertjax
imports only for tfds: corpora and TFDS task readers (lazily), and every package of the
image (IMAGE). Prints each wheel and the total size: the device tool carries 64 MiB
a call, the working tree included.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARRIED = ("grain", "array_record", "ml_collections", "tensorboardX")
ALONE = ("pytrec-eval-terrier",)  # Without its dependencies: the image has them all.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
LIMIT_MIB = 48  # Of the 64 MiB a device call carries: the rest for the working tree.
# The GPU image's Python packages (the device tool's KINDS.md, as read on 2026-11-17).
IMAGE = frozenset(canonicalize_name(n) for n in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server
tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
xarray xxhash yarl zipp""".split())


def pins() -> list[str]:
  """CARRIED as pyproject.toml requires them, each at the version installed here."""
  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    deps = {canonicalize_name(r.name): r for r in map(
        Requirement, tomllib.load(f)["project"]["dependencies"])}
  out = []
  for name in CARRIED + ALONE:
    req = deps[canonicalize_name(name)]
    version = importlib.metadata.version(name)
    if not req.specifier.contains(version):
      sys.exit(f"{name} {version} is installed here, pyproject.toml asks {req}")
    out.append(f"{name}=={version}")
  return out


def _requirements(wheel: str) -> list[Requirement]:
  """A wheel's Requires-Dist that apply on the GPU machine (Python 3.12, Linux, no
  extras)."""
  with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
  env = {**default_environment(), "python_version": "3.12",
         "python_full_version": "3.12.3", "sys_platform": "linux",
         "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}
  reqs = [Requirement(line.split(":", 1)[1]) for line in lines
          if line.startswith("Requires-Dist:")]
  return [r for r in reqs if r.marker is None or r.marker.evaluate(env)]


def _project(wheel: str) -> str:
  return canonicalize_name(os.path.basename(wheel).split("-")[0])


def _bounded(spec) -> bool:
  """Whether a specifier asks for a least version (>=, >, ==, ~=)."""
  return any(s.operator in (">=", ">", "==", "~=", "===") for s in spec)


def build(dest: str) -> list[str]:
  """Downloads the pins with their dependencies into `dest` and removes the wheels the
  image has no need of; returns the pins."""
  wanted = pins()
  shutil.rmtree(dest, ignore_errors=True)
  cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp", "-d", dest]
  for platform in PLATFORMS:
    cmd += ["--platform", platform]
  subprocess.run(cmd + wanted[:len(CARRIED)], check=True)
  subprocess.run(cmd + ["--no-deps"] + wanted[len(CARRIED):], check=True)
  wheels = glob.glob(os.path.join(dest, "*.whl"))
  carried_alone = set(map(canonicalize_name, ALONE))
  for wheel in wheels:
    missing = [str(r) for r in _requirements(wheel) if _project(wheel) in carried_alone
               and canonicalize_name(r.name) not in IMAGE]
    if missing:
      sys.exit(f"{os.path.basename(wheel)} is carried without its dependencies, but the "
               f"image lacks {missing}: carry it with them (CARRIED)")
  bounded = {canonicalize_name(r.name) for w in wheels
             if _project(w) not in IMAGE | carried_alone
             for r in _requirements(w) if _bounded(r.specifier)}
  for wheel in wheels:
    name = _project(wheel)
    if name in IMAGE and name not in bounded:
      os.remove(wheel)
  with open(os.path.join(dest, "requirements.txt"), "w") as f:
    f.write("\n".join(wanted) + "\n")
  return wanted


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dest", default=os.path.join(REPO, ".wheels"))
  dest = parser.parse_args().dest
  wanted = build(dest)
  total = 0
  for wheel in sorted(glob.glob(os.path.join(dest, "*.whl"))):
    size = os.path.getsize(wheel)
    total += size
    print(f"{size / 2**20:7.2f} MiB  {os.path.basename(wheel)}")
  print(f"{total / 2**20:7.2f} MiB  in all, {dest} (pins: {' '.join(wanted)})")
  if total > LIMIT_MIB * 2**20:
    sys.exit(f"over {LIMIT_MIB} MiB: the device tool carries 64 MiB a call in all")


if __name__ == "__main__":
  main()
