"""A tiny training run end to end, read back through TensorBoard's own event reader."""
import os
import re
import shutil
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from megatron_zaya.arguments import parse_args
from megatron_zaya.training.batch_schedule import BatchSizeSchedule
from megatron_zaya.training.setup import build_and_train
from tests.training.helpers import tiny_run_flags


def scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_scalars_written(tiny_corpus, tmp_path, capsys):
    tb = tmp_path / "tb"
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--tensorboard-dir": tb, "--train-iters": None,
                                                               "--train-samples": 16, "--rampup-batch-size": ""})
                     + ["2", "2", "8"])
    assert build_and_train(run) == 0
    values = scalars(tb)
    for tag in ("lm loss", "lm loss validation", "lm loss validation ppl", "learning-rate", "grad-norm",
                "params-norm", "batch-size", "iteration-time", "skipped-iterations", "consumed-samples",
                "consumed-tokens", "throughput/tokens-per-sec-per-device", "throughput/tflops-per-device",
                "throughput/mfu", "memory/peak-gb",
                # Megatron-LM's names (its timers, --log-throughput, --log-memory-to-tensorboard)
                "forward-backward-time", "optimizer-time", "batch-generator-time", "throughput",
                "mem-max-allocated-bytes"):
        assert tag in values, tag
    assert all(v > 0 for tag in ("forward-backward-time", "optimizer-time") for _, v in values[tag])
    assert values["throughput"] == values["throughput/tflops-per-device"]
    assert [s for s, _ in values["lm loss"]] == [1, 2, 3, 4, 5, 6]
    # Ramp-up 2 -> 4 in steps of 2 over 8 samples: 2, 2, 2, 2 (8 samples consumed), then 4.
    assert [v for _, v in values["batch-size"]] == [2, 2, 2, 2, 4, 4]
    assert {v for _, v in values["world-size"]} == {1}      # Megatron's --log-world-size-to-tensorboard
    for layer in range(2):
        for stat in ("tokens_per_expert_min", "tokens_per_expert_max", "tokens_per_expert_cv", "routing_entropy",
                     "skip_rate", "balancing-bias/00", "balancing-bias/04"):
            assert f"moe/layer{layer:02d}/{stat}" in values, (layer, stat)
    assert "moe/layer01/eda-gamma-norm" in values and "moe/layer00/eda-gamma-norm" not in values
    assert [s for s, _ in values["lm loss validation"]] == [3, 6]
    assert [v for _, v in values["consumed-samples"]] == [2, 4, 6, 8, 12, 16]
    # Megatron-LM's "vs samples" curves, at the consumed samples (the vs_samples subfolder)
    by_samples = scalars(tb / "vs_samples")
    assert [(s, v) for s, v in by_samples["lm loss vs samples"]] == [(n, v) for n, (_, v) in
                                                                     zip([2, 4, 6, 8, 12, 16], values["lm loss"])]
    assert [s for s, _ in by_samples["lm loss validation vs samples"]] == [6, 16]
    for tag in ("learning-rate", "batch-size", "grad-norm", "params-norm", "world-size", "lm loss validation ppl"):
        assert f"{tag} vs samples" in by_samples, tag
    assert "throughput/mfu vs samples" not in by_samples
    out = capsys.readouterr().out
    assert "final validation loss" in out and "MFU" in out and "ETA" in out


