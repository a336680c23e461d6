"""What a resumed run takes from its checkpoint. --use-checkpoint-opt_param-scheduler: the LR and
weight-decay schedules of the run that saved it, whatever this run's schedule flags say (without it,
this run's flags); --use-checkpoint-args: its model config, under the model flags given."""
import json
import re

import pytest

from megatron_zaya.arguments import parse_args
from megatron_zaya.optim.schedules import lr_schedule_from_flags
from megatron_zaya.training.setup import build_and_train
from tests.training.helpers import tiny_run_flags

FIRST = {"--train-iters": 8, "--lr": "3e-3", "--min-lr": "3e-4", "--lr-warmup-iters": 2, "--lr-decay-style": "cosine",
         "--weight-decay": "0.05", "--eval-interval": 100}
SECOND = {"--lr": "1e-2", "--min-lr": "0", "--lr-warmup-iters": 0, "--lr-decay-style": "linear", "--weight-decay": "0.2"}


def _lrs(out: str) -> dict[int, float]:
    return {int(it): float(lr) for it, lr in re.findall(r"iteration\s+(\d+)/\s*\d+ \|.*? learning rate: ([0-9.E+-]+) \|", out)}


@pytest.fixture(scope="module")
def first_run(tiny_corpus, tmp_path_factory):
    """The saving run: 4 of its 8 iterations, then a checkpoint (the resumes below only read it)."""
    tmp_path = tmp_path_factory.mktemp("first")
    first = tiny_run_flags(tiny_corpus, tmp_path, **FIRST, **{"--save": tmp_path / "ckpt", "--exit-interval": 4})
    assert build_and_train(parse_args(first)) == 0
    return parse_args(first), tmp_path / "ckpt"


def _resumed(first_run, tiny_corpus, tmp_path, capsys, extra):
    first, save = first_run
    capsys.readouterr()
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{**FIRST, **SECOND, "--load": save}) + extra)
    assert build_and_train(run) == 0
    return first, capsys.readouterr().out


def test_resume_follows_the_checkpoints_schedule(first_run, tiny_corpus, tmp_path, capsys):
    first, out = _resumed(first_run, tiny_corpus, tmp_path, capsys, ["--use-checkpoint-opt_param-scheduler"])
    schedule = lr_schedule_from_flags(first.optim.lr, first.train, 8)
    lrs = _lrs(out)
    assert sorted(lrs) == [5, 6, 7, 8]
    for it, lr in lrs.items():                  # iteration `it` ran at schedule position it - 1
        assert lr == pytest.approx(schedule(it - 1), rel=1e-3), (it, lr)
    assert "the schedules follow the checkpoint's --lr 0.003 (this run: 0.01)" in out
    assert "--weight-decay 0.05 (this run: 0.2)" in out


def test_resume_without_the_flag_follows_this_runs_flags(first_run, tiny_corpus, tmp_path, capsys):
    first, out = _resumed(first_run, tiny_corpus, tmp_path, capsys, [])
    second = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{**FIRST, **SECOND}))
    schedule = lr_schedule_from_flags(second.optim.lr, second.train, 8)
    lrs = _lrs(out)
    assert sorted(lrs) == [5, 6, 7, 8]
    for it, lr in lrs.items():
        assert lr == pytest.approx(schedule(it - 1), rel=1e-3), (it, lr)
    assert "schedules follow the checkpoint" not in out
    assert ("the LR / weight-decay schedules follow this run's flags, which differ from the checkpoint's: "
            "--lr 0.01 (checkpoint: 0.003), --min-lr 0.0 (checkpoint: 0.0003)") in out
    assert "--use-checkpoint-opt_param-scheduler keeps the checkpoint's" in out


