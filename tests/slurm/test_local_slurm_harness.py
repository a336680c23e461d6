"""The local Slurm harness itself: clear skip reasons, and daemons stopped by their pid files.

    python -m pytest -q tests/slurm/test_local_slurm_harness.py
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import types

import pytest

import local_slurm
from local_slurm import LocalSlurm, SlurmUnavailable


def test_reasons_when_slurm_cannot_be_installed(monkeypatch):
    monkeypatch.setattr(local_slurm, "_missing_binaries", lambda: ["sbatch", "slurmctld"])
    monkeypatch.setattr(local_slurm.os, "geteuid", lambda: 1000)
    with pytest.raises(SlurmUnavailable, match=r"missing \(sbatch, slurmctld\) and not root"):
        local_slurm.ensure_installed(log=lambda *a: None)

    monkeypatch.setattr(local_slurm.os, "geteuid", lambda: 0)
    monkeypatch.setattr(local_slurm.shutil, "which", lambda name: None)
    with pytest.raises(SlurmUnavailable, match="no apt-get"):
        local_slurm.ensure_installed(log=lambda *a: None)

    monkeypatch.setattr(local_slurm.shutil, "which", lambda name: "/usr/bin/" + name)
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return types.SimpleNamespace(returncode=100, stdout="", stderr="E: Unable to locate package slurmctld")

    monkeypatch.setattr(local_slurm.subprocess, "run", fake_run)
    with pytest.raises(SlurmUnavailable, match="exited 100: E: Unable to locate package slurmctld"):
        local_slurm.ensure_installed(log=lambda *a: None)
    assert calls == [["apt-get", "update", "-qq"]]


def test_start_then_stop_by_pid_files(slurm):
    # A second, one-node cluster beside the session's: own config, ports, munge socket and pid files.
    root = tempfile.mkdtemp(prefix="zs-h-", dir="/tmp")
    cluster = LocalSlurm(root, nodes=1, cpus=2)
    try:
        cluster.start()
        pids = []
        for pf in cluster.pidfiles:
            with open(pf) as f:
                pids.append(int(f.read().split()[0]))
        assert len(pids) == 3                                   # munged, slurmctld, slurmd
        assert all(os.path.exists(f"/proc/{p}") for p in pids)
        r = subprocess.run(["srun", "-N1", "-n1", "printenv", "SLURMD_NODENAME"], env=cluster.env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == "lnode1", r.stderr
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    for p in pids:
        assert not os.path.exists(f"/proc/{p}") or open(f"/proc/{p}/stat").read().split()[2] == "Z"
    # The session's cluster is untouched.
    assert set(slurm.node_states().values()) <= {"idle", "mixed", "allocated"}