def test_a_job_that_trains_nothing_keeps_the_runs_tensorboard_curves(tiny_corpus, tmp_path):
    """--skip-train on an older checkpoint (and a finished run started again) opened its writers with
    purge_step = its iteration + 1, so TensorBoard dropped every later point of the run in that folder; and a
    finished run started again (a job chain resubmitting until done) wrote its final validation a second time."""
    tb, save = tmp_path / "tb", tmp_path / "ckpt"
    flags = tiny_run_flags(tiny_corpus, tmp_path, **{"--tensorboard-dir": tb, "--save": save, "--save-interval": 3})
    assert build_and_train(parse_args(flags)) == 0
    before = scalars(tb)["lm loss"]
    assert [s for s, _ in before] == [1, 2, 3, 4, 5, 6]
    validation = scalars(tb)["lm loss validation"]
    assert [s for s, _ in validation] == [3, 6]
    for extra in (["--load", str(save)], ["--load", str(save), "--ckpt-step", "3", "--skip-train"]):
        assert build_and_train(parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--tensorboard-dir": tb})
                                          + extra)) == 0
        assert scalars(tb)["lm loss"] == before
        assert [s for s, _ in scalars(tb / "vs_samples")["lm loss vs samples"]] == [4, 8, 12, 16, 20, 24]
        if "--skip-train" not in extra:      # the finished run again: its last validation is written already
            assert scalars(tb)["lm loss validation"] == validation


def test_the_last_iterations_evaluations_are_written_once_across_jobs(tiny_corpus, tmp_path):
    """A job chain: the first job stops at its --exit-interval, the last iteration, so it skips the final
    validation and test; the job started after it (nothing left to train) evaluates and writes them; a third
    writes nothing more. Every step has one point."""
    tb, save = tmp_path / "tb", tmp_path / "ckpt"
    flags = tiny_run_flags(tiny_corpus, tmp_path, **{"--tensorboard-dir": tb, "--save": save, "--load": save,
                                                     "--exit-interval": 6, "--eval-interval": 4, "--split": "8,1,1"})
    assert build_and_train(parse_args(flags)) == 0
    assert [s for s, _ in scalars(tb)["lm loss validation"]] == [4] and "lm loss test" not in scalars(tb)
    for _ in range(2):
        assert build_and_train(parse_args(flags)) == 0
        values = scalars(tb)
        assert [s for s, _ in values["lm loss validation"]] == [4, 6]
        assert [s for s, _ in values["lm loss test"]] == [6]
        assert [s for s, _ in scalars(tb / "vs_samples")["lm loss test vs samples"]] == [24]


def test_exit_interval_stops_early(tiny_corpus, tmp_path, capsys):
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--exit-interval": 2, "--eval-iters": 0}))
    assert build_and_train(run) == 0
    out = capsys.readouterr().out
    assert "iteration        2/       6" in out and "iteration        3/       6" not in out
    assert "--exit-interval 2 reached" in out
    # an exit before a --log-interval multiple prints the iterations since the last line first
    assert build_and_train(parse_args(tiny_run_flags(tiny_corpus, tmp_path / "long", **{
        "--exit-interval": 4, "--eval-iters": 0, "--log-interval": 100}))) == 0
    lines = capsys.readouterr().out.splitlines()
    line = next(i for i, text in enumerate(lines) if "iteration        4/       6 | consumed samples:           16 | "
                in text and "| global batch size:     4 |" in text)
    assert "exiting: --exit-interval 4 reached" in lines[line + 1]
    assert "iteration        3/       6" not in "".join(lines)
    # the start-up summary says what this job reads (the data line counts the run's 6 iterations)
    assert "this job stops at iteration 2 (--exit-interval 2) of 6: its 8 samples (256 tokens) start at the " \
           "phase's sample 0" in out
    save = str(tmp_path / "ckpt")       # --skip-train reads no train data: no such line
    assert build_and_train(parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{
        "--exit-interval": 2, "--eval-iters": 1, "--save": save, "--train-iters": 2}))) == 0
    capsys.readouterr()
    assert build_and_train(parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{
        "--exit-interval": 2, "--eval-iters": 1, "--load": save, "--skip-train": ""}))) == 0
    assert "this job stops" not in capsys.readouterr().out


