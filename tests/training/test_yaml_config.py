"""YAML run configs (--config FILE): keys as flags (dashes or underscores) or settings, command-line flags
winning over the file, values converted as argparse converts the same words, and bad values named with
the key and the file."""
import pytest

from megatron_zaya.arguments import parse_args
from tests.training.helpers import tiny_run_flags
from tests.training.test_arguments import error_of


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


def test_the_command_line_overrides_every_kind_of_yaml_key(tiny_corpus, tmp_path):
    """An on/off key the file turns on is turned off by --no-FLAG; the command line choosing an alternative
    (--train-samples, --lr-warmup-fraction) sets the file's other one aside instead of stopping the run."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text("bf16: true\nuse-distributed-optimizer: true\ntrain-iters: 9\nlr-warmup-iters: 2\n")
    flags = tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": None}) + ["--config", str(cfg)]
    run = parse_args(flags)
    assert run.train.bf16 and run.parallel.use_distributed_optimizer and run.train.train_iters == 9
    run = parse_args(flags + ["--no-bf16", "--no-use-distributed-optimizer", "--train-samples", "40",
                              "--lr-warmup-fraction", "0.1"])
    assert not run.train.bf16 and not run.parallel.use_distributed_optimizer
    assert run.train.train_iters is None and run.train.train_samples == 40
    assert run.train.lr_warmup_iters == 0 and run.train.lr_warmup_fraction == 0.1
    # a command-line value equal to the default still counts as the choice (no warm-up over the file's fraction)
    cfg.write_text("train-iters: 9\nlr-warmup-fraction: 0.1\n")
    run = parse_args(flags + ["--lr-warmup-iters", "0"])
    assert run.train.lr_warmup_iters == 0 and run.train.lr_warmup_fraction is None


def test_the_command_line_s_data_source_and_bias_step_set_the_file_s_aside(tiny_corpus, tmp_path):
    """--mock-data (or per-split blends) over a file's data-path, and the bias step under either name over the file's
    other spelling, used to stop the run ('exclude each other', 'set the same step') with no flag to clear the
    file's key; per-split blends given in part keep their other splits from the file."""
    prefix = tiny_corpus[0]
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"data-path: {prefix}\nmoe-router-bias-update-rate: 0.01\n")
    flags = tiny_run_flags(tiny_corpus, tmp_path, **{"--data-path": None}) + ["--config", str(cfg)]
    assert parse_args(flags).data.data_path == [prefix]
    run = parse_args(flags + ["--mock-data", "--moe-router-bias-lr", "0.02"])
    assert run.data.mock_data and not run.data.data_path and run.train.moe_router_bias_lr == 0.02
    cfg.write_text(f"train-data-path: {prefix}\nvalid-data-path: {prefix}\n")
    run = parse_args(flags + ["--train-data-path", prefix, prefix])
    assert run.data.train_data_path == [prefix, prefix] and run.data.valid_data_path == [prefix]
    run = parse_args(flags + ["--data-path", prefix])
    assert run.data.data_path == [prefix] and not run.data.train_data_path and not run.data.valid_data_path


def test_yaml_values_are_converted_like_command_line_words(tiny_corpus, tmp_path, capsys):
    prefix = tiny_corpus[0]
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"data-path: {prefix}\nbf16: true\nrampup-batch-size: 2 2 8\nsave: null\nlr: 1e-3\n")
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--data-path": None, "--lr": None, "--train-iters": None,
                                                               "--train-samples": 16}) + ["--config", str(cfg)])
    assert run.data.data_path == [prefix] and run.train.bf16 is True and run.optim.lr == 1e-3
    assert run.train.rampup_batch_size == [2, 2, 8]
    # plain numbers are words, as on a command line (YAML 1.1 read 0777 as octal 511)
    cfg.write_text(f"data-path: {prefix}\nseed: 0777\nlr: 3.0e-4\n")
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--data-path": None, "--lr": None})
                     + ["--config", str(cfg)])
    assert run.train.seed == 777 and run.optim.lr == 3e-4
    cfg.write_text(f"data-path: 30 {prefix} 70 {prefix}\n")
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--data-path": None}) + ["--config", str(cfg)])
    assert run.data.data_path == ["30", prefix, "70", prefix]


def test_a_yaml_key_naming_a_setting_sets_it(tiny_corpus, tmp_path):
    """A key may name the setting a --no-... flag turns off: `mmap-bin-files: false` is that setting off, as
    --no-mmap-bin-files (it turned it on); the flag's own name keeps the flag's meaning."""
    cfg = tmp_path / "run.yaml"
    for text, mmap in (("mmap-bin-files: false\n", False), ("mmap-bin-files: true\n", True),
                       ("no-mmap-bin-files: true\n", False), ("no-mmap-bin-files: false\n", True)):
        cfg.write_text(text)
        run = parse_args(tiny_run_flags(tiny_corpus, tmp_path) + ["--config", str(cfg)])
        assert run.data.mmap_bin_files is mmap, text