def test_a_resume_with_another_global_batch_size_says_how_the_schedule_goes_on(first_run, tiny_corpus, tmp_path,
                                                                               capsys):
    """--train-iters with --global-batch-size 8 after 4 iterations of 4: the schedule goes on at iteration 4,
    one iteration per step (as the LRs show), and the warning says where Megatron-LM's, counted in samples,
    would be: 16 samples / 8 = iteration 2."""
    first, out = _resumed(first_run, tiny_corpus, tmp_path, capsys, ["--global-batch-size", "8"])
    second = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{**FIRST, **SECOND}))
    schedule = lr_schedule_from_flags(second.optim.lr, second.train, 8)
    lrs = _lrs(out)
    assert sorted(lrs) == [5, 6, 7, 8]
    assert all(lr == pytest.approx(schedule(it - 1), rel=1e-3) for it, lr in lrs.items()), lrs
    assert ("--global-batch-size 8 (checkpoint: 4): the LR / weight-decay schedules go on from iteration 4 of "
            "--train-iters, one per step of 8 samples; Megatron-LM counts them in samples and would go on from 2 "
            "(--train-samples with the --lr-*-samples flags counts samples here too)") in out
    _, same = _resumed(first_run, tiny_corpus, tmp_path / "same", capsys, [])
    assert "--global-batch-size" not in same and "--seed" not in same


def test_a_resume_with_another_seed_says_the_data_order_changes(first_run, tiny_corpus, tmp_path, capsys):
    _, out = _resumed(first_run, tiny_corpus, tmp_path, capsys, ["--seed", "7"])
    assert "--seed 7 (checkpoint: 1234): the data goes on from sample 16 of this seed's shuffle" in out


def test_a_requeued_resume_with_the_flag_keeps_the_checkpoints_schedule(first_run, tiny_corpus, tmp_path, capsys):
    """The resumed run's checkpoints keep the schedule it follows (the first run's), not its own flags: the same
    command run again after a stop at iteration 6 goes on with it, and a resume without the flag is told that
    its flags differ from that schedule."""
    first, save = first_run
    schedule = lr_schedule_from_flags(first.optim.lr, first.train, 8)
    second = {**FIRST, **SECOND, "--save": tmp_path / "b"}
    flag = ["--use-checkpoint-opt_param-scheduler"]
    assert build_and_train(parse_args(tiny_run_flags(tiny_corpus, tmp_path, **second, **{"--load": save,
                                                                                         "--exit-interval": 6})
                                      + flag)) == 0
    capsys.readouterr()
    assert build_and_train(parse_args(tiny_run_flags(tiny_corpus, tmp_path, **second, **{"--load": tmp_path / "b"})
                                      + flag)) == 0
    lrs = _lrs(capsys.readouterr().out)
    assert sorted(lrs) == [7, 8]
    assert all(lr == pytest.approx(schedule(it - 1), rel=1e-3) for it, lr in lrs.items()), lrs
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{**second, "--load": tmp_path / "b",
                                                                "--save": tmp_path / "c"}))
    assert build_and_train(run) == 0
    assert "--lr 0.01 (checkpoint: 0.003)" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    ([], "--use-checkpoint-opt_param-scheduler needs --load"),
    (["--load", "x", "--finetune"], "--use-checkpoint-opt_param-scheduler and --finetune exclude each other"),
    (["--load", "x", "--override-opt_param-scheduler"],
     "--use-checkpoint-opt_param-scheduler and --override-opt_param-scheduler exclude each other"),
])
def test_flag_combinations_are_checked(tiny_corpus, tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit):
        parse_args(tiny_run_flags(tiny_corpus, tmp_path) + ["--use-checkpoint-opt_param-scheduler"] + extra)
    assert message in capsys.readouterr().err


def test_use_checkpoint_args_takes_the_model_config_from_the_checkpoint(first_run, tiny_corpus, tmp_path, capsys):
    _, save = first_run
    saved = json.loads((save / "iter_0000004" / "metadata.json").read_text())["model_config"]
    flags = tiny_run_flags(tiny_corpus, tmp_path, **{**FIRST, "--load": save, "--num-layers": None,
                                                       "--seq-length": None, "--preset": None,
                                                       "--use-checkpoint-args": ""})
    run = parse_args(flags)
    assert run.model.to_dict() == saved and (saved["num_layers"], saved["seq_length"]) == (2, 32)  # preset: 4, 256
    assert build_and_train(run) == 0          # the 2-layer checkpoint loads into it and training resumes
    assert "iteration        8/       8" in capsys.readouterr().out
    assert parse_args(flags + ["--rotary-base", "20000"]).model.to_dict() == {**saved, "rotary_base": 20000.0}


