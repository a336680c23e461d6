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
    """A free port of the form 15000 + job id % 17000 (how the launcher derives it under Slurm)."""
    for port in range(31999, 15000, -1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port in 15000..31999")


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


def test_half_an_mpi_environment_is_a_clear_error():
    """An MPI rank variable without its world size (a half-copied job script), or a value that is not a
    number: one line naming the variables (it was a KeyError / ValueError traceback)."""
    from megatron_zaya.errors import UserInputError
    for rank, size in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")):
        with pytest.raises(UserInputError, match=f"^{rank} is set but {size} is not"):
            detect_launcher({rank: "0"})
        with pytest.raises(UserInputError, match=f"{rank}='x', {size}='2': not whole numbers"):
            detect_launcher({rank: "x", size: "2"})
    result = subprocess.run([sys.executable, "pretrain_zaya.py", "--mock-data", "--tokenizer-type", "NullTokenizer",
                             "--vocab-size", "512", "--train-iters", "1"], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "OMPI_COMM_WORLD_RANK": "0", "OMP_NUM_THREADS": "1"}, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "error: OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not" in result.stderr


def test_torchrun_variables_are_checked_as_the_mpi_ones():
    """RANK without WORLD_SIZE ran as rank 0 of 1; a value that is no number was a ValueError traceback; a rank
    outside the world waited for peers until the rendezvous timed out. WORLD_SIZE alone plans a run."""
    from megatron_zaya.errors import UserInputError
    with pytest.raises(UserInputError, match="^RANK is set but WORLD_SIZE is not: a process started by torchrun"):
        detect_launcher({"RANK": "1"})
    with pytest.raises(UserInputError, match="RANK='x', WORLD_SIZE='2': not whole numbers"):
        detect_launcher({"RANK": "x", "WORLD_SIZE": "2"})
    for rank, size in (("2", "2"), ("-1", "2"), ("0", "0")):
        with pytest.raises(UserInputError, match=rf"RANK={rank}, WORLD_SIZE={size}: the rank must be in \[0, "):
            detect_launcher({"RANK": rank, "WORLD_SIZE": size})
    info = detect_launcher({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("torchrun", 1, 2, 1)
    assert detect_launcher({"WORLD_SIZE": "1024"}).launcher == "none"


def test_a_world_size_the_launcher_contradicts_is_refused(monkeypatch):
    """WORLD_SIZE=1 exported into an mpirun job of 2: each rank planned a one-process layout and trained alone,
    both saving into one --save folder; WORLD_SIZE=4 there misreported the layout. Without a launcher,
    WORLD_SIZE plans the layout (--dry-run)."""
    from megatron_zaya.arguments import world_size_from_env
    from megatron_zaya.errors import UserInputError
    for name in list(os.environ):
        if name.startswith(("OMPI_", "PMI_", "SLURM_", "MPI_")) or name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(name)
    assert world_size_from_env() == 1
    monkeypatch.setenv("WORLD_SIZE", "1024")
    assert world_size_from_env() == 1024
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    for stray in ("1", "4"):
        monkeypatch.setenv("WORLD_SIZE", stray)
        with pytest.raises(UserInputError, match=f"WORLD_SIZE={stray} in the environment, but openmpi started 2 "):
            world_size_from_env()
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert world_size_from_env() == 2
    monkeypatch.delenv("WORLD_SIZE")
    assert world_size_from_env() == 2
    # --dry-run starts no process group: WORLD_SIZE plans the run even inside a launcher's step (srun --pty bash)
    for name in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name)
    for name, value in (("SLURM_PROCID", "0"), ("SLURM_STEP_ID", "0"), ("SLURM_NTASKS", "1"), ("WORLD_SIZE", "1024")):
        monkeypatch.setenv(name, value)
    assert world_size_from_env(planning=True) == 1024
    with pytest.raises(UserInputError, match="WORLD_SIZE=1024 in the environment, but slurm started 1 "):
        world_size_from_env()


def test_more_ranks_on_a_node_than_gpus_is_refused():
    assert [launch.gpu_index(r, 8) for r in (0, 7)] == [0, 7]
    assert launch.gpu_index(5, 1) == 0 and launch.gpu_index(0, 0) == 0     # a task that sees one GPU: its own
    from megatron_zaya.errors import UserInputError
    with pytest.raises(UserInputError, match=r"local rank 8 but 8 GPUs visible on this node"):
        launch.gpu_index(8, 8)


def test_a_launch_that_requires_a_gpu_and_sees_none_is_refused(monkeypatch):
    """run_mi300x.sh exports MEGATRON_ZAYA_REQUIRE_GPU=1: a task without a GPU (a CUDA or CPU-only torch wheel on
    AMD nodes, a job without GPUs) stops before the process group, naming the torch build, instead of training
    on CPU with gloo; without the variable a CPU run goes on."""
    from megatron_zaya.errors import UserInputError
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(launch.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(launch.torch.version, "hip", None)
    monkeypatch.setattr(launch.torch.version, "cuda", "12.8")
    monkeypatch.setenv("MEGATRON_ZAYA_REQUIRE_GPU", "1")
    monkeypatch.setattr(launch.dist, "init_process_group", lambda *a, **k: pytest.fail("the group was started"))
    with pytest.raises(UserInputError, match=r"rank 0 on .*: no GPU visible to torch .* \(CUDA 12.8 build\)"):
        launch.init_distributed()
    monkeypatch.setenv("MEGATRON_ZAYA_REQUIRE_GPU", "0")
    with pytest.raises(pytest.fail.Exception, match="the group was started"):
        launch.init_distributed()


def test_a_slurm_steps_port_reads_the_older_step_variable_too():
    base = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "100", "SLURM_NODELIST": "n1"}
    new = detect_launcher({**base, "SLURM_STEP_ID": "1"}).master_port
    old = detect_launcher({**base, "SLURM_STEPID": "1"}).master_port
    assert new == old == launch.SLURM_PORT_BASE + 100 + 1009
    assert detect_launcher({**base, "SLURM_STEP_ID": "0"}).master_port == launch.SLURM_PORT_BASE + 100


def test_mpi4py_of_another_mpi_is_a_clear_error(monkeypatch):
    """mpirun says rank 1 of 2, mpi4py's MPI (e.g. pip's Open MPI under MPICH's mpirun) says a singleton."""
    comm = types.SimpleNamespace(Get_size=lambda: 1, Get_rank=lambda: 0, bcast=lambda *a, **k: None)
    mpi = types.SimpleNamespace(COMM_WORLD=comm, Get_library_version=lambda: "Open MPI v5.0.5, package: pip\n")
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=mpi))
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)
    with pytest.raises(RuntimeError, match=r"mpich as rank 1 of 2, but mpi4py's MPI.COMM_WORLD is rank 0 of 1"):
        launch._agree_with_mpi(LaunchInfo("mpich", 1, 2, 1, None, None))


