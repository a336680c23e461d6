"""run_mi300x.sh finds the checkout it was submitted from by asking Slurm (`scontrol show job`'s Command=),
since the batch script Slurm runs is a spooled copy: a checkout whose path has a space is found too.
Stand-in Slurm commands (fake_slurm.py), about a second.

    python -m pytest -q tests/slurm/test_run_mi300x_script_path.py
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from slurm_jobs import LAUNCHER, REPO


@pytest.mark.parametrize("args", [[], ["--train-iters", "20", "--lr warm"]])
def test_a_checkout_whose_path_has_a_space_is_found(fake, tmp_path, args):
    """Slurm's Command= is the submitted path, then the script's arguments, joined by spaces."""
    checkout = tmp_path / "my repo"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(LAUNCHER, checkout / "run_mi300x.sh")
    shutil.copy(os.path.join(REPO, "scripts", "run_mi300x_recovery.sh"), checkout / "scripts")
    spooled = tmp_path / "spool" / "slurm_script"      # what slurmd runs: nothing next to it
    spooled.parent.mkdir()
    shutil.copy(LAUNCHER, spooled)
    submitted = str(checkout / "run_mi300x.sh")
    command = " ".join([submitted, *args])
    r = subprocess.run(["bash", str(spooled), *args], env=fake.env(FAKE_LAUNCHER=command, LAUNCHER_PATH=""),
                       cwd=fake.submit_dir, capture_output=True, text=True, timeout=60)
    assert "cannot find scripts/run_mi300x_recovery.sh" not in r.stderr, r.stderr
    (step,) = fake.training_sruns()
    assert step["argv"][step["argv"].index("--task") - 1] == submitted, step["argv"]
    assert step["argv"][len(step["argv"]) - len(args):] == args     # passed on to the trainer
    assert r.returncode == 0, r.stdout + r.stderr