@pytest.mark.parametrize("extra, message", [
    ([], "--use-checkpoint-args needs --load"),
    (["--load", "{tmp}", "--preset", "zaya1-tiny"], "--use-checkpoint-args and --preset zaya1-tiny exclude each other"),
    (["--load", "{tmp}"], "--use-checkpoint-args: --load {tmp} holds no checkpoint with a model config"),
])
def test_use_checkpoint_args_needs_a_checkpoint(tiny_corpus, tmp_path, capsys, extra, message):
    extra = [word.replace("{tmp}", str(tmp_path)) for word in extra]
    with pytest.raises(SystemExit):
        parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--preset": None}) + ["--use-checkpoint-args"] + extra)
    assert message.replace("{tmp}", str(tmp_path)) in capsys.readouterr().err


def test_use_mp_args_from_checkpoint_args_takes_the_tensor_parallel_size(first_run, tiny_corpus, tmp_path, capsys,
                                                                        monkeypatch):
    """--use-mp-args-from-checkpoint-args (with --use-checkpoint-args): the tensor-parallel size of the run that
    saved the checkpoint replaces this run's, with a warning; read from a copy whose layout says TP=2."""
    import shutil

    _, save = first_run
    copy = tmp_path / "ckpt"
    shutil.copytree(save, copy)
    meta_path = copy / "iter_0000004" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    assert meta["layout"]["tensor_model_parallel_size"] == 1
    meta["layout"]["tensor_model_parallel_size"] = 2
    meta_path.write_text(json.dumps(meta))
    monkeypatch.setenv("WORLD_SIZE", "2")
    flags = tiny_run_flags(tiny_corpus, tmp_path, **{**FIRST, "--load": copy, "--num-layers": None,
                                                       "--preset": None, "--use-checkpoint-args": ""})
    assert parse_args(flags).parallel.tensor_model_parallel_size == 1
    run = parse_args(flags + ["--use-mp-args-from-checkpoint-args"])
    assert (run.parallel.tensor_model_parallel_size, run.parallel.data_parallel_size) == (2, 1)
    assert any("--tensor-model-parallel-size 2, the checkpoint's (instead of 1)" in w for w in run.warnings)


def test_use_checkpoint_args_takes_the_tokenizer_too(first_run, tiny_corpus, tmp_path, capsys):
    """Without --tokenizer-model, --use-checkpoint-args takes the saving run's tokenizer flags (as Megatron-LM
    takes its tokenizer model), saying so; --no-use-tokenizer-model-from-checkpoint-args keeps them out."""
    _, save = first_run
    flags = tiny_run_flags(tiny_corpus, tmp_path, **{**FIRST, "--load": save, "--num-layers": None, "--preset": None,
                                                       "--use-checkpoint-args": "", "--tokenizer-model": None})
    run = parse_args(flags)
    assert (run.data.tokenizer_type, run.data.tokenizer_model) == ("GPTSentencePieceTokenizer", tiny_corpus[1])
    assert any(w.startswith("--use-checkpoint-args: the tokenizer of the run that saved the checkpoint")
               for w in run.warnings)
    with pytest.raises(SystemExit):
        parse_args(flags + ["--no-use-tokenizer-model-from-checkpoint-args"])
    assert "--tokenizer-model" in capsys.readouterr().err


def _resharded(first_run, tmp_path, *extra):
    from tests.checkpoint.ckpt_harness import convert_tool
    resharded = tmp_path / "resharded"
    assert convert_tool().main(["reshard", str(first_run[1]), str(resharded), "--no-progress", *extra]) == 0
    return resharded


def test_a_resharded_checkpoint_keeps_its_sources_schedule(first_run, tiny_corpus, tmp_path, capsys):
    """reshard keeps the source's train state and so the schedule flags it was reached with: a --no-load-optim
    resume with --use-checkpoint-opt_param-scheduler follows the source run's schedule, and one without it is
    told how its flags differ (the flag was refused, and the difference went unsaid)."""
    first, _ = first_run
    resharded = _resharded(first_run, tmp_path)
    capsys.readouterr()
    flags = tiny_run_flags(tiny_corpus, tmp_path, **{**FIRST, **SECOND, "--load": resharded, "--no-load-optim": ""})
    assert build_and_train(parse_args(flags + ["--use-checkpoint-opt_param-scheduler"])) == 0
    out = capsys.readouterr().out
    schedule = lr_schedule_from_flags(first.optim.lr, first.train, 8)
    lrs = _lrs(out)
    assert sorted(lrs) == [5, 6, 7, 8]
    for it, lr in lrs.items():
        assert lr == pytest.approx(schedule(it - 1), rel=1e-3), (it, lr)
    assert build_and_train(parse_args(flags)) == 0
    assert "which differ from the checkpoint's: --lr 0.01 (checkpoint: 0.003)" in capsys.readouterr().out


