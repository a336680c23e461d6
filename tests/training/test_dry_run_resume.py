"""--dry-run of a run that resumes a checkpoint names the one the job will load, as its load would choose it: past a
latest one whose files are cut short or whose save did not complete, the next complete one, with a warning.

    python -m pytest -q tests/training/test_dry_run_resume.py
"""
import os

from megatron_zaya.arguments import parse_args
from megatron_zaya.checkpoint.format import COMPLETE_MARKER
from megatron_zaya.training.setup import build_and_train
from tests.training.helpers import tiny_run_flags


def test_the_dry_run_of_a_resume_names_the_checkpoint_the_load_falls_back_to(tiny_corpus, tmp_path, capsys):
    """It named the damaged latest (iteration 6) and counted 10 iterations left; the job loads iteration 3."""
    ckpt = tmp_path / "ckpt"
    flags = {"--train-iters": 16, "--save": ckpt, "--save-interval": 3, "--eval-iters": 0}
    assert build_and_train(parse_args(tiny_run_flags(tiny_corpus, tmp_path, **flags, **{"--exit-interval": 6}))) == 0
    shard = ckpt / "iter_0000006" / "rank_00000.safetensors"
    whole = shard.read_bytes()
    shard.write_bytes(whole[:len(whole) // 2])              # an interrupted copy of the folder
    dry = tiny_run_flags(tiny_corpus, tmp_path, **flags, **{"--load": ckpt, "--dry-run": ""})
    capsys.readouterr()
    for damage in ("cut short", "not complete"):
        if damage == "not complete":                         # (its files whole)
            shard.write_bytes(whole)
            os.remove(ckpt / "iter_0000006" / COMPLETE_MARKER)
        assert build_and_train(parse_args(dry)) == 0
        out = capsys.readouterr().out
        assert f"resumes from {ckpt / 'iter_0000003'} (iteration 3, consumed samples 12)" in out, out
        assert "WARNING: the run would pass over an unusable checkpoint: " in out and str(shard.parent) in out, out
        assert "and 13 iterations (from iteration 3)" in out, out