def test_srun_mpi_pmi2_is_a_slurm_launch():
    """`srun --mpi=pmi2`: Slurm's PMI-2 plugin sets PMI_RANK/PMI_SIZE but not MPICH's local rank (checked
    on a real Slurm), so the Slurm variables give the local rank and the master, not a local rank 0 for all."""
    for r in range(8, 16):    # node 2's tasks of a 2 x 8 job
        env = {"SLURM_PROCID": str(r), "SLURM_LOCALID": str(r % 8), "SLURM_NODEID": "1", "SLURM_NTASKS": "16",
               "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "gpu[001-002]",
               "SLURM_STEP_NODELIST": "gpu[001-002]", "PMI_RANK": str(r), "PMI_SIZE": "16", "PMI_FD": "5",
               "PMI_JOBID": "77.0"}
        info = detect_launcher(env)
        assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("slurm", r, 16, r % 8)
        assert (info.master_addr, info.master_port) == ("gpu001", 15077)
    # MPICH's mpirun (Hydra) inside a Slurm job: its proxies are an srun step, so the ranks see that
    # step's SLURM_PROCID (the proxy's); Hydra's own variables, with a local rank, still win.
    hydra = {"SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0",
             "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "gpu[001-002]", "PMI_RANK": "13", "PMI_SIZE": "16",
             "MPI_LOCALRANKID": "5"}
    info = detect_launcher(hydra)
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("mpich", 13, 16, 5)
    # Outside an srun step PMI_RANK alone is still MPICH's.
    assert detect_launcher({"PMI_RANK": "1", "PMI_SIZE": "2"}).launcher == "mpich"


