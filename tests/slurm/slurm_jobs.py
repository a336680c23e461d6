"""Helpers shared by the launcher tests: paths, sbatch/scontrol wrappers for run_mi300x.sh jobs, and the
stand-in trainer's environment and output."""
from __future__ import annotations

import json
import os
import subprocess
import time

from local_slurm import LocalSlurm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(REPO, "run_mi300x.sh")
STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_trainer.py")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
            "DEADLINE"}


class Jobs:
    """Submit run_mi300x.sh with sbatch and follow the job through scontrol."""

    def __init__(self, cluster: LocalSlurm, workdir: str):
        self.cluster = cluster
        self.workdir = workdir

    def submit(self, sbatch_args: list[str], env: dict, script_args: list[str] = ()) -> str:
        full_env = dict(self.cluster.env, **env)
        if not any(a.startswith("--signal") for a in sbatch_args):
            # run_mi300x.sh asks for B:USR1@600: on a test job of a minute or two Slurm's first limit
            # check would send the time-limit warning at once. A test that wants it says so.
            sbatch_args = ["--signal=B:USR1@5", *sbatch_args]
        r = subprocess.run(["sbatch", "--parsable", *sbatch_args, LAUNCHER, *script_args], cwd=self.workdir,
                           env=full_env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"sbatch failed: {r.stderr}"
        return r.stdout.strip().split(";")[0]

    def info(self, job_id: str) -> dict:
        return self.cluster.job_info(job_id)

    def wait(self, job_id: str, timeout: float, until=None, poll: float = 1.0) -> dict:
        """Wait for a terminal state (or for until(info) to be true, asked every `poll` seconds); returns
        scontrol's fields."""
        deadline = time.time() + timeout
        info: dict = {}
        while time.time() < deadline:
            info = self.info(job_id)
            if until is not None and until(info):
                return info
            if until is None and info.get("JobState") in TERMINAL:
                return info
            time.sleep(poll)
        raise AssertionError(f"job {job_id} not done after {timeout:.0f}s: {info.get('JobState')}\n"
                             f"{self.output(job_id)[-3000:]}")

    def named(self, name: str) -> list[str]:
        """Ids of every job called `name` that Slurm still knows (ended ones too, for MinJobAge)."""
        r = self.cluster.run("squeue", "-h", "--states=all", f"--name={name}", "-o", "%i", check=False)
        return r.stdout.split()

    def output(self, job_id: str) -> str:
        """The job's Slurm output file (run_mi300x.sh writes %x-%j.out in the submit dir)."""
        for name in os.listdir(self.workdir):
            if name.endswith(f"-{job_id}.out"):
                with open(os.path.join(self.workdir, name), errors="replace") as f:
                    return f.read()
        return ""


def read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def latest(ckpt: str) -> int:
    return int(read(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).strip())


def standin_views(text: str) -> list[dict]:
    return [json.loads(line.split("standin: ", 1)[1]) for line in text.splitlines()
            if line.startswith("standin: {")]


def standin_env(tmp: str, **extra) -> dict:
    # Resubmissions get run_mi300x.sh's own B:USR1@600 unless told otherwise (see Jobs.submit).
    env = dict(TRAIN_SCRIPT=STANDIN, CKPT_DIR=os.path.join(tmp, "ckpt"), OMP_NUM_THREADS="1",
               RESUBMIT_ARGS="--signal=B:USR1@5")
    env.update(extra)
    return env
