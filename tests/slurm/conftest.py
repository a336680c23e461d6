"""Fixtures for the launcher tests: a real local Slurm cluster (3 emulated nodes) and job helpers.

    python -m pytest -q tests/slurm

The cluster is started once per session by local_slurm.LocalSlurm (installs Debian's Slurm with
apt-get when missing; needs root) and stopped at the end by the PIDs in its pid files, also when
tests fail. Where Slurm cannot be provided the tests that need it skip with the reason.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from local_slurm import LocalSlurm, SlurmError, SlurmUnavailable  # noqa: E402
from fake_slurm import FakeSlurm  # noqa: E402
from slurm_jobs import Jobs  # noqa: E402


@pytest.fixture
def fake(tmp_path):
    """Stand-in Slurm commands (fake_slurm.py) for run_mi300x.sh's decisions."""
    return FakeSlurm(tmp_path)


@pytest.fixture(scope="session")
def slurm():
    root = tempfile.mkdtemp(prefix="zs-", dir="/tmp")  # short path: the munge socket lives under it
    cluster = LocalSlurm(root, nodes=3, cpus=4)
    try:
        cluster.start()
    except SlurmUnavailable as e:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"no local Slurm: {e}")
    except SlurmError as e:
        pytest.fail(f"local Slurm did not start: {e}")
    try:
        yield cluster
    finally:
        cluster.stop()
        if os.environ.get("ZAYA_KEEP_SLURM_DIR") != "1":
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def jobs(slurm, tmp_path):
    os.chmod(tmp_path, 0o755)
    return Jobs(slurm, str(tmp_path))
