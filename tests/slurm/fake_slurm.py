"""Stand-in srun / scontrol / sbatch / squeue / scancel for fast tests of run_mi300x.sh's decisions (no Slurm).

    fake = FakeSlurm(tmp_path)                       # writes the commands into tmp_path/bin
    r = fake.run_launcher(FAKE_RC="0 0 143 1")       # run_mi300x.sh as the batch script of a 2 x 2 job
    fake.calls("sbatch")                             # [{"argv": [...], "env": {...}}, ...]

srun starts its tasks as local processes with the variables Slurm gives a task (SLURM_PROCID,
SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_ID, SLURMD_NODENAME) and, like the real one, takes the
task count from SLURM_NTASKS / SLURM_NTASKS_PER_NODE of the job when the command line does not say.
The trainer is a bash stand-in (fake_trainer.sh): FAKE_RC holds one exit code per rank (the last
one for the ranks after it; TERM/KILL/ABRT/SEGV/BUS: the trainer kills itself with that signal, i.e. it
dies of it before its task wrapper has heard of any signal), FAKE_WRITES_ITER makes rank 0 write
latest_checkpointed_iteration.txt into --save, FAKE_USR1 makes rank 0 send the launcher Slurm's SIGUSR1
and wait until launcher.log says it was received (then the ranks exit with their FAKE_RC: the stand-in does not
save). Every call of a fake command is recorded in
calls.jsonl with its arguments and environment.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

from slurm_jobs import LAUNCHER

RECORD = r'''#!/usr/bin/env python3
import json, os, sys
name = os.path.basename(sys.argv[0]).removesuffix(".real")     # (a test's wrapper runs it as NAME.real)
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(json.dumps({"cmd": name, "argv": sys.argv[1:], "env": dict(os.environ)}) + "\n")
'''

SBATCH = RECORD + 'print(os.environ.get("FAKE_SBATCH_OUTPUT", "999"))\n'

SQUEUE = RECORD + 'print(os.environ.get("FAKE_TIME_LIMIT", "1:00:00"))\n'

SCONTROL = RECORD + r'''
a = sys.argv[1:]
if a[:2] == ["show", "hostnames"]:      # n[1-2],x7 -> n1 n2 x7, g[01-02] -> g01 g02
    import re
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)",
                                            a[2] if len(a) > 2 else os.environ["SLURM_JOB_NODELIST"]):
        for part in ([] if plain else ranges.split(",")):
            lo, _, hi = part.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                print(f"{prefix}{str(i).zfill(len(lo))}")
        if plain:
            print(plain)
elif a[:2] == ["show", "job"]:
    info = os.environ.get("FAKE_JOB_INFO") or f"JobId={a[-1]} Command={os.environ['FAKE_LAUNCHER']}"
    if "-o" not in a:       # the multi-line form: as real Slurm's Command=, each field on a line of its own
        import re
        info = re.sub(r" (?=[A-Za-z:/]+=)", "\n   ", info)
    print(info)
'''

SRUN = r'''#!/usr/bin/env bash
python3 - "$@" <<'PY'
import json, os, sys
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(json.dumps({"cmd": "srun", "argv": sys.argv[1:], "env": dict(os.environ)}) + "\n")
PY
trap ':' USR1     # real srun passes the signal on; here the tasks are not told (and start with its default)
nodes=${SLURM_JOB_NUM_NODES:-1} npn=${SLURM_NTASKS_PER_NODE:-} ntasks=${SLURM_NTASKS:-}
while [[ $# -gt 0 && $1 == -* ]]; do
    case $1 in
        --nodes=*) nodes=${1#*=} ;;
        --ntasks-per-node=*) npn=${1#*=} ;;
        --ntasks=*) ntasks=${1#*=} ;;
    esac
    shift
done
npn=${npn:-1}
ntasks=${ntasks:-$(( nodes * npn ))}
per_node=$(( (ntasks + nodes - 1) / nodes ))     # real srun ignores a --ntasks-per-node that does not fit
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
pids=()
for (( r = 0; r < ntasks; r++ )); do
    SLURM_PROCID=$r SLURM_LOCALID=$(( r % per_node )) SLURM_NODEID=$(( r / per_node )) SLURM_NTASKS=$ntasks \
        SLURM_STEP_ID=0 SLURMD_NODENAME=${NODES[r / per_node]} "$@" &
    pids+=($!)
done
# Ignored from here on (the tasks have started, with the default): a trap would interrupt `wait`, and one
# that does so just as a task exits loses its status (run_mi300x.sh's wait_for says more).
trap '' USR1
rc=0
for p in "${pids[@]}"; do
    wait "$p" || rc=$?
done
exit $rc
'''

# requeue() waits 60 s for Slurm to end the attempt: no wait; other sleeps (the repeated SIGUSR1) are real
SLEEP = '#!/usr/bin/env bash\n[[ $1 == 60 ]] && exit 0\nPATH=/usr/bin:/bin exec sleep "$@"\n'

TRAINER = r'''#!/usr/bin/env bash
save= prev=
for a in "$@"; do [[ $prev == --save ]] && save=$a; prev=$a; done
echo "fake trainer rank $RANK/$WORLD_SIZE local $LOCAL_RANK on $SLURMD_NODENAME: $*"
if [[ $RANK == 0 && -n $save && -n ${FAKE_WRITES_ITER:-} ]]; then
    echo "$FAKE_WRITES_ITER" > "$save/latest_checkpointed_iteration.txt"
fi
if [[ $RANK == 0 && -n ${FAKE_USR1:-} ]]; then      # Slurm's time-limit warning to the batch script
    p=$PPID
    while (( p > 1 )); do
        cmd=$(tr '\0' ' ' < "/proc/$p/cmdline")
        if [[ $cmd == *run_mi300x.sh* && $cmd != *--task* ]]; then kill -s USR1 "$p"; break; fi
        read -r -a stat < "/proc/$p/stat"
        p=${stat[3]}
    done
    for (( i = 0; i < 600; i++ )); do     # still running until the launcher has heard it (at most 30 s)
        grep -qs "received SIGUSR1" "$SLURM_SUBMIT_DIR"/logs/*/launcher.log && break
        sleep 0.05
    done
fi
read -r -a codes <<< "${FAKE_RC:-0}"
rc=${codes[RANK]:-${codes[-1]}}
case $rc in
    TERM|KILL|ABRT|SEGV|BUS) kill -s "$rc" $$ ;;
esac
exit "$rc"
'''


class FakeSlurm:
    def __init__(self, tmp_path):
        self.dir = str(tmp_path)
        self.bin = os.path.join(self.dir, "bin")
        os.makedirs(self.bin, exist_ok=True)
        for name, text in (("srun", SRUN), ("sbatch", SBATCH), ("scontrol", SCONTROL), ("squeue", SQUEUE),
                           ("scancel", RECORD), ("sleep", SLEEP), ("fake_trainer.sh", TRAINER)):
            self.install(name, text)
        self.calls_file = os.path.join(self.dir, "calls.jsonl")
        self.submit_dir = os.path.join(self.dir, "submit")
        os.makedirs(self.submit_dir, exist_ok=True)

    def env(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "ZAYA_"))}
        env.update(
            PATH=self.bin + os.pathsep + os.environ["PATH"], FAKE_CALLS=self.calls_file,
            FAKE_LAUNCHER=LAUNCHER, LAUNCHER_PATH=LAUNCHER,
            SLURM_JOB_ID="4242", SLURM_JOB_NAME="fake", SLURM_JOB_NODELIST="n[1-2]", SLURM_JOB_NUM_NODES="2",
            SLURM_NNODES="2", SLURM_NTASKS_PER_NODE="2", SLURM_NTASKS="4", SLURM_NPROCS="4",
            SLURM_CPUS_ON_NODE="8", SLURM_SUBMIT_DIR=self.submit_dir, SLURM_CONF="/etc/slurm/fake.conf",
            PYTHON="bash", TRAIN_SCRIPT=os.path.join(self.bin, "fake_trainer.sh"), CONFIG="",
            CKPT_DIR=os.path.join(self.dir, "ckpt"), OMP_NUM_THREADS="1", NCCL_SOCKET_IFNAME="lo")
        env.update(extra)
        return env

    def install(self, name: str, text: str) -> str:
        """An executable `name` in the stand-in commands' folder (replacing one there); its path."""
        path = os.path.join(self.bin, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)
        return path

    def move_aside(self, name: str) -> str:
        """The stand-in `name`'s new path, for a test's own `name` (install) that calls it."""
        real = os.path.join(self.bin, f"{name}.real")
        os.rename(os.path.join(self.bin, name), real)
        return real

    def run_launcher(self, *args: str, timeout: float = 60, keep_logs: bool = False,
                     **extra) -> subprocess.CompletedProcess:
        """run_mi300x.sh as the batch script (its calls of the stand-ins recorded afresh); keep_logs: the job's
        log folder stays as the run before left it (a requeued attempt of the same job), else one launcher.log
        per run."""
        if os.path.exists(self.calls_file):
            os.remove(self.calls_file)
        if not keep_logs:
            shutil.rmtree(os.path.join(self.submit_dir, "logs"), ignore_errors=True)
        return subprocess.run(["bash", LAUNCHER, *args], env=self.env(**extra), cwd=self.submit_dir,
                              capture_output=True, text=True, timeout=timeout)

    def calls(self, cmd: str | None = None) -> list[dict]:
        if not os.path.exists(self.calls_file):
            return []
        with open(self.calls_file) as f:
            calls = [json.loads(line) for line in f if line.strip()]
        return [c for c in calls if cmd is None or c["cmd"] == cmd]

    def launcher_log(self, job: str = "fake-4242") -> str:
        path = os.path.join(self.submit_dir, "logs", job, "launcher.log")
        with open(path, errors="replace") as f:
            return f.read()

    def training_sruns(self) -> list[dict]:
        return [c for c in self.calls("srun") if "--task" in c["argv"]]


def write_latest(ckpt: str, it: int) -> None:
    """A --save folder whose latest_checkpointed_iteration.txt names iteration `it`."""
    os.makedirs(ckpt, exist_ok=True)
    with open(os.path.join(ckpt, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(f"{it}\n")