def test_a_checkpoint_converted_as_a_fresh_start_has_no_schedule_to_keep(first_run, tiny_corpus, tmp_path):
    """A reshard relabelled as a fresh start (--iteration) records its source's tokenizer flags, not the run's:
    --use-checkpoint-opt_param-scheduler stops naming it (it took the tokenizer record for run flags)."""
    from megatron_zaya.checkpoint import CheckpointError
    resharded = _resharded(first_run, tmp_path, "--iteration", "2")
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{**FIRST, "--load": resharded, "--no-load-optim": ""})
                     + ["--use-checkpoint-opt_param-scheduler"])
    with pytest.raises(CheckpointError, match="holds no schedule flags of a training run"):
        build_and_train(run)


def test_schedule_flags_of_a_checkpoint_saved_before_they_were_kept():
    """A checkpoint without "schedule_flags": its run's schedule flags come from its "args"."""
    from megatron_zaya.optim.schedules import schedule_flags_of
    meta = {"args": {"lr": 0.003, "min_lr": 0.0003, "seed": 1234, "global_batch_size": 4}}
    assert schedule_flags_of(meta) == {"lr": 0.003, "min_lr": 0.0003}
    assert schedule_flags_of({"schedule_flags": {"lr": 1.0}, "args": {"lr": 2.0}}) == {"lr": 1.0}


def _trainer(unit, gbs, **state):
    from types import SimpleNamespace
    from megatron_zaya.training.loop import TrainState
    return SimpleNamespace(lr_schedule=SimpleNamespace(unit=unit), cfg=SimpleNamespace(global_batch_size=gbs),
                           state=TrainState(**state))


def test_no_batch_size_note_when_the_schedules_count_samples():
    """Under --train-samples (schedule unit samples) a new --global-batch-size changes nothing: no note."""
    from megatron_zaya.checkpoint.training import batch_size_change_notes
    trainer = _trainer("samples", 8, iteration=4, consumed_samples=16, scheduled_samples=16, scheduled_iterations=4.0)
    assert batch_size_change_notes(trainer, {"global_batch_size": 4}) == []


def test_the_batch_size_note_counts_the_scheduled_samples():
    """The note names the schedules' position (skipped steps left out), not the data position."""
    from megatron_zaya.checkpoint.training import batch_size_change_notes
    trainer = _trainer("iters", 8, iteration=5, consumed_samples=20, scheduled_samples=16, scheduled_iterations=4.0)
    (note,) = batch_size_change_notes(trainer, {"global_batch_size": 4})
    assert "go on from iteration 4 of --train-iters" in note and "would go on from 2 " in note, note


def test_a_finetune_is_not_told_how_its_flags_differ_from_the_checkpoints(first_run, tiny_corpus, tmp_path, capsys):
    """--finetune starts its own schedules, data and RNG from the checkpoint's weights: no note compares its
    schedule, batch size or seed with the checkpoint's."""
    _, out = _resumed(first_run, tiny_corpus, tmp_path, capsys, ["--finetune", "--global-batch-size", "8",
                                                                  "--seed", "7"])
    assert "(checkpoint: " not in out and "iteration and samples reset to 0" in out, out


def test_a_schedule_flag_left_out_is_named_so(first_run, tiny_corpus, tmp_path, capsys):
    """A flag one run left out is "not given" in the note, not its None."""
    _, out = _resumed(first_run, tiny_corpus, tmp_path, capsys, ["--lr-decay-iters", "6"])
    assert "--lr-decay-iters 6 (checkpoint: not given)" in out, out
    _, out = _resumed(first_run, tiny_corpus, tmp_path / "b", capsys, ["--lr-decay-iters", "6",
                                                                        "--use-checkpoint-opt_param-scheduler"])
    assert "--lr-decay-iters not given (this run: 6)" in out, out
