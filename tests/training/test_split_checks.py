"""An empty split the run reads is refused before the process groups and the model (the data loaders that found
it are built after them), and --eval-iters without a validation split says so."""
import pytest

from tests.training.helpers import tiny_run_flags


@pytest.fixture
def no_model(monkeypatch):
    monkeypatch.setattr("megatron_zaya.training.setup.build_runtime", lambda run: pytest.fail("built a runtime"))


@pytest.mark.parametrize("extra, expected", [
    ({"--split": "999,1,0"}, "--split 999,1,0: the valid split of {prefix} is empty but the run reads from it "
                             "(weight 1 in {prefix})"),
    ({"--split": "999,1,0", "--full-validation": ""}, "--full-validation: --split 999,1,0: the valid split of "
                                                      "{prefix} is empty"),
    ({"--split": "999,1,0", "--data-path": ["0.5", "{prefix}", "0.5", "{prefix}"]},
     "--split 999,1,0: the valid split of {prefix} is empty but the run reads from it (weight 1 in 0.5 {prefix} "
     "0.5 {prefix})"),
])
def test_an_empty_split_the_run_reads_is_refused_before_the_model(tiny_corpus, tmp_path, capsys, no_model, extra,
                                                                   expected):
    """400 documents: a 1/1000 share holds none."""
    from pretrain_zaya import main
    prefix = tiny_corpus[0]
    extra = {k: [w.format(prefix=prefix) for w in v] if isinstance(v, list) else v for k, v in extra.items()}
    assert main(tiny_run_flags(tiny_corpus, tmp_path, **extra)) == 2
    assert expected.format(prefix=prefix) in capsys.readouterr().err


def test_a_run_without_evaluation_may_have_an_empty_validation_split(tiny_corpus, tmp_path, capsys):
    from pretrain_zaya import main
    assert main(tiny_run_flags(tiny_corpus, tmp_path, **{"--split": "999,1,0", "--eval-iters": "0",
                                                         "--dry-run": ""})) == 0


@pytest.mark.parametrize("extra, expected", [
    ({"--split": "100,0,0"}, "--eval-iters 1: --split 100,0,0 gives the validation split no share, so no "
                             "validation runs"),
    ({"--data-path": None, "--train-data-path": "{prefix}"}, "--eval-iters 1: no --valid-data-path is given, so no "
                                                             "validation runs"),
])
def test_eval_iters_without_a_validation_split_is_warned_about(tiny_corpus, tmp_path, capsys, extra, expected):
    from pretrain_zaya import main
    extra = {k: v and v.format(prefix=tiny_corpus[0]) for k, v in extra.items()}
    assert main(tiny_run_flags(tiny_corpus, tmp_path, **extra, **{"--dry-run": ""})) == 0
    assert f"WARNING {expected}" in capsys.readouterr().out


def test_skip_train_does_not_check_the_train_split(tiny_corpus, tmp_path, capsys):
    """--skip-train reads no train split: an empty one is not the error; the missing checkpoint is."""
    from pretrain_zaya import main
    code = main(tiny_run_flags(tiny_corpus, tmp_path, **{"--split": "1,999,0", "--skip-train": "",
                                                          "--load": str(tmp_path / "none")}))
    err = capsys.readouterr().err
    assert code == 2
    assert "train split" not in err and "holds no checkpoint" in err, err


def test_eval_iters_zero_is_not_warned_about(tiny_corpus, tmp_path, capsys):
    """--eval-iters 0 asks for no validation: no warning that no split gives it."""
    from pretrain_zaya import main
    assert main(tiny_run_flags(tiny_corpus, tmp_path, **{"--split": "100,0,0", "--eval-iters": "0",
                                                         "--dry-run": ""})) == 0
    assert "--eval-iters 0" not in capsys.readouterr().out


def test_a_valid_data_path_is_not_called_missing(tiny_corpus, tmp_path, capsys):
    """--train-data-path with --valid-data-path: no 'no --valid-data-path is given' warning."""
    from pretrain_zaya import main
    prefix = tiny_corpus[0]
    assert main(tiny_run_flags(tiny_corpus, tmp_path, **{"--data-path": None, "--train-data-path": prefix,
                                                         "--valid-data-path": prefix, "--dry-run": ""})) == 0
    assert "no --valid-data-path is given" not in capsys.readouterr().out
