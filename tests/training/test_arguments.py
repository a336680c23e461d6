"""Flags are validated before anything expensive; each bad value gets one line naming the flag."""
import pytest

from megatron_zaya.arguments import parse_args
from tests.training.helpers import tiny_run_flags


def error_of(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("extra, flag", [
    ({"--global-batch-size": "6", "--micro-batch-size": "4"}, "--global-batch-size"),
    ({"--preset": "zaya9"}, "--preset=zaya9"),
    ({"--data-path": "/nonexistent/prefix"}, "--data-path /nonexistent/prefix"),
    ({"--context-parallel-size": "1", "--seq-length": "30", "--num-attention-heads": "3"}, "--num-attention-heads=3"),
    ({"--lr-decay-style": "WSD", "--lr-wsd-decay-iters": "0"}, "--lr-wsd-decay-iters"),
    ({"--rampup-batch-size": ["2", "3", "100"]}, "--rampup-batch-size"),
    ({"--expert-model-parallel-size": "3"}, "--expert-model-parallel-size=3"),
])
def test_bad_flags_fail_fast_naming_the_flag(tiny_corpus, tmp_path, capsys, extra, flag):
    extra = dict(extra)
    multi = {k: v for k, v in extra.items() if isinstance(v, list)}
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{k: v for k, v in extra.items() if k not in multi})
    for k, values in multi.items():
        argv += [k, *values]
    line = error_of(argv, capsys)
    assert line.startswith("pretrain_zaya.py: error:") and flag in line, line


def test_cp_needs_sequence_divisible_by_twice_cp(tiny_corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{"--context-parallel-size": "4", "--seq-length": "36",
                                                     "--global-batch-size": "4"})
    assert "--seq-length=36" in error_of(argv, capsys)


def test_yaml_config_and_flag_override(tiny_corpus, tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("lr: 0.01\nhidden-size: 64\nnum_attention_heads: 2\ntrain-iters: 9\n")
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path) + ["--config", str(cfg), "--lr", "0.02"])
    assert run.optim.lr == 0.02                      # flag beats file
    assert run.model.hidden_size == 64 and run.model.num_attention_heads == 2   # file beats preset
    assert run.train.train_iters == 6                # the flag list sets --train-iters explicitly
    bad = tmp_path / "bad.yaml"
    bad.write_text("learning_rate: 0.1\n")
    assert "unknown key 'learning_rate'" in error_of(tiny_run_flags(tiny_corpus, tmp_path) + ["--config", str(bad)],
                                                      capsys)
