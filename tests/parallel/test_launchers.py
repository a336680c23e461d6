"""init_distributed end to end from the MPICH and Slurm environments (2 plain subprocesses given the
variables those launchers set, each doing one all-reduce), the sbatch-script guard, and the clear
error when mpi4py's MPI is not the one that launched us. ~6 s on 2 CPU cores."""
import os
import socket
import subprocess
import sys
import types

import pytest

from megatron_zaya.parallel import launch
from megatron_zaya.parallel.launch import LaunchInfo, detect_launcher
from parallel_launcher import ROOT, free_port

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

SCRIPT = """
import torch, torch.distributed as dist
from megatron_zaya.parallel.launch import init_distributed
env = init_distributed(timeout_minutes=1)
t = torch.tensor([float(env.rank + 1)])
dist.all_reduce(t)
print(f"{env.launcher} rank {env.rank}/{env.world_size} local {env.local_rank} sum {t.item():g}", flush=True)
dist.destroy_process_group()
"""


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_", "MPI_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return env


def _run_ranks(per_rank: list[dict]) -> list[str]:
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], env={**_clean_env(), **extra}, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for extra in per_rank]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, out
        outs.append(out.strip().splitlines()[-1])
    return outs


def _free_slurm_port() -> int:
    """A free port of the form 15000 + job id % 20000 (how the launcher derives it under Slurm)."""
    for _ in range(50):
        port = free_port()
        if 15000 <= port < 35000:
            return port
    for port in range(34999, 15000, -1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port in 15000..34999")


def test_mpich_environment_end_to_end():
    port = str(free_port())
    outs = _run_ranks([{"PMI_RANK": str(r), "PMI_SIZE": "2", "MPI_LOCALRANKID": str(r),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port} for r in range(2)])
    assert outs == ["mpich rank 0/2 local 0 sum 3", "mpich rank 1/2 local 1 sum 3"]


def test_slurm_srun_environment_end_to_end():
    """What srun gives each task: no MASTER_*; the first host of the node list, a port from the job id."""
    job_id = str(_free_slurm_port() - 15000)
    outs = _run_ranks([{"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r),
                        "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": job_id, "SLURM_STEP_ID": "0"}
                       for r in range(2)])
    assert outs == ["slurm rank 0/2 local 0 sum 3", "slurm rank 1/2 local 1 sum 3"]


def test_sbatch_script_is_not_a_slurm_rank():
    """The batch script of `sbatch --ntasks 8` has SLURM_PROCID=0 and SLURM_NTASKS=8 but no SLURM_STEP_ID
    (checked on a real Slurm); a plain `python` there must not wait for 7 ranks that never start."""
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_NPROCS": "8", "SLURM_LOCALID": "0",
             "SLURM_JOB_NODELIST": "mi300x-[001-002]", "SLURM_JOB_ID": "77"}
    with pytest.warns(RuntimeWarning, match="not a task of an srun step"):
        info = detect_launcher(batch)
    assert (info.launcher, info.rank, info.world_size) == ("none", 0, 1)
    for special in ("4294967291", "4294967292", "4294967290", "4294967294"):   # batch, extern, interactive
        with pytest.warns(RuntimeWarning):
            assert detect_launcher({**batch, "SLURM_STEP_ID": special}).launcher == "none"
    info = detect_launcher({**batch, "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4",
                            "SLURM_STEP_NODELIST": "mi300x-002", "SLURM_PROCID": "3"})
    assert (info.launcher, info.rank, info.world_size, info.master_addr) == ("slurm", 3, 4, "mi300x-002")


def test_mpi4py_of_another_mpi_is_a_clear_error(monkeypatch):
    """mpirun says rank 1 of 2, mpi4py's MPI (e.g. pip's Open MPI under MPICH's mpirun) says a singleton."""
    comm = types.SimpleNamespace(Get_size=lambda: 1, Get_rank=lambda: 0, bcast=lambda *a, **k: None)
    mpi = types.SimpleNamespace(COMM_WORLD=comm, Get_library_version=lambda: "Open MPI v5.0.5, package: pip\n")
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=mpi))
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)
    with pytest.raises(RuntimeError, match=r"mpich as rank 1 of 2, but mpi4py's MPI.COMM_WORLD is rank 0 of 1"):
        launch._agree_with_mpi(LaunchInfo("mpich", 1, 2, 1, None, None))