@pytest.mark.parametrize("text, expected", [
    ('bf16: "no"\n', "key 'bf16' is an on/off flag"),
    ("sequence-parallel: false_\n", "key 'sequence-parallel' is an on/off flag"),
    ("micro-batch-size: 2.5\n", "key 'micro-batch-size' has an invalid int value '2.5'"),
    ("lr: fast\n", "key 'lr' has an invalid float value 'fast'"),
    ("optimizer: sgd\n", "key 'optimizer' has value 'sgd'"),
    ("rampup-batch-size: [2, 2]\n", "key 'rampup-batch-size' expects 3 values"),
    ("split: [98, 2, 0]\n", "key 'split' expects a single value"),
    ("lr: null\n", "key 'lr' has no value"),
    ("exit-duration-in-mins: 1:30\n", "key 'exit-duration-in-mins' has an invalid float value '1:30'"),
])
def test_bad_yaml_values_name_key_and_file(tiny_corpus, tmp_path, capsys, text, expected):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    line = error_of(tiny_run_flags(tiny_corpus, tmp_path) + ["--config", str(cfg)], capsys)
    assert f"--config {cfg}: {expected}" in line, line


@pytest.mark.parametrize("content, expected", [
    (b"# caf\xe9\nlr: 0.1\n", "not UTF-8 text (byte 5"),                       # a Latin-1 comment
    (b"train-iters: 3\nlr: 0.1\ntrain-iters: 5\n", "not valid YAML (key 'train-iters' given twice in"),
    (b"train-iters: 3\ntrain_iters: 5\n", "keys 'train-iters' and 'train_iters' both set --train-iters"),
])
def test_a_config_file_read_wrongly_or_setting_a_key_twice_is_named(tiny_corpus, tmp_path, capsys, content, expected):
    """One line, not a traceback (a .bin given as --config) or the last of two values kept silently."""
    cfg = tmp_path / "run.yaml"
    cfg.write_bytes(content)
    line = error_of(tiny_run_flags(tiny_corpus, tmp_path) + ["--config", str(cfg)], capsys)
    assert f"--config {cfg}: {expected}" in line, line


def test_yaml_merge_keys_load_and_may_be_overridden():
    """`<<: *anchor` is not a key given twice (the duplicate-key check once refused every merge key)."""
    import yaml

    from megatron_zaya.flags import _WordLoader
    text = "base: &base {lr: 0.1, train-iters: 3}\nrun:\n  <<: *base\n  lr: 0.2\n"
    assert yaml.load(text, Loader=_WordLoader)["run"] == {"lr": "0.2", "train-iters": "3"}
    with pytest.raises(yaml.constructor.ConstructorError, match="key 'lr' given twice"):
        yaml.load(text + "  lr: 0.3\n", Loader=_WordLoader)


def test_a_yaml_key_may_keep_the_flags_dashes(tmp_path):
    """`--train-iters: 3` names the flag as `train-iters: 3` does."""
    from megatron_zaya.flags import apply_yaml_defaults, build_parser
    cfg = tmp_path / "c.yaml"
    cfg.write_text("--train-iters: 3\n")
    parser = build_parser()
    apply_yaml_defaults(parser, str(cfg))
    assert parser.get_default("train_iters") == 3


@pytest.mark.parametrize("text, message", [
    # `config: other.yaml` in a --config file is an unknown key (it would be ignored silently)
    ("config: other.yaml\n", "unknown key 'config'"),
    # `on` in a list is YAML 1.1's true, not the word 'on': named, not passed on as 'True'
    ("data-path: [1, on]\n", "expects numbers or strings"),
])
def test_a_config_key_or_value_read_otherwise_than_written_is_refused(tmp_path, capsys, text, message):
    from megatron_zaya.flags import apply_yaml_defaults, build_parser
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(SystemExit):
        apply_yaml_defaults(build_parser(), str(cfg))
    assert message in capsys.readouterr().err


def test_a_config_file_of_comments_only_sets_nothing(tmp_path):
    """A --config file with no keys (all commented out) is an empty mapping, not an error."""
    from megatron_zaya.flags import apply_yaml_defaults, build_parser
    cfg = tmp_path / "c.yaml"
    cfg.write_text("# train-iters: 3\n")
    assert apply_yaml_defaults(build_parser(), str(cfg)) == {}


def test_a_yaml_word_starting_with_a_tilde_is_a_home_folders_path(tiny_corpus, tmp_path, monkeypatch):
    """`save: ~/ckpt` is $HOME/ckpt, as the shell makes the same word on a command line (it was a folder named
    "~" in the working folder); a blend's words each, as a shell splits them."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "run.yaml"
    cfg.write_text("save: ~/ckpt\ntensorboard-dir: ~/tb\n")      # (a lone ~ is YAML's null)
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path) + ["--config", str(cfg)])
    assert run.train.save == str(tmp_path / "home" / "ckpt") and run.train.tensorboard_dir == str(tmp_path / "home/tb")
