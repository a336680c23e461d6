"""More flag values that validation refuses before anything is built, each with one line naming the flag, and
some that it accepts (tests/training/test_arguments.py holds the rest; it is at its size limit)."""
import pytest

from megatron_zaya.arguments import parse_args
from tests.training.helpers import tiny_run_flags
from tests.training.test_arguments import error_of


@pytest.mark.parametrize("extra, expected", [
    ({"--lr-decay-iters": "0"}, "--lr-decay-iters=0: must be >= 1"),
    # a blend is checked to its last prefix, not only its first
    ({"--data-path": ["1", "{P}", "1", "/nonexistent/second"]}, "--data-path /nonexistent/second: "),
    ({"--train-iters": None, "--train-samples": "3"},          # the global batch is 4
     "--train-samples=3 is less than one global batch: no iteration to run"),
    ({"--skip-train": ""}, "--skip-train evaluates a trained model: give --load (or --pretrained-checkpoint)"),
    # mock data is cut by --split too: no train share left nothing to train on (StopIteration mid-run)
    ({"--mock-data": "", "--data-path": None, "--tokenizer-type": "NullTokenizer", "--tokenizer-model": None,
      "--vocab-size": "100", "--split": "0,100,0"},
     "--split 0,100,0: the train share is 0, so there is no training data for the iterations to run"),
    # infinity passed `>= 0`: --lr inf trained on non-finite weights; the model config's floats too
    ({"--lr": "inf"}, "--lr=inf: must be a finite number"),
    ({"--clip-grad": "inf"}, "--clip-grad=inf: must be a finite number"),
    ({"--init-method-std": "inf"}, "--init-method-std=inf: must be a finite number"),
    ({"--end-weight-decay": "inf"}, "--end-weight-decay=inf: must be a finite number"),
    ({"--start-weight-decay": "nan"}, "--start-weight-decay=nan: must be >= 0"),
    ({"--train-iters": str(2**60), "--global-batch-size": "4", "--micro-batch-size": "1"},     # a numpy traceback
     f"--train-iters x --global-batch-size: {2**62} samples, more than a run can count"),
    # more samples than an int64 index counts: an OverflowError traceback from the loader's len()
    ({"--train-iters": None, "--train-samples": str(10**21)}, "--train-samples: 10" + "0" * 20 + " samples, more "
     "than a run can count"),
])
def test_refused_naming_the_flag(tiny_corpus, tmp_path, capsys, extra, expected):
    multi = {k: [w.replace("{P}", tiny_corpus[0]) for w in v] for k, v in extra.items() if isinstance(v, list)}
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{k: v for k, v in extra.items() if k not in multi})
    for k, values in multi.items():
        argv += [k, *values]
    line = error_of(argv, capsys)
    assert line.startswith("pretrain_zaya.py: error:") and expected in line, line


@pytest.mark.parametrize("flag", ["--save", "--tensorboard-dir", "--data-cache-path"])
def test_a_symbolic_link_to_a_missing_folder_is_named_before_the_run(tiny_corpus, tmp_path, capsys, flag):
    """A link into scratch space not made yet passed the checks (and --dry-run): the run then stopped at
    os.makedirs with a bare "File exists"."""
    (tmp_path / "link").symlink_to(tmp_path / "not yet")
    for path in (tmp_path / "link", tmp_path / "link" / "sub"):
        line = error_of(tiny_run_flags(tiny_corpus, tmp_path, **{flag: path}), capsys)
        assert f"{flag} {path}: {tmp_path / 'link'} is a symbolic link to {tmp_path / 'not yet'}, which does not " \
               f"exist" in line, line


@pytest.mark.parametrize("value", ["1.5", "1", "-0.1"])
def test_a_skip_target_outside_0_to_1_is_refused(tiny_corpus, tmp_path, capsys, value):
    """--moe-router-skip-target is a share of the tokens, in [0, 1): 1 would skip every token's experts."""
    line = error_of(tiny_run_flags(tiny_corpus, tmp_path, **{"--moe-router-skip-target": value}), capsys)
    assert f"--moe-router-skip-target={float(value)}: must be in [0, 1)" in line, line


@pytest.mark.parametrize("value", [0.0, 0.99])
def test_a_skip_target_in_0_to_1_reaches_the_train_config(tiny_corpus, tmp_path, value):
    """0 is a skip target too (balance the skip class towards none of the tokens), not "no target"."""
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--moe-router-skip-target": value}))
    assert run.train.moe_router_skip_target == value


def test_the_pause_limit_defaults_to_two_hours(tiny_corpus, tmp_path):
    """--watchdog-pause-seconds (the longest evaluation or checkpoint save) is 7200 s unless given, as
    docs/CHECKPOINTING.md says; the flag reaches the train config."""
    assert parse_args(tiny_run_flags(tiny_corpus, tmp_path)).train.watchdog_pause_seconds == 7200.0
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--watchdog-pause-seconds": "0"}))
    assert run.train.watchdog_pause_seconds == 0.0
