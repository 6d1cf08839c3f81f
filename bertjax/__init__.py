"""bertjax: pretrain and fine-tune BERT-family encoders in JAX/Flax."""

import glob
import importlib.util
import os
import sys

__version__ = "0.1.0"

# Device nodes of the accelerators JAX can use: TPU VMs (v4/v5p /dev/accel*, v5e/v6e
# /dev/vfio), NVIDIA (as jax._src.hardware_utils checks) and AMD GPUs.
_ACCELERATOR_NODES = ("/dev/accel*", "/dev/vfio", "/dev/nvidia0", "/dev/nvidiactl",
                      "/dev/dxg", "/dev/kfd")


def _keep_cpu_only_runs_on_cpu() -> None:
  """With libtpu installed (the `tpu` extra, for `benchmark plan`) but no accelerator
  attached, JAX would still try to start a TPU runtime and print libtpu's warnings on
  every run; pin the platform to the CPU instead, unless the user chose platforms."""
  if "JAX_PLATFORMS" in os.environ or importlib.util.find_spec("libtpu") is None:
    return
  if any(glob.glob(pattern) for pattern in _ACCELERATOR_NODES):
    return
  if "jax" in sys.modules:  # Imported first: its config already read the environment.
    import jax  # pylint: disable=g-import-not-at-top
    if jax.config.jax_platforms is None:
      jax.config.update("jax_platforms", "cpu")
  else:
    os.environ["JAX_PLATFORMS"] = "cpu"


_keep_cpu_only_runs_on_cpu()


def load_pretrained(path, **kwargs):
  """Loads a bertjax workdir/checkpoint or a Hugging Face directory; see `bertjax.api`."""
  from bertjax.checkpoint.pretrained import load_pretrained as load  # Deferred: `import bertjax` stays light.
  return load(path, **kwargs)
