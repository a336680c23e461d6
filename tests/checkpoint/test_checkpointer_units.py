"""checkpoint.training's TrainingCheckpointer pieces: the layout it records (data-parallel size over TP x CP),
which checkpoints hold optimizer state, which trained parameters have none, the outcome of the last save (not
the first), and a run loaded from another folder than its --save still saves there."""
import dataclasses
import os
from types import SimpleNamespace

import pytest
import torch

from ckpt_harness import flags, train
from megatron_zaya.arguments import parse_args
from megatron_zaya.checkpoint.format import CheckpointError, list_complete
from megatron_zaya.checkpoint.training import TrainingCheckpointer, optimizer_state_gaps, require_optimizer_state
from megatron_zaya.training.loop import TrainState


def test_the_layout_counts_data_parallel_ranks_over_tensor_and_context_parallelism():
    run = parse_args(["--preset", "zaya1-tiny", "--num-layers", "2", "--mock-data", "--micro-batch-size", "2",
                      "--seq-length", "32", "--train-iters", "2", "--tokenizer-type", "NullTokenizer",
                      "--vocab-size", "1000", "--lr", "1e-3"])
    run = dataclasses.replace(run, parallel=dataclasses.replace(run.parallel, tensor_model_parallel_size=2,
                                                                context_parallel_size=2))
    meta = TrainingCheckpointer._global_meta(SimpleNamespace(run=run, world_size=8),
                                             SimpleNamespace(state=TrainState()))
    assert meta["layout"]["data_parallel_size"] == 2 and meta["layout"]["world_size"] == 8


def fake_folder(keys, classes=None):
    return SimpleNamespace(folder="ckpt", keys=lambda prefix="": [k for k in keys if k.startswith(prefix)],
                           ranks=[SimpleNamespace(meta={"objects": {"optimizer": {"classes": classes or {}}}})])


def test_optimizer_state_is_the_recorded_classes_or_optim_tensors():
    """A checkpoint written by another tool has optim/ tensors without the classes training records: it holds
    optimizer state; one with neither does not."""
    require_optimizer_state(fake_folder(["optim/w/exp_avg"]))
    require_optimizer_state(fake_folder([], classes={"0": "AdamW"}))
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        require_optimizer_state(fake_folder(["model/w"]))


def test_state_gaps_name_trained_parameters_only():
    model = torch.nn.Linear(2, 2)
    model.bias.requires_grad_(False)              # frozen: needs no optimizer state
    assert optimizer_state_gaps(model, fake_folder(["optim/weight/exp_avg"])) == []
    gap, = optimizer_state_gaps(model, fake_folder(["optim/bias/exp_avg"]))
    assert gap.startswith("no optimizer state in the checkpoint for 1 of 1 parameters") and "'weight'" in gap


def test_the_outcome_is_the_last_saves():
    checkpointer = object.__new__(TrainingCheckpointer)
    checkpointer.writer = SimpleNamespace(completed=[(2, False), (4, True)])
    assert not checkpointer._last_save_failed()
    checkpointer.writer.completed.append((6, False))
    assert checkpointer._last_save_failed()


def test_a_run_loaded_from_another_folder_saves_in_its_own(ckpt_corpus, ckpt_cache, tmp_path):
    """--load A --save B, resumed at its end: the checkpoint it loaded is not in B, so the end of training
    saves it there (only a checkpoint loaded from --save itself counts as just saved)."""
    first, second = str(tmp_path / "A"), str(tmp_path / "B")
    train(flags(ckpt_corpus, 2, "--save", first, cache=ckpt_cache))
    train(flags(ckpt_corpus, 2, "--load", first, "--save", second, cache=ckpt_cache))
    assert list_complete(second) == [2] and os.path.isdir(os.path.join(first, "iter_0000002"))
