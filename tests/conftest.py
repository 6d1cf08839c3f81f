"""Tests run on CPU with 8 fake devices (set before jax starts), tiny configs."""

import os
import tempfile

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Compiled programs are shared between the tests' own runs and the CLIs they start.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), "bertjax-test-jax-cache"))
