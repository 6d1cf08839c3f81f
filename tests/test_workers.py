"""How many pytest-xdist workers `-n auto` starts (tests/conftest.py): a worker a core
the suite may use (its CPU affinity, capped by a cgroup v2 or v1 CPU quota, as a CI
container of 2 cores that sees the host's 64 has), and no more than one per
WORKER_GIB of available memory."""

import pytest

from tests import conftest

MEMINFO = "MemTotal: 67108864 kB\nMemAvailable:   {kib} kB\n"


@pytest.fixture
def machine(monkeypatch):
  """Sets the machine the hook sees: {path: text} files (others missing), cores."""
  def set_machine(files: dict[str, str], cores: int):
    def read(path):
      if path not in files:
        raise OSError(path)
      return files[path]
    monkeypatch.setattr(conftest, "_read", read)
    monkeypatch.setattr(conftest.os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(conftest, "PLATFORM", "cpu")
  return set_machine


@pytest.mark.parametrize("files, cores, expected", [
    ({"/sys/fs/cgroup/cpu.max": "200000 100000\n"}, 64, 2),  # v2 quota: 2 cores
    ({"/sys/fs/cgroup/cpu.max": "max 100000\n"}, 8, 8),  # v2, no quota
    ({"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "300000\n",
      "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n"}, 64, 3),  # v1 quota
    ({"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n",
      "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n"}, 4, 4),  # v1, no quota
    ({"/sys/fs/cgroup/cpu.max": "50000 100000\n"}, 16, 1),  # half a core: one
    ({}, 6, 6),  # no cgroup files
])
def test_a_worker_a_core_the_quota_allows(machine, files, cores, expected):
  machine(files, cores)
  assert conftest._cores() == expected


def test_memory_caps_the_workers(machine, monkeypatch):
  gib = 2**20  # kB
  for available, cores, workers in ((24 * gib, 16, 24 // conftest.WORKER_GIB),
                                    (2 * gib, 16, 1), (1000 * gib, 16, 17),
                                    (24 * gib, 2, 3)):  # CI's: 2 cores, 24 GiB
    machine({"/proc/meminfo": MEMINFO.format(kib=available)}, cores)
    assert conftest.pytest_xdist_auto_num_workers(None) == workers
  machine({}, 16)  # no /proc/meminfo: a worker a core, no more
  assert conftest.pytest_xdist_auto_num_workers(None) == 16
  monkeypatch.setattr(conftest, "PLATFORM", "gpu")
  assert conftest.pytest_xdist_auto_num_workers(None) == 1
