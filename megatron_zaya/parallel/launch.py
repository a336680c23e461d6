"""Find rank, world size, local rank and the rendezvous address from whatever launched us, then
initialise torch.distributed.

Launchers understood (first match wins):
  torchrun / torch.distributed.run  RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
  Open MPI mpirun                   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK
  MPICH / Intel MPI mpirun          PMI_RANK, PMI_SIZE, MPI_LOCALRANKID (or PMI_LOCAL_RANK)
  Slurm srun                        SLURM_PROCID, SLURM_STEP_NUM_TASKS (or SLURM_NTASKS), SLURM_LOCALID,
                                    SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST); only inside an srun
                                    step (SLURM_STEP_ID of a task-launch step, not the batch script:
                                    sbatch sets SLURM_PROCID=0 there too). Also under `srun --mpi=pmi2`,
                                    whose PMI_RANK/PMI_SIZE come without MPICH's local rank variables
  nothing                           a single process (rank 0 of 1)

MASTER_ADDR / MASTER_PORT from the environment always win. Otherwise: under MPI, rank 0 picks a
non-loopback address of its host and a free port and broadcasts them with mpi4py (an error naming
MASTER_ADDR when it has only a loopback address and the ranks span several hosts); under Slurm the
first host of the step's node list (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST) and a port derived from
SLURM_JOB_ID and the step id (two jobs whose ids differ by a multiple of 17000 get the same one: set
MASTER_PORT where jobs share a node); a single process uses an in-memory store.

A single process with no launcher still initialises a 1-process group (so every collective in
the code runs unchanged). Backend: "nccl" when a GPU is visible (RCCL on ROCm), "gloo" otherwise;
the device is cuda:LOCAL_RANK (cuda:0 for a task that sees one GPU; more ranks than GPUs on a node is an
error), or the CPU.
"""
from __future__ import annotations

import os
import re
import socket
import warnings
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from megatron_zaya.errors import UserInputError


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    launcher: str = "none"
    master_addr: str | None = None
    master_port: int | None = None


@dataclass
class LaunchInfo:
    launcher: str
    rank: int
    world_size: int
    local_rank: int
    master_addr: str | None
    master_port: int | None


def expand_slurm_nodelist(nodelist: str) -> list[str]:
    """'gpu[001-003,7],login1' -> ['gpu001', 'gpu002', 'gpu003', 'gpu7', 'login1'] (zero padding kept), in
    `scontrol show hostnames` order, also with several ranges in a name ('rack[1-2]-n[01-02]' -> rack1-n01,
    rack1-n02, rack2-n01, rack2-n02) and text after a range ('node[1-2]-ib')."""
    hosts = []
    for expression in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", nodelist):     # split at commas outside brackets
        names = [""]
        for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", expression):
            names = [name + literal for name in names]
            if ranges:
                values = []
                for part in ranges.split(","):
                    lo, _, hi = part.partition("-")
                    values += [str(i).zfill(len(lo)) for i in range(int(lo), int(hi or lo) + 1)]
                names = [name + value for name in names for value in values]
        hosts += names
    return hosts


def _env_int(env, *names, default=None):
    for name in names:
        if env.get(name, "") != "":
            return int(env[name])
    return default


def _rank_and_size(env, rank: str, size: str, launcher: str = "mpirun") -> tuple[int, int]:
    """A launcher's rank and world size variables, which come in pairs: a clear error for an environment
    that has one without the other (a half-copied job script), a value that is no number, or a rank
    outside the world."""
    if env.get(size, "") == "":
        raise UserInputError(f"{rank} is set but {size} is not: a process started by {launcher} has both (unset "
                             f"{rank} to run as one process, or start the ranks with mpirun, srun or torchrun)")
    try:
        values = int(env[rank]), int(env[size])
    except ValueError:
        raise UserInputError(f"{rank}={env[rank]!r}, {size}={env[size]!r}: not whole numbers") from None
    if not 0 <= values[0] < values[1]:
        raise UserInputError(f"{rank}={values[0]}, {size}={values[1]}: the rank must be in [0, {size})")
    return values