def test_a_resumed_job_names_the_exit_interval_multiple_it_stops_at(tiny_corpus, tmp_path, capsys):
    """A job resumed at iteration 5 with --exit-interval 3 stops at the next multiple, 6 (loop.py: iteration %
    interval == 0), not at 5 + 3: the start-up line names that iteration and the 4 samples of its one step."""
    save = tmp_path / "ckpt"
    flags = {"--train-iters": 10, "--eval-iters": 0, "--save": save}
    assert build_and_train(parse_args(tiny_run_flags(tiny_corpus, tmp_path, **flags, **{"--exit-interval": 5}))) == 0
    capsys.readouterr()
    assert build_and_train(parse_args(tiny_run_flags(tiny_corpus, tmp_path, **flags, **{"--exit-interval": 3,
                                                                                         "--load": save}))) == 0
    out = capsys.readouterr().out
    assert "iteration        6/      10" in out and "iteration        7/      10" not in out
    assert "this job stops at iteration 6 (--exit-interval 3) of 10: its 4 samples (128 tokens) start at the " \
           "phase's sample 20" in out


def test_rampup_schedule_boundaries():
    s = BatchSizeSchedule(16, 2, 2, [4, 4, 120])   # 3 increments, one per 40 samples
    assert [s.batch_size(c) for c in (0, 39, 40, 79, 80, 119, 120, 10_000)] == [4, 4, 8, 8, 12, 12, 16, 16]
    assert s.num_micro_batches(0) == 1 and s.num_micro_batches(120) == 4
    with pytest.raises(ValueError, match="--rampup-batch-size"):
        BatchSizeSchedule(16, 4, 1, [2, 2, 100])


def console_lines(out: str) -> dict[int, str]:
    return {int(m.group(1)): line for line in out.splitlines() if (m := re.search(r"iteration +(\d+)/ *\d+ \|", line))}


def test_console_averages_the_interval_and_counts_every_token(tiny_corpus, tmp_path, capsys, monkeypatch):
    """--log-interval 3: the printed loss is the mean of the three iterations' losses; tokens/s counts
    every token processed (not only those in the loss: --eod-mask-loss drops some); TensorBoard is
    written every --tensorboard-log-interval iterations (and at the last). --peak-tflops is the MFU's
    denominator (reference: TensorBoard's throughput/tflops-per-device / 50, 1e-5 relative: float32 events), and
    the console's skip column is the skipped share of ALL routed tokens of that iteration (reference: the mean over
    the layers of TensorBoard's moe/layerNN/skip_rate, every layer routing the same tokens; 6e-4 absolute: the
    column has 3 decimals). The skip class's balancing bias starts at 0 instead of -1, so that tokens are skipped."""
    from megatron_zaya.training import setup

    real_build = setup.build_model

    def skipping_build(*args, **kwargs):
        model = real_build(*args, **kwargs)
        for block in model.layers:
            block.moe.router.balancing_bias[-1] = 0.0
        return model
    monkeypatch.setattr(setup, "build_model", skipping_build)
    from megatron_zaya.training.runtime import SingleProcess
    norms, real_norm = [], SingleProcess.params_norm      # (a collective on many ranks: once an iteration)
    monkeypatch.setattr(SingleProcess, "params_norm",
                        lambda self, masters=None: norms.append(1) or real_norm(self, masters))
    tb = tmp_path / "tb"
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{
        "--tensorboard-dir": tb, "--train-iters": 7, "--log-interval": 3, "--tensorboard-log-interval": 1,
        "--eval-iters": 0, "--eod-mask-loss": "", "--log-throughput": "", "--log-params-norm": "",
        "--peak-tflops": 50}))
    assert build_and_train(run) == 0
    assert len(norms) == 7      # TensorBoard's every iteration and the console's every third share one
    values = {tag: dict(points) for tag, points in scalars(tb).items()}
    out = capsys.readouterr().out
    lines = console_lines(out)
    assert "MFU peak 50 TFLOP/s (--peak-tflops)" in out
    for step in range(1, 8):
        assert values["throughput/mfu"][step] == pytest.approx(values["throughput/tflops-per-device"][step] / 50,
                                                               rel=1e-5)
    for last in (3, 6, 7):
        printed = float(re.search(r"\| skip: (\S+) \|", lines[last]).group(1))
        layers = [values[f"moe/layer{layer:02d}/skip_rate"][last] for layer in range(2)]
        assert 0.01 < printed < 0.99 and printed == pytest.approx(sum(layers) / 2, abs=6e-4), (last, printed, layers)
    assert sorted(lines) == [3, 6, 7]
    loss = values["lm loss"]
    for last, steps in ((3, (1, 2, 3)), (6, (4, 5, 6)), (7, (7,))):
        printed = float(re.search(r"lm loss: (\S+) \|", lines[last]).group(1))
        assert printed == pytest.approx(sum(loss[s] for s in steps) / len(steps), abs=1e-4), (last, printed)
    tokens = 4 * 32                                    # global batch x sequence length
    for step in range(1, 8):
        assert values["throughput/tokens-per-sec-per-device"][step] == pytest.approx(
            tokens / values["iteration-time"][step], rel=1e-4)

    tb2 = tmp_path / "tb2"
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{
        "--tensorboard-dir": tb2, "--train-iters": 7, "--tensorboard-log-interval": 3, "--eval-iters": 0}))
    assert build_and_train(run) == 0
    assert sorted(dict(scalars(tb2)["lm loss"])) == [3, 6, 7]


