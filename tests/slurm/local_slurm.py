"""Start and stop a real Slurm (Debian's slurm-wlm + munge) on this one machine, for tests.

    python tests/slurm/local_slurm.py start --dir /tmp/zaya-slurm --nodes 3 --cpus 4
    export SLURM_CONF=/tmp/zaya-slurm/slurm.conf     # then sbatch / squeue / sinfo work
    python tests/slurm/local_slurm.py stop --dir /tmp/zaya-slurm

What it does (see ../shared/spec/local-slurm.md for the facts this relies on):
- installs `slurmctld slurmd slurm-client munge` with apt-get (--no-install-recommends, after
  `apt-get update`) when the binaries are missing; needs root;
- starts a private munged (its own key and socket under DIR, running as the munge user),
  slurmctld, and one slurmd per emulated node (`slurmd -N lnodeK`, each on its own port; the
  names are added to /etc/hosts as 127.0.0.1), all with state, spool, logs and pid files under DIR;
- waits until every node is idle;
- `stop` cancels every job of this cluster, waits for them to leave, then stops the daemons by
  the PIDs in their pid files (never by process name) and removes nothing else.

The pytest fixture in conftest.py uses `LocalSlurm` directly; when Slurm cannot be provided
(not root, no apt-get, install fails) `SlurmUnavailable` carries the reason the tests skip with.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time

from megatron_zaya.processes import process_running

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
BINARIES = ["slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel", "srun", "munged", "mungekey"]


class SlurmUnavailable(RuntimeError):
    """Slurm cannot be provided on this machine; the message says why."""


class SlurmError(RuntimeError):
    """The local cluster did not come up or misbehaved; the message names the log to read."""


def _missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def ensure_installed(log=print) -> None:
    """Install Debian's Slurm and munge if missing, or raise SlurmUnavailable with the reason."""
    missing = _missing_binaries()
    if not missing:
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable(f"Slurm binaries missing ({', '.join(missing)}) and not root, so apt-get cannot install "
                               f"{' '.join(PACKAGES)}")
    if shutil.which("apt-get") is None:
        raise SlurmUnavailable(f"Slurm binaries missing ({', '.join(missing)}) and no apt-get on this machine")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log(f"local_slurm: installing {' '.join(PACKAGES)} with apt-get")
    steps = [["apt-get", "update", "-qq"],
             ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]]
    for cmd in steps:
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SlurmUnavailable(f"`{' '.join(cmd)}` failed: {e}") from e
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            raise SlurmUnavailable(f"`{' '.join(cmd)}` exited {r.returncode}: {' | '.join(tail)}")
    missing = _missing_binaries()
    if missing:
        raise SlurmUnavailable(f"apt-get install {' '.join(PACKAGES)} succeeded but {', '.join(missing)} still missing")


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _pid_alive(pid: int) -> bool:
    if not process_running(pid):
        return False
    # A zombie child of ours still "exists"; reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class LocalSlurm:
    """A Slurm cluster of `nodes` emulated nodes (lnode1..N) on localhost, files under `root`."""

    def __init__(self, root: str, nodes: int = 3, cpus: int = 4, cred_expire: int = 10):
        self.root = os.path.abspath(root)
        self.node_names = [f"lnode{i + 1}" for i in range(nodes)]
        self.cpus = cpus
        self.cred_expire = cred_expire
        self.conf = os.path.join(self.root, "slurm.conf")
        self.munge_dir = os.path.join(self.root, "munge")
        self.munge_socket = os.path.join(self.munge_dir, "sock")
        self.pidfiles: list[str] = []

    # -- environment for clients ------------------------------------------------------------
    @property
    def env(self) -> dict:
        env = dict(os.environ)
        for k in list(env):
            if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")):
                del env[k]
        env["SLURM_CONF"] = self.conf
        return env

    def run(self, *cmd: str, check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        r = subprocess.run(list(cmd), env=kw.pop("env", self.env), capture_output=True, text=True,
                           timeout=timeout, **kw)
        if check and r.returncode != 0:
            raise SlurmError(f"`{' '.join(cmd)}` exited {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
        return r

    # -- start --------------------------------------------------------------------------------
    def _write_conf(self) -> None:
        ctld_port, *node_ports = _free_ports(1 + len(self.node_names))
        host = socket.gethostname()
        with open("/proc/meminfo") as f:
            free_mb = next(int(line.split()[1]) // 1024 for line in f if line.startswith("MemAvailable"))
        mem = max(256, min(4000, free_mb // (2 * len(self.node_names))))
        d = self.root
        lines = [
            "ClusterName=zayatest",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            # job ids (so run_mi300x.sh's rendezvous ports) unlike another test cluster's on this machine
            f"FirstJobId={random.randrange(1, 6000)}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},cred_expire={self.cred_expire}",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool-%n",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/slurmctld.log",
            f"SlurmdLogFile={d}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=2",
            "KillWait=5",
            "MinJobAge=300",
            "InactiveLimit=0",
            "Waittime=0",
        ]
        for name, port in zip(self.node_names, node_ports):
            lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs={self.cpus} RealMemory={mem} State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(self.node_names)} Default=YES MaxTime=INFINITE State=UP")
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _ensure_hosts(self) -> None:
        with open("/etc/hosts") as f:
            known = {w for line in f if not line.lstrip().startswith("#") for w in line.split()[1:]}
        add = [n for n in self.node_names if n not in known]
        if add:
            with open("/etc/hosts", "a") as f:
                f.write("127.0.0.1 " + " ".join(add) + "  # emulated Slurm nodes (tests/slurm/local_slurm.py)\n")

    def _start_munge(self) -> None:
        os.makedirs(self.munge_dir, exist_ok=True)
        key = os.path.join(self.munge_dir, "munge.key")
        subprocess.run([_which("mungekey"), "-c", "-f", "-k", key], check=True, capture_output=True)
        shutil.chown(self.munge_dir, "munge", "munge")
        os.chmod(self.munge_dir, 0o755)  # the socket directory must be searchable by all
        shutil.chown(key, "munge", "munge")
        os.chmod(key, 0o400)
        pid = os.path.join(self.munge_dir, "munged.pid")
        cmd = ["runuser", "-u", "munge", "--", _which("munged"), f"--key-file={key}", f"--socket={self.munge_socket}",
               f"--pid-file={pid}", f"--log-file={self.munge_dir}/munged.log", f"--seed-file={self.munge_dir}/seed",
               "--num-threads=2"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SlurmError(f"munged failed to start ({r.returncode}): {r.stderr.strip()}")
        self.pidfiles.append(pid)

    def start(self, timeout: float = 60) -> "LocalSlurm":
        ensure_installed()
        if os.geteuid() != 0:
            raise SlurmUnavailable("the local Slurm runs its daemons as root (SlurmUser=root); not root")
        os.makedirs(self.root, exist_ok=True)
        os.chmod(self.root, 0o755)  # the munge user must reach its socket under here
        for sub in ["state"] + [f"spool-{n}" for n in self.node_names]:
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        self._ensure_hosts()
        self._write_conf()
        with open(os.path.join(self.root, "pidfiles.json"), "w") as f:
            json.dump([os.path.join(self.munge_dir, "munged.pid"), f"{self.root}/slurmctld.pid"]
                      + [f"{self.root}/slurmd-{n}.pid" for n in self.node_names], f)
        try:
            self._start_munge()
            env = self.env
            r = subprocess.run([_which("slurmctld"), "-i", "-f", self.conf], env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise SlurmError(f"slurmctld failed ({r.returncode}): {r.stderr.strip()}; see {self.root}/slurmctld.log")
            self.pidfiles.append(f"{self.root}/slurmctld.pid")
            for n in self.node_names:
                self._start_slurmd(n)
                self.pidfiles.append(f"{self.root}/slurmd-{n}.pid")
            self.wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_slurmd(self, node: str) -> None:
        r = subprocess.run([_which("slurmd"), "-N", node, "-f", self.conf], env=self.env, capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise SlurmError(f"slurmd -N {node} failed ({r.returncode}): {r.stderr.strip()}; "
                             f"see {self.root}/slurmd-{node}.log")

    # -- faults ---------------------------------------------------------------------------------
    def job_processes(self, job_id: str, node: str, steps_only: bool = False) -> list[int]:
        """PIDs of job `job_id`'s processes on emulated `node`, found by their Slurm environment in /proc
        (all emulated nodes share this machine): with steps_only, only srun's tasks (not the batch script)."""
        pids = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
            except OSError:
                continue
            if env.get(b"SLURM_JOB_ID") != job_id.encode() or env.get(b"SLURMD_NODENAME") != node.encode():
                continue
            if steps_only and b"SLURM_STEP_ID" not in env:
                continue
            pids.append(int(name))
        return pids

    def kill_tasks(self, job_id: str, node: str) -> list[int]:
        """SIGKILL job `job_id`'s srun tasks on `node` (trainers and their task wrappers), as an out-of-memory
        kill of the whole job's cgroup would: slurmd stays up and srun sees the tasks die of SIGKILL."""
        pids = self.job_processes(job_id, node, steps_only=True)
        for pid in pids:
            _kill(pid, signal.SIGKILL)
        return pids

    def fail_node(self, job_id: str, node: str) -> None:
        """The node dies under job `job_id`: SIGKILL its slurmd, the job's slurmstepds there and every process
        of the job there. Then mark it DOWN, as slurmctld does once the node has not answered for
        SlurmdTimeout (300 s by default), which kills and (with --requeue) requeues the jobs on it."""
        pids = self.job_processes(job_id, node)
        stepds = {_parent(p) for p in pids}
        stepds = [p for p in stepds if p and _command(p).startswith("slurmstepd")]
        with open(f"{self.root}/slurmd-{node}.pid") as f:
            slurmd = int(f.read().split()[0])
        for pid in [slurmd, *stepds, *pids]:
            _kill(pid, signal.SIGKILL)
        self.run("scontrol", "update", f"nodename={node}", "state=down", "reason=fail_node (test)")

    def revive_node(self, node: str, timeout: float = 60) -> None:
        """Undo fail_node: start the node's slurmd again, resume it, and wait until every node is idle."""
        self._start_slurmd(node)
        self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)   # (ReturnToService=2)
        self.wait_idle(timeout)

    def node_states(self) -> dict:
        r = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        states = {}
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def wait_idle(self, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        states: dict = {}
        while time.time() < deadline:
            states = self.node_states()
            if len(states) == len(self.node_names) and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.5)
        raise SlurmError(f"nodes not idle after {timeout:.0f}s: {states}; see {self.root}/slurmctld.log and slurmd-*.log")

    # -- jobs -----------------------------------------------------------------------------------
    def job_ids(self) -> list[str]:
        r = self.run("squeue", "-h", "-o", "%i", check=False)
        return [x for x in r.stdout.split() if x]

    def job_info(self, job_id: str) -> dict:
        """`scontrol show job -o` as a dict (empty when the job is unknown)."""
        r = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        info = {}
        for tok in r.stdout.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                info.setdefault(k, v)
        return info

    # -- stop -----------------------------------------------------------------------------------
    def stop(self, timeout: float = 30) -> None:
        """Cancel all jobs, wait for them to end, then stop the daemons by their pid files."""
        if os.path.exists(self.conf) and self.pidfiles:
            try:
                ids = self.job_ids()
                if ids:
                    self.run("scancel", *ids, check=False)
                    deadline = time.time() + timeout
                    while time.time() < deadline:
                        states = [self.job_info(i).get("JobState", "") for i in ids]
                        if all(s in ("", "CANCELLED", "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
                               for s in states):
                            break
                        time.sleep(0.5)
            except (subprocess.TimeoutExpired, OSError):
                pass
        pidfiles = list(self.pidfiles)
        if not pidfiles and os.path.exists(os.path.join(self.root, "pidfiles.json")):
            with open(os.path.join(self.root, "pidfiles.json")) as f:
                pidfiles = json.load(f)
        pids = []
        # slurmds first, then slurmctld, then munged.
        for pf in reversed(pidfiles):
            try:
                with open(pf) as f:
                    pid = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
                pids.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.time() + timeout
        while pids and time.time() < deadline:
            pids = [p for p in pids if _pid_alive(p)]
            time.sleep(0.2)
        for p in pids:
            _kill(p, signal.SIGKILL)
        self.pidfiles = []


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["start", "stop"])
    p.add_argument("--dir", required=True, help="folder for config, state, logs and pid files")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--cpus", type=int, default=4, help="CPUs each emulated node declares")
    a = p.parse_args(argv)
    cluster = LocalSlurm(a.dir, nodes=a.nodes, cpus=a.cpus)
    try:
        if a.action == "start":
            cluster.start()
            print(f"export SLURM_CONF={cluster.conf}")
        else:
            cluster.stop()
    except SlurmUnavailable as e:
        print(f"local_slurm: unavailable: {e}", file=sys.stderr)
        return 3
    except SlurmError as e:
        print(f"local_slurm: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
