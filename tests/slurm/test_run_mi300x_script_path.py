"""run_mi300x.sh finds the checkout it was submitted from by asking Slurm (`scontrol show job`'s Command=),
since the batch script Slurm runs is a spooled copy: a checkout whose path has a space is found too, with the
script's arguments after it, and from `sbatch --chdir`. Stand-in Slurm commands (fake_slurm.py), about a second.

    python -m pytest -q tests/slurm/test_run_mi300x_script_path.py
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from slurm_jobs import LAUNCHER, REPO


def checkout_and_spooled_copy(tmp_path):
    checkout = tmp_path / "my repo"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(LAUNCHER, checkout / "run_mi300x.sh")
    for name in ("run_mi300x_recovery.sh", "checkpoint_latest.sh"):
        shutil.copy(os.path.join(REPO, "scripts", name), checkout / "scripts")
    spooled = tmp_path / "spool" / "slurm_script"      # what slurmd runs: nothing next to it
    spooled.parent.mkdir()
    shutil.copy(LAUNCHER, spooled)
    return str(checkout / "run_mi300x.sh"), str(spooled)


def assert_trains_the_checkouts_script(fake, r, submitted, args):
    assert "cannot find scripts/run_mi300x_recovery.sh" not in r.stderr, r.stderr
    (step,) = fake.training_sruns()
    assert step["argv"][step["argv"].index("--task") - 1] == submitted, step["argv"]
    assert step["argv"][len(step["argv"]) - len(args):] == args     # passed on to the trainer
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("args", [[], ["--train-iters", "20", "--wandb-exp-name", "a b"]])
def test_a_checkout_whose_path_has_a_space_is_found(fake, tmp_path, args):
    """Slurm's Command= is the submitted path, then the script's arguments, joined by spaces."""
    submitted, spooled = checkout_and_spooled_copy(tmp_path)
    command = " ".join([submitted, *args])
    r = subprocess.run(["bash", spooled, *args], env=fake.env(FAKE_LAUNCHER=command, LAUNCHER_PATH=""),
                       cwd=fake.submit_dir, capture_output=True, text=True, timeout=60)
    assert_trains_the_checkouts_script(fake, r, submitted, args)


def test_sbatch_chdir_finds_the_checkout(fake, tmp_path):
    """`sbatch --chdir=elsewhere "my repo/run_mi300x.sh" ...`: Command= stays relative to where sbatch ran
    (SLURM_SUBMIT_DIR; checked on the real Slurm 22.05), and the batch script runs in the other folder."""
    submitted, spooled = checkout_and_spooled_copy(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    args = ["--train-iters", "20"]
    env = fake.env(FAKE_LAUNCHER="my repo/run_mi300x.sh --train-iters 20", LAUNCHER_PATH="",
                   SLURM_SUBMIT_DIR=str(tmp_path))
    r = subprocess.run(["bash", spooled, *args], env=env, cwd=elsewhere, capture_output=True, text=True, timeout=60)
    assert_trains_the_checkouts_script(fake, r, submitted, args)