def test_a_resume_from_an_older_checkpoint_leaves_one_point_per_step(tiny_corpus, tmp_path):
    """A crash after iteration 5, resumed from the checkpoint of iteration 3 into the same TensorBoard
    folder: iterations 4 and 5 are written again, and TensorBoard keeps only the new points."""
    tb, save = tmp_path / "tb", tmp_path / "ckpt"
    first = tiny_run_flags(tiny_corpus, tmp_path, **{"--tensorboard-dir": tb, "--train-iters": 5, "--eval-iters": 0,
                                                     "--save": save, "--save-interval": 3})
    assert build_and_train(parse_args(first)) == 0
    shutil.rmtree(save / "iter_0000005")
    (save / "latest_checkpointed_iteration.txt").write_text("3\n")
    # TensorBoard reads event files in name order: creation second, host, pid, then a per-process
    # counter compared as text ("10" < "9"). A real restart is a new process; here both runs share
    # one, so the resumed run's file is made in a later second to sort after the first run's.
    time.sleep(1.01 - time.time() % 1)
    resumed = tiny_run_flags(tiny_corpus, tmp_path, **{"--tensorboard-dir": tb, "--train-iters": 6, "--eval-iters": 0,
                                                       "--save": save, "--load": save})
    assert build_and_train(parse_args(resumed)) == 0
    steps = [s for s, _ in scalars(tb)["lm loss"]]
    assert steps == [1, 2, 3, 4, 5, 6], steps
    samples = [s for s, _ in scalars(tb / "vs_samples")["lm loss vs samples"]]
    assert samples == [4, 8, 12, 16, 20, 24], samples


def test_a_run_resumed_at_its_end_says_so_and_still_validates(tiny_corpus, tmp_path, capsys):
    """The same command again after it finished (the quickstart run twice): no step, a line saying why,
    and the final validation loss of the loaded model, equal to the first run's."""
    save = tmp_path / "ckpt"
    flags = tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": 3, "--save": save, "--load": save})
    assert build_and_train(parse_args(flags)) == 0
    captured = capsys.readouterr()
    first = [line for line in captured.out.splitlines() if "final validation loss" in line]
    # long operations are announced before they start, not only once done (minutes on a real corpus)
    assert f"saving checkpoint at iteration 3 (end of training) to {save}" in captured.out, captured.out
    assert re.search(r"\] building .*-train-.*\.npy \.\.\.", captured.err), captured.err
    assert build_and_train(parse_args(flags)) == 0
    out = capsys.readouterr().out
    assert f"loading checkpoint {save}" in out
    assert "nothing to train: the run is at iteration 3 of 3" in out and "iteration        1/       3" not in out
    again = [line for line in out.splitlines() if "final validation loss" in line]
    assert len(first) == len(again) == 1 and again[0].split("]", 1)[1] == first[0].split("]", 1)[1]