def _fake_mpi(monkeypatch, hosts: list[str]):
    sent = {}

    def bcast(obj, root=0):
        sent["bcast"] = obj
        return obj

    comm = types.SimpleNamespace(Get_size=lambda: len(hosts), Get_rank=lambda: 0, bcast=bcast,
                                 allgather=lambda obj: list(hosts))
    mpi = types.SimpleNamespace(COMM_WORLD=comm, Get_library_version=lambda: "Open MPI v5.0.5\n")
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=mpi))
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)
    return sent


def test_mpirun_master_address_is_not_loopback(monkeypatch):
    """Ubuntu's /etc/hosts maps the hostname to 127.0.1.1: rank 0 must broadcast an address the other
    hosts can reach (here the outward route's), and refuse when it has none."""
    monkeypatch.setattr(launch, "_hostname_addresses", lambda: ["127.0.1.1"])
    monkeypatch.setattr(launch, "_socket_ifname_addresses", lambda: [])
    monkeypatch.setattr(launch, "_route_addresses", lambda: ["10.1.2.3"])
    _fake_mpi(monkeypatch, ["node1", "node2"])
    info = launch._agree_with_mpi(LaunchInfo("openmpi", 0, 2, 0, None, None))
    assert info.master_addr == "10.1.2.3" and info.master_port > 0

    monkeypatch.setattr(launch, "_route_addresses", lambda: [])
    with pytest.raises(RuntimeError, match="only a loopback address .*127.0.1.1.*export MASTER_ADDR"):
        launch._agree_with_mpi(LaunchInfo("openmpi", 0, 2, 0, None, None))
    # One host: loopback is fine. MASTER_ADDR given: used as it is.
    _fake_mpi(monkeypatch, ["node1", "node1"])
    assert launch._agree_with_mpi(LaunchInfo("openmpi", 0, 2, 0, None, None)).master_addr == "127.0.1.1"
    _fake_mpi(monkeypatch, ["node1", "node2"])
    assert launch._agree_with_mpi(LaunchInfo("openmpi", 0, 2, 0, "127.0.0.1", 1234)).master_addr == "127.0.0.1"


EXIT_SCRIPT = """
import atexit, sys
from megatron_zaya.parallel.launch import exit_process
atexit.register(lambda: print("teardown ran", flush=True))
sys.stdout.write("unflushed line of rank " + sys.argv[1])     # no newline, no flush: exit_process flushes
exit_process(int(sys.argv[2]))
"""


