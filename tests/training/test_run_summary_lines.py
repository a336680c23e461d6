"""training.run_summary without a run: the model line's active parameters (the embedding included), the
layout's extras and recompute, the ramp-up's start, the billions threshold, and the job line only for a
job that stops before the run's end."""
import dataclasses
from types import SimpleNamespace

from megatron_zaya.arguments import parse_args
from megatron_zaya.model.accounting import count_parameters
from megatron_zaya.training.batch_schedule import BatchSizeSchedule
from megatron_zaya.training.loop import TrainState
from megatron_zaya.training.run_summary import _count, job_end_lines, startup_lines


def mock_run(*extra):
    return parse_args(["--preset", "zaya1-tiny", "--num-layers", "2", "--mock-data", "--micro-batch-size", "2",
                       "--global-batch-size", "8", "--seq-length", "32", "--train-samples", "64",
                       "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", "--lr", "1e-3", *extra])


def test_start_up_lines_name_the_active_parameters_extras_recompute_and_rampup():
    run = mock_run("--rampup-batch-size", "2", "6", "16", "--recompute-granularity", "full",
                   "--use-distributed-optimizer")
    model_line, layout, batch = startup_lines(run, 1000, {}, 64)
    counts = count_parameters(run.model)
    without = counts.active_non_embedding(run.model.num_experts)
    assert f"{_count(without + counts.embedding)} active per token ({_count(without)} without the embedding)" \
        in model_line and counts.embedding > 0
    assert layout.endswith("EP 1, ZeRO-1; fp32, muon, recompute full"), layout
    assert batch.endswith("; ramped up from 2 sequences"), batch
    sp = dataclasses.replace(run, parallel=dataclasses.replace(run.parallel, use_distributed_optimizer=False,
                                                               sequence_parallel=True))
    assert startup_lines(sp, 1000, {}, 64)[1].split(";")[0].endswith("EP 1, sequence parallel")


def test_counts_switch_to_billions_at_one_billion():
    assert (_count(999_990_000), _count(10 ** 9), _count(2_500_000_000)) == ("999.99M", "1.00B", "2.50B")


def test_the_job_line_only_for_a_job_that_stops_before_the_end():
    """--exit-interval 2 of 6 iterations: a job at iteration 4 stops at 6, the run's end (no stop line); one at 2
    stops at 4 and reads 2 x 4 samples. Both resume where the interval ended the job before, and say that they
    train on (a recipe phase re-run by hand would train into the next phase); a first job, or one resumed
    between multiples, does not."""
    run = SimpleNamespace(train=SimpleNamespace(exit_interval=2, skip_train=False),
                          model=SimpleNamespace(seq_length=32))
    schedule = BatchSizeSchedule(4, 2, 1)
    note, = job_end_lines(run, TrainState(iteration=4, consumed_samples=16), schedule, 6)
    assert note.startswith("note: this job resumes at iteration 4, where --exit-interval 2 ended the one before, "
                           "and trains on to iteration 6; a run that had to end at 4 (a recipe's phase) is complete")
    note, line = job_end_lines(run, TrainState(iteration=2, consumed_samples=8), schedule, 6)
    assert "trains on to iteration 4;" in note
    assert line.startswith("this job stops at iteration 4 (--exit-interval 2) of 6: its 8 samples (256 tokens)")
    run.train.exit_interval = 4
    assert job_end_lines(run, TrainState(iteration=0), schedule, 6)[0].startswith("this job stops at iteration 4")
    assert job_end_lines(run, TrainState(iteration=5, consumed_samples=20), schedule, 6) == []