@pytest.mark.parametrize("evaluation, collections", [({"--eval-iters": 0}, 3),
                                                     ({"--eval-iters": 1, "--eval-interval": 2}, 7),
                                                     ({"--eval-iters": 1, "--eval-interval": 2, "--no-manual-gc-eval": ""}, 3)])
def test_manual_gc_turns_automatic_collection_off_and_collects_every_interval(tiny_corpus, tmp_path, monkeypatch,
                                                                              evaluation, collections):
    """--manual-gc --manual-gc-interval 2 over 4 iterations: automatic collection is off during every
    step, one collection at the start and one after iterations 2 and 4; on again afterwards. As in
    Megatron-LM, each evaluation (here after iterations 2 and 4) collects at its start and end too,
    unless --no-manual-gc-eval."""
    import gc

    from megatron_zaya.training import loop
    collected, enabled_in_steps = [], []
    real_collect, real_step = gc.collect, loop.Trainer.train_step
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(gc.isenabled()) or real_collect(*a))

    def train_step(trainer, micro_batches):
        enabled_in_steps.append(gc.isenabled())
        return real_step(trainer, micro_batches)
    monkeypatch.setattr(loop.Trainer, "train_step", train_step)
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": 4, "--manual-gc": "",
                                                               "--manual-gc-interval": 2, **evaluation}))
    assert build_and_train(run) == 0
    assert enabled_in_steps == [False] * 4
    assert collected == [False] * collections
    assert gc.isenabled()


def test_weight_decay_schedule_reaches_every_decaying_group(tiny_corpus, tmp_path, monkeypatch):
    """--weight-decay-incr-style linear from 0 to 0.2 over 4 iterations: the step at position p uses
    0.05 p on AdamW's matrices and on Muon's, 0 on the vectors (Megatron-LM's wd_mult)."""
    from megatron_zaya.training import loop
    seen, real_step = [], loop.Trainer.train_step

    def train_step(trainer, micro_batches):
        result = real_step(trainer, micro_batches)
        seen.append({(name, g.get("wd_mult", 1.0)): g["weight_decay"]
                     for name, opt in trainer.optimizer.optimizers.items() for g in opt.param_groups})
        return result
    monkeypatch.setattr(loop.Trainer, "train_step", train_step)
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": 4, "--eval-iters": 0,
                                                               "--weight-decay-incr-style": "linear",
                                                               "--start-weight-decay": 0, "--end-weight-decay": 0.2}))
    assert build_and_train(run) == 0
    assert len(seen) == 4
    for position, groups in enumerate(seen):
        assert groups == pytest.approx({("adamw", 1.0): 0.05 * position, ("adamw", 0.0): 0.0,
                                        ("muon", 1.0): 0.05 * position}), (position, groups)


def test_decoupled_lr_follows_the_schedule_with_its_own_peak_and_floor(tiny_corpus, tmp_path):
    """--decoupled-lr / --decoupled-min-lr: TensorBoard's decoupled-learning-rate is the run's cosine
    schedule from 1e-2 down to 1e-3, while learning-rate keeps --lr / --min-lr."""
    from megatron_zaya.optim.schedules import LRSchedule
    tb = tmp_path / "tb"
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--tensorboard-dir": tb, "--eval-iters": 0,
                                                               "--min-lr": "3e-4", "--decoupled-lr": "1e-2",
                                                               "--decoupled-min-lr": "1e-3"}))
    assert build_and_train(run) == 0
    values = scalars(tb)
    main, own = LRSchedule(3e-3, 3e-4, decay=6), LRSchedule(1e-2, 1e-3, decay=6)
    assert [v for _, v in values["learning-rate"]] == pytest.approx([main(i) for i in range(6)], rel=1e-6)
    assert [v for _, v in values["decoupled-learning-rate"]] == pytest.approx([own(i) for i in range(6)], rel=1e-6)