def test_an_mpirun_job_that_agreed_over_mpi4py_exits_with_status_0(tmp_path):
    """Without MASTER_ADDR/MASTER_PORT the ranks agree on them over mpi4py, which initialises MPI; exit_process
    finalises it, or Open MPI's mpirun reports the ranks as leaving improperly (exit status 1)."""
    from parallel_launcher import mpirun_available, run_mpirun
    if not mpirun_available():
        pytest.skip("no mpirun")
    script = tmp_path / "mpi_exit_worker.py"
    script.write_text(SCRIPT + "from megatron_zaya.parallel.launch import exit_process\nexit_process(0)\n")
    result = run_mpirun(2, str(script), timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "rank 1/2" in result.stdout and "sum 3" in result.stdout


@pytest.mark.parametrize("world_size", ["1", "2"])
def test_exit_process_skips_teardown_only_in_a_multi_process_job(world_size):
    """A rank of a multi-process job (here WORLD_SIZE=2) leaves by os._exit: its status and flushed
    output, no atexit handler (the interpreter's teardown is where gloo aborted a rank now and then);
    a single process exits normally."""
    env = {**_clean_env(), "WORLD_SIZE": world_size, "RANK": "0"}
    proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, "0", "3"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("unflushed line of rank 0")
    assert ("teardown ran" in proc.stdout) == (world_size == "1")


def test_a_rank_ends_when_its_torchrun_is_killed():
    """torchrun starts each rank in a session of its own: after a SIGKILL of torchrun its ranks lived on, rank 0
    holding the --save lock while it retried the dead store. A rank asks for SIGTERM when its launcher dies."""
    import signal
    import time

    rank = ("from megatron_zaya.parallel.launch import end_with_the_launcher\n"
            "end_with_the_launcher()\nprint('ready', flush=True)\nimport time\ntime.sleep(120)\n")
    launcher_code = ("import os, subprocess, sys, time\n"
                     f"child = subprocess.Popen([sys.executable, '-c', {rank!r}], start_new_session=True,\n"
                     "                         env=dict(os.environ, TORCHELASTIC_RUN_ID='test'))\n"
                     "print(child.pid, flush=True)\ntime.sleep(60)\n")
    launcher = subprocess.Popen([sys.executable, "-c", launcher_code], stdout=subprocess.PIPE, text=True)
    child = int(launcher.stdout.readline())
    try:
        assert launcher.stdout.readline().strip() == "ready"      # the rank has made its request
        launcher.kill()
        launcher.wait()
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                with open(f"/proc/{child}/status") as f:
                    state = f.read().split("State:")[1].split()[0]
            except FileNotFoundError:
                state = "gone"
            if state in ("Z", "gone"):                  # ended (a zombie until its new parent reaps it)
                break
            time.sleep(0.2)
        assert state in ("Z", "gone"), state
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_socket_ifname_picks_interfaces_as_nccl_reads_the_variable(monkeypatch):
    """NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME (the address rank 0 offers an mpirun job without MASTER_ADDR):
    "eth" any interface whose name starts so, "=eth0" that one exactly, a comma list several, "^..." an
    exclusion list that names none; interfaces without an IPv4 address are left out."""
    addresses = {"lo": "127.0.0.1", "eth0": "10.0.0.5", "eth10": "10.0.1.5", "ib0": "192.168.7.2", "docker0": None}
    monkeypatch.setattr(launch.socket, "if_nameindex", lambda: list(enumerate(addresses, 1)))
    monkeypatch.setattr(launch, "_interface_address", addresses.get)
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        monkeypatch.delenv(var, raising=False)
    assert launch._socket_ifname_addresses() == []
    cases = {"eth": ["10.0.0.5", "10.0.1.5"], "=eth1": [], "=eth0": ["10.0.0.5"], "eth1": ["10.0.1.5"],
             "ib,eth0": ["192.168.7.2", "10.0.0.5"], "=ib0,eth10": ["192.168.7.2", "10.0.1.5"],
             "^lo,docker": [], "^docker,eth0": [], "docker": [], "": []}
    for spec, expected in cases.items():
        monkeypatch.setenv("NCCL_SOCKET_IFNAME", spec)
        assert launch._socket_ifname_addresses() == expected, spec
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "=lo")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ib")
    assert launch._socket_ifname_addresses() == ["127.0.0.1", "192.168.7.2"]
    # what rank 0 offers: the named interface's address before the outward route's
    monkeypatch.setattr(launch, "_hostname_addresses", lambda: ["127.0.1.1"])
    monkeypatch.setattr(launch, "_route_addresses", lambda: ["10.9.9.9"])
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "=eth10")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    assert launch._host_address() == "10.0.1.5"


def test_interface_address_reads_the_kernels_ipv4_address():
    if not sys.platform.startswith("linux"):
        pytest.skip("SIOCGIFADDR is Linux's")
    names = [name for _, name in socket.if_nameindex()]
    if "lo" in names:
        assert launch._interface_address("lo") == "127.0.0.1"
    assert launch._interface_address("no-such-if0") is None