# Slurm's special step ids (slurm.h; 0xfffffffa.. since 20.11, 0xfffffffe/0xffffffff before): the batch
# script, the extern container, the interactive step, a pending step. A task-launch (srun) step has a
# small id.
_SLURM_SPECIAL_STEP = 0xFFFFFFF0
DEFAULT_TIMEOUT_MINUTES = 30        # --distributed-timeout-minutes
# A Slurm step's rendezvous port: 15000..31999, below Linux's ephemeral ports (32768..60999), which the
# node's own outgoing connections may hold.
SLURM_PORT_BASE, SLURM_PORTS = 15000, 17000


def in_slurm_step(env) -> bool:
    """True inside the tasks of an srun step; False in an sbatch script or an salloc shell, where
    SLURM_PROCID (=0) and SLURM_NTASKS (the job's) may be set but no other task will ever start."""
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", ""))
    if not step.isdigit():
        return False
    return int(step) < _SLURM_SPECIAL_STEP


def detect_launcher(env=None) -> LaunchInfo:
    """Rank, world size, local rank and (if known without communication) the master address."""
    env = os.environ if env is None else env
    addr = env.get("MASTER_ADDR") or None
    port = _env_int(env, "MASTER_PORT")
    if env.get("RANK", "") != "":        # (WORLD_SIZE alone plans a run: `WORLD_SIZE=1024 ... --dry-run`)
        return LaunchInfo("torchrun", *_rank_and_size(env, "RANK", "WORLD_SIZE", "torchrun"),
                          _env_int(env, "LOCAL_RANK", default=0), addr, port)
    if "OMPI_COMM_WORLD_RANK" in env:
        return LaunchInfo("openmpi", *_rank_and_size(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                          _env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", default=0), addr, port)
    mpich_local_rank = _env_int(env, "MPI_LOCALRANKID", "PMI_LOCAL_RANK")
    # MPICH's / Intel MPI's Hydra sets a local rank; Slurm's own PMI-2 (`srun --mpi=pmi2`) sets
    # PMI_RANK/PMI_SIZE but no local rank: there the Slurm variables say it all (local rank, node list).
    # (Hydra inside a Slurm job starts its proxies with srun, so its ranks see SLURM_STEP_ID too, but
    # with SLURM_PROCID of the proxy: its local rank variable keeps them on this branch.)
    if "PMI_RANK" in env and (mpich_local_rank is not None or not ("SLURM_PROCID" in env and in_slurm_step(env))):
        return LaunchInfo("mpich", *_rank_and_size(env, "PMI_RANK", "PMI_SIZE"),
                          mpich_local_rank if mpich_local_rank is not None else 0, addr, port)
    if "SLURM_PROCID" in env and in_slurm_step(env):
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if addr is None and nodelist:
            addr = expand_slurm_nodelist(nodelist)[0]
        if port is None and env.get("SLURM_JOB_ID"):   # the same on every task of the step, another per step
            step = _env_int(env, "SLURM_STEP_ID", "SLURM_STEPID", default=0)
            port = SLURM_PORT_BASE + (int(env["SLURM_JOB_ID"]) + 1009 * step) % SLURM_PORTS
        return LaunchInfo("slurm", int(env["SLURM_PROCID"]),
                          _env_int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS", default=1),
                          _env_int(env, "SLURM_LOCALID", default=0), addr, port)
    if "SLURM_PROCID" in env and _env_int(env, "SLURM_NTASKS", "SLURM_NPROCS", default=1) > 1:
        warnings.warn(f"SLURM_PROCID is set but this process is not a task of an srun step (SLURM_STEP_ID="
                      f"{env.get('SLURM_STEP_ID', 'unset')}, e.g. the sbatch script itself): running as ONE "
                      f"process, not {env.get('SLURM_NTASKS') or env.get('SLURM_NPROCS')}; start the ranks "
                      "with srun (or torchrun/mpirun)", RuntimeWarning, stacklevel=2)
    return LaunchInfo("none", 0, 1, 0, addr, port)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr in ("::1", "localhost")


def _interface_address(ifname: str) -> str | None:
    """The IPv4 address of a network interface (Linux), or None."""
    try:
        import fcntl
        import struct
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname[:15].encode()))   # SIOCGIFADDR
        return socket.inet_ntoa(packed[20:24])
    except (OSError, ImportError, ValueError):
        return None