def test_the_test_split_is_evaluated_at_the_end(tiny_corpus, tmp_path, capsys):
    """A --split with a test share: at the end of training the test split's first --eval-iters global
    batches are evaluated (console line, TensorBoard 'lm loss test'), and the loss is the one
    tools/evaluate.py computes for the saved model on the same samples of that split. A test share
    too small to hold a document (the default 969,30,1 on this 400-document corpus) is skipped."""
    import json

    from tests.training.conftest import run_tool
    tb, save = tmp_path / "tb", tmp_path / "ckpt"
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--split": "8,1,1", "--train-iters": 3,
                                                               "--eval-iters": 2, "--tensorboard-dir": tb,
                                                               "--save": save}))
    assert build_and_train(run) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if "test loss at iteration 3" in x]
    assert len(line) == 1
    values = scalars(tb)
    assert [s for s, _ in values["lm loss test"]] == [3]
    report = tmp_path / "eval.json"
    prefix, tokenizer = tiny_corpus
    assert run_tool("evaluate", ["--load", str(save), "--data-path", prefix, "--split", "8,1,1", "--split-name", "test",
                                 "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", tokenizer,
                                 "--micro-batch-size", "2", "--eval-iters", "4",       # 2 global batches of 4
                                 "--data-cache-path", str(tmp_path / "cache"), "--output-json", str(report)]) == 0
    expected = json.loads(report.read_text())
    assert expected["samples"] == 8
    assert values["lm loss test"][0][1] == pytest.approx(expected["loss"], rel=1e-5), expected
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path / "default", **{"--train-iters": 1, "--eval-iters": 1}))
    assert build_and_train(run) == 0
    assert "test loss" not in capsys.readouterr().out


def test_forced_load_balancing_splits_every_layer_evenly(tiny_corpus, tmp_path):
    """--moe-router-force-load-balancing (benchmarks): every expert of every layer gets the same
    number of tokens and none is skipped, whatever the router learned; the run warns."""
    tb = tmp_path / "tb"
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--tensorboard-dir": tb, "--train-iters": 2,
                                                               "--eval-iters": 0,
                                                               "--moe-router-force-load-balancing": ""}))
    assert any("for benchmarks only" in w for w in run.warnings)
    assert build_and_train(run) == 0
    values = scalars(tb)
    for layer in range(2):
        lo, hi = values[f"moe/layer{layer:02d}/tokens_per_expert_min"], values[f"moe/layer{layer:02d}/tokens_per_expert_max"]
        assert [v for _, v in lo] == [v for _, v in hi] and lo[0][1] > 0, (layer, lo, hi)
        assert {v for _, v in values[f"moe/layer{layer:02d}/skip_rate"]} == {0.0}


