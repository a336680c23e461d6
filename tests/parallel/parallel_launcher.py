"""Spawn N CPU processes on one test script: torchrun (python -m torch.distributed.run) or mpirun."""
from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ephemeral_ports() -> tuple[int, int]:
    """The range the system draws outgoing connections' local ports from (Linux's default when unreadable)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port free now for a launcher's rendezvous, drawn below the ephemeral range: a port the system hands out
    (bind to 0) can be taken as the source port of another test's outgoing connection before torchrun binds it
    (EADDRINUSE: a torchrun test failed so in CI, two test workers running)."""
    low, _ = _ephemeral_ports()
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(min(10000, low - 1000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MEGATRON_ZAYA_KERNELS="torch",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def run_torchrun(nproc: int, script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), script, *args]
    return subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def mpirun_available() -> bool:
    if shutil.which("mpirun") is None:
        return False
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def run_mpirun(nproc: int, script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = ["mpirun", "-np", str(nproc), "--oversubscribe", "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    env = _env()
    cmd += ["-x", "OMP_NUM_THREADS", "-x", "MEGATRON_ZAYA_KERNELS", "-x", "PYTHONPATH"]
    cmd += [sys.executable, script, *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def report_from_rank0_and_exit(runtime, value) -> None:
    """The end of a torchrun test worker: every rank's `value` gathered, printed by rank 0 as one JSON
    line (the parent reads the last line), then the group torn down and the process ended by
    exit_process (no interpreter teardown: parallel/launch.py)."""
    import json

    import torch.distributed as dist

    from megatron_zaya.parallel.launch import exit_process
    every = [None] * runtime.world_size
    dist.all_gather_object(every, value)
    if runtime.rank == 0:
        print(json.dumps(every), flush=True)
    dist.barrier()
    if hasattr(runtime, "shutdown"):        # a DistributedRuntime; a bare DistEnv holds only the default group
        runtime.shutdown()
    else:
        dist.destroy_process_group()
    exit_process(0)