def _hostname_addresses() -> list[str]:
    try:
        return [ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    except OSError:
        return []


def _socket_ifname_addresses() -> list[str]:
    """Addresses of the interfaces NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME name (NCCL's syntax: "eth"
    any eth*, "=eth0" exactly; a "^..." exclusion list names none)."""
    try:
        interfaces = [name for _, name in socket.if_nameindex()]
    except OSError:
        return []
    out = []
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        spec = os.environ.get(var, "")
        if not spec or spec.startswith("^"):
            continue
        exact = spec.startswith("=")
        for want in (w.strip() for w in spec.lstrip("=").split(",")):
            out += [a for n in interfaces if want and (n == want or (not exact and n.startswith(want)))
                    for a in [_interface_address(n)] if a]
    return out


def _route_addresses() -> list[str]:
    """The source address of the outward route (a UDP connect sends nothing; it only picks the route)."""
    for target in ("10.255.255.255", "192.0.2.1"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((target, 9))
                return [s.getsockname()[0]]
        except OSError:
            continue
    return []


def _host_address() -> str:
    """An address other hosts can reach this one at: the hostname's address unless it is loopback (Debian
    and Ubuntu map the hostname to 127.0.1.1 in /etc/hosts), else the address of NCCL_SOCKET_IFNAME /
    GLOO_SOCKET_IFNAME, else the source address of the outward route. Loopback only when nothing else."""
    candidates = [a for a in _hostname_addresses() + _socket_ifname_addresses() + _route_addresses() if a]
    for addr in candidates:
        if not _is_loopback(addr) and addr != "0.0.0.0":
            return addr
    return candidates[0] if candidates else "127.0.0.1"


def _agree_with_mpi(info: LaunchInfo) -> LaunchInfo:
    """Rank 0's address and a free port of its host, broadcast over MPI (mpi4py)."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise RuntimeError(f"launched by {info.launcher} without MASTER_ADDR/MASTER_PORT: install mpi4py "
                           "(pip install mpi4py) or export MASTER_ADDR and MASTER_PORT") from exc
    comm = MPI.COMM_WORLD
    if (comm.Get_size(), comm.Get_rank()) != (info.world_size, info.rank):
        raise RuntimeError(
            f"launched by {info.launcher} as rank {info.rank} of {info.world_size}, but mpi4py's "
            f"MPI.COMM_WORLD is rank {comm.Get_rank()} of {comm.Get_size()}: mpi4py is built against a "
            f"different MPI ({MPI.Get_library_version().splitlines()[0].strip()}) than the mpirun that "
            "started this job. Use the mpirun of mpi4py's MPI, rebuild mpi4py for this one "
            "(pip install --no-binary mpi4py mpi4py), or export MASTER_ADDR and MASTER_PORT")
    hosts = comm.allgather(socket.gethostname())
    proposal = None
    if info.rank == 0:
        addr = info.master_addr or _host_address()
        if info.master_addr is None and _is_loopback(addr) and len(set(hosts)) > 1:
            proposal = ("error", f"launched by {info.launcher} on {len(set(hosts))} hosts without MASTER_ADDR, and "
                                 f"rank 0's host ({hosts[0]}) has only a loopback address ({addr}), which the other "
                                 "hosts cannot reach: export MASTER_ADDR (an address of rank 0's host on the "
                                 "network between the nodes) and MASTER_PORT, or name that network's interface "
                                 "in NCCL_SOCKET_IFNAME")
        else:
            proposal = (addr, info.master_port or _free_port())
    agreed = comm.bcast(proposal, root=0)
    if agreed[0] == "error":
        raise RuntimeError(agreed[1])
    info.master_addr, info.master_port = agreed
    return info


def end_with_the_launcher(env=None) -> None:
    """Under torchrun (which starts each rank in a session of its own), ask Linux to send this process
    SIGTERM when its launcher dies: a SIGKILLed torchrun otherwise leaves its ranks behind, rank 0 holding
    the --save folder's lock (checkpoint/save_lock.py) while it retries the dead launcher's store for up to
    --distributed-timeout-minutes. Before the training's handlers exist SIGTERM ends the process; after,
    it saves a checkpoint and exits (training/signals.py). No-op elsewhere (srun and mpirun end their
    tasks themselves) and off Linux."""
    import ctypes
    import signal
    import sys

    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" not in env or not sys.platform.startswith("linux"):
        return
    launcher = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        if libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != launcher:     # the launcher died before the request: nothing would ever signal
        os.kill(os.getpid(), signal.SIGTERM)


def gpu_index(local_rank: int, visible: int) -> int:
    """This rank's GPU: its local rank among the node's visible GPUs, or the only one a task sees (Slurm's
    --gpus-per-task). More ranks on a node than GPUs would share them: an error, not NCCL's later one."""
    if visible > 1 and local_rank >= visible:
        raise UserInputError(f"local rank {local_rank} but {visible} GPUs visible on this node: start at most one "
                             f"process per GPU (--ntasks-per-node / --nproc-per-node <= {visible})")
    return local_rank % max(1, visible)


def init_distributed(backend: str | None = None, timeout_minutes: float = DEFAULT_TIMEOUT_MINUTES) -> DistEnv:
    """Initialise torch.distributed from the launcher's environment; returns this process's DistEnv.
    Idempotent: when a group already exists it only reports it."""
    info = detect_launcher()
    use_gpu = torch.cuda.is_available()
    if not use_gpu and os.environ.get("MEGATRON_ZAYA_REQUIRE_GPU", "0") == "1":     # (run_mi300x.sh sets it)
        build = f"ROCm {torch.version.hip}" if torch.version.hip else (f"CUDA {torch.version.cuda}"
                                                                        if torch.version.cuda else "CPU-only")
        raise UserInputError(f"rank {info.rank} on {socket.gethostname()}: no GPU visible to torch {torch.__version__} "
                             f"({build} build), and MEGATRON_ZAYA_REQUIRE_GPU=1 (run_mi300x.sh: REQUIRE_GPU) "
                             f"refuses to train on CPU: install the ROCm build of torch, give the job its GPUs "
                             f"(--gpus-per-node / GRES, /dev/kfd in a container), or set REQUIRE_GPU=0")
    device = torch.device("cuda", gpu_index(info.local_rank, torch.cuda.device_count())) if use_gpu \
        else torch.device("cpu")
    if use_gpu:
        torch.cuda.set_device(device)
    backend = backend or ("nccl" if use_gpu else "gloo")
    if dist.is_initialized():
        return DistEnv(dist.get_rank(), dist.get_world_size(), info.local_rank, device, dist.get_backend(),
                       info.launcher, info.master_addr, info.master_port)
    timeout = timedelta(minutes=timeout_minutes)
    if info.world_size == 1:      # one process: no rendezvous (nor a port another job's step may hold)
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
        return DistEnv(0, 1, info.local_rank, device, backend, info.launcher)
    if info.launcher in ("openmpi", "mpich") and (info.master_addr is None or info.master_port is None):
        info = _agree_with_mpi(info)
    if info.master_addr is None or info.master_port is None:
        raise UserInputError(f"launched by {info.launcher}: MASTER_ADDR and MASTER_PORT are needed "
                             f"(got {info.master_addr}:{info.master_port})")
    dist.init_process_group(backend, init_method=f"tcp://{info.master_addr}:{info.master_port}",
                            rank=info.rank, world_size=info.world_size, timeout=timeout)
    return DistEnv(info.rank, info.world_size, info.local_rank, device, backend, info.launcher,
                   info.master_addr, info.master_port)


def destroy_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_process(code: int):
    """End the process with exit status `code` (an entry script's last call). A rank of a
    multi-process job (its launcher says so) leaves with os._exit once stdout, stderr and logging are
    flushed, skipping the interpreter's teardown: there, after destroy_process_group and with every
    result written, torch 2.13's gloo aborted one rank in about 70 runs of a 2-process job
    ("terminate called without an active exception", exit -6; faulthandler showed no Python frame
    left, i.e. C++ destructors at interpreter exit). Callers close what they opened first
    (TensorBoard and checkpoint writers): atexit handlers do not run. What is unreachable is collected
    first, so finalizers still run (a DataLoader's persistent workers are shut down by its iterator's)."""
    import gc
    import logging
    import sys

    if detect_launcher().world_size <= 1:
        sys.exit(code)
    gc.collect()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):    # closed or broken pipe: nothing more can be written anyway
            pass
    mpi = sys.modules.get("mpi4py.MPI")   # imported to agree on the rendezvous (_agree_with_mpi)
    if code == 0 and mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()     # every rank is here: Open MPI's mpirun counts a rank leaving without it as failed
    os._exit(code)