def test_the_start_up_lines_say_model_layout_batch_and_how_often_each_dataset_is_read(tiny_corpus, tmp_path, capsys):
    """Before the first step: the parameter counts (model/accounting.py), the layout and batch, and per dataset
    of the train blend its share of the run's tokens over its train-split tokens (here a weight-3 copy of
    the corpus is read three times as often as the weight-1 one)."""
    import numpy as np

    from megatron_zaya.data.indexed import IndexedDataset
    from megatron_zaya.model.accounting import count_parameters

    prefix = tiny_corpus[0]
    copy = str(tmp_path / "copy_text_document")
    for ext in (".bin", ".idx", ".tokenizer.json"):
        shutil.copy(prefix + ext, copy + ext)
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--data-path": ["3", prefix, "1", copy],
                                                                "--train-iters": 1, "--eval-iters": 0}))
    assert build_and_train(run) == 0
    out = capsys.readouterr().out
    counts = count_parameters(run.model)
    assert (f"model: 2 layers, hidden 128, 4 heads (2 query groups, head size 32, rotary 0.5), 4 experts + skip "
            f"(FFN 256); {counts.total / 1e6:.2f}M parameters") in out
    assert "layout: 1 process: DP 1 x TP 1 x CP 1, EP 1; fp32, muon" in out
    assert "batch: 4 sequences of 32 tokens per iteration (128 tokens) = micro-batch 2 x 2 accumulation x DP 1" in out
    lengths = IndexedDataset(prefix).sequence_lengths
    train_tokens = int(np.sum(lengths[:int(round(0.969 * len(lengths)))], dtype=np.int64))   # --split 969,30,1
    assert "data: 128 training tokens over 2 datasets" in out
    for weight, name in ((0.75, prefix), (0.25, copy)):
        assert f"{weight * 128 / train_tokens:8.3g} passes over {train_tokens:,} train-split tokens (weight " \
               f"{weight:.3g}) of {name}" in out, out


def test_a_dry_run_checks_and_summarises_without_a_model(tiny_corpus, tmp_path, capsys, monkeypatch):
    """--dry-run: the checks of a real start for the WORLD_SIZE given (here 4: DP 4), the summary, exit 0,
    and no checkpoint; the data indices it builds are cached for the real run. A validation split without a
    document fails there as it would at the real start."""
    from pretrain_zaya import main

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setattr("megatron_zaya.training.setup.build_model", lambda run: pytest.fail("no model in a dry run"))
    save, cache = tmp_path / "ckpt", tmp_path / "cache"
    flags = tiny_run_flags(tiny_corpus, tmp_path, **{"--global-batch-size": 8, "--save": save, "--dry-run": ""})
    assert main(flags) == 0
    out = capsys.readouterr().out
    assert "layout: 4 processes: DP 4 x TP 1 x CP 1, EP 1" in out and "= micro-batch 2 x 1 accumulation x DP 4" in out
    assert "dry run: every check passed for 4 processes and 6 iterations" in out, out
    assert not save.exists() and any(name.endswith("document_index.npy") for name in os.listdir(cache))
    assert main(tiny_run_flags(tiny_corpus, tmp_path, **{"--split": "999,1,0", "--global-batch-size": 8,
                                                         "--dry-run": ""})) == 2       # 400 documents: none is valid
    assert "--split 999,1,0: the valid split of" in capsys.readouterr().err



def test_the_padded_vocabulary_is_one_tensor_parallelism_splits(capsys, monkeypatch):
    """Megatron-LM's NullTokenizer flags at TP 2 with --make-vocab-size-divisible-by 1: the 1,001 ids pad to
    1,002 rows (TP 2 splits them), not 1,001, on which the parallel model would stop at its start."""
    from pretrain_zaya import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["--preset", "zaya1-tiny", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000",
                 "--train-iters", "3", "--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "1",
                 "--global-batch-size", "4", "--dry-run"]) == 0
    assert "vocabulary 1,002 (tokenizer 1,001)" in capsys.readouterr().out
    # TP 3 with the preset's 8,192 rows (which 3 does not divide): the run's vocabulary is the tokenizer's
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main(["--preset", "zaya1-tiny", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000",
                 "--train-iters", "3", "--tensor-model-parallel-size", "3", "--num-attention-heads", "6",
                 "--num-query-groups", "3", "--moe-ffn-hidden-size", "192", "--global-batch-size", "4",
                 "--micro-batch-size", "4", "--dry-run"]) == 0
    assert "vocabulary 1,152 (tokenizer 1,001)" in capsys.readouterr().out      # 3 x 384 = lcm(128, 3)
