"""Non-finite steps and empty batches in training: a NaN loss or gradient skips the step (no update, the
schedule not moved, no checkpoint with garbage), several in a row stop the run, and the diagnosis names the
rank(s) and the layer; a global batch without loss tokens is skipped without counting."""
import os
import re

import pytest
import torch

from ckpt_harness import flags, train
from megatron_zaya.checkpoint import load_full_model_state
from megatron_zaya.checkpoint.format import read_latest
from megatron_zaya.training.loop import NonFiniteLossError


def _nan_gradient_at(iterations, name="layers.1.moe.router.fc1.weight"):
    """A patch of Trainer.train_step that makes one parameter's gradient NaN in the given iterations."""
    from megatron_zaya.training import loop
    original = loop.Trainer.train_step

    def train_step(trainer, micro_batches):
        handle = None
        if trainer.state.iteration + 1 in iterations:
            param = dict(trainer.model.named_parameters())[name]
            handle = param.register_hook(lambda g: g * float("nan"))
        try:
            return original(trainer, micro_batches)
        finally:
            if handle is not None:
                handle.remove()
    return train_step


def test_nan_step_is_skipped_and_repeated_nans_stop(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch, capsys):
    from megatron_zaya.training import loop
    save = str(tmp_path / "nan")
    monkeypatch.setattr(loop.Trainer, "train_step", _nan_gradient_at({3}))
    rec = train(flags(ckpt_corpus, 4, "--save", save, "--save-interval", "1", cache=ckpt_cache))
    assert rec.trainer.state.skipped_iterations == 1 and rec.trainer.state.iteration == 4
    out = capsys.readouterr().out
    assert "SKIPPED (non-finite)" in out            # (a NaN gradient, the loss finite: not a nan iteration)
    assert "iteration        3/       4 | " in out
    assert "| number of skipped iterations:   1 | number of nan iterations:   0 |" in out
    # The skipped step did not move the LR schedule (Megatron-LM's scheduler steps on successful
    # updates only): step 4 ran at the lr of position 2, and 3 steps' samples are scheduled.
    assert rec.trainer.state.scheduled_samples == 3 * 4
    assert rec.trainer.last_lr == rec.trainer.lr_schedule(2) != rec.trainer.lr_schedule(3)
    w2, w3 = (load_full_model_state(os.path.join(save, f"iter_000000{i}"))[0] for i in (2, 3))
    assert all(torch.equal(w2[k], w3[k]) for k in w2)              # the NaN step changed nothing
    for i in range(1, 5):
        assert all(torch.isfinite(t).all() for t in load_full_model_state(os.path.join(save, f"iter_000000{i}"))[0].values())

    monkeypatch.setattr(loop.Trainer, "train_step", _nan_gradient_at({2, 3, 4, 5}))
    save2 = str(tmp_path / "nan2")
    with pytest.raises(NonFiniteLossError, match=r"2 consecutive .* at iteration 3 \(--max-consecutive-nonfinite 2\): "
                                                 r".*rank 0.*layers\.1\.moe\.router\.fc1\.weight"):
        train(flags(ckpt_corpus, 6, "--save", save2, "--save-interval", "1", "--max-consecutive-nonfinite", "2",
                    cache=ckpt_cache))
    assert read_latest(save2) == 2          # checkpoints hold no garbage: the skipped steps changed nothing
    for i in (1, 2):
        state = load_full_model_state(os.path.join(save2, f"iter_000000{i}"))[0]
        assert all(torch.isfinite(t).all() for t in state.values())


def test_a_run_resumed_in_a_streak_of_nonfinite_steps_stops_where_the_uninterrupted_one_does(
        ckpt_corpus, ckpt_cache, tmp_path, monkeypatch):
    """Steps 2 on are NaN: the first job ends after step 3 (2 skipped in a row) with a checkpoint; the resume
    stops at step 4, the third in a row, as one uninterrupted job does (the count was not saved: it ran to 6)."""
    from megatron_zaya.training import loop
    monkeypatch.setattr(loop.Trainer, "train_step", _nan_gradient_at({2, 3, 4, 5, 6}))
    save = str(tmp_path / "streak")
    rec = train(flags(ckpt_corpus, 8, "--save", save, "--exit-interval", "3", cache=ckpt_cache))
    assert rec.trainer.state.iteration == 3 and rec.trainer.state.consecutive_nonfinite == 2
    assert read_latest(save) == 3
    with pytest.raises(NonFiniteLossError,
                       match=r"^3 consecutive steps .* at iteration 4 \(--max-consecutive-nonfinite 3\):"):
        train(flags(ckpt_corpus, 8, "--save", save, "--load", save, cache=ckpt_cache))


def test_a_global_batch_without_loss_tokens_is_not_applied(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch, capsys):
    """Every loss mask of step 2 is 0: Megatron-LM's 0/0 is a NaN loss and no update. It logged a loss of 0.0
    and stepped the optimizer, the schedule and the balancing biases on zero gradients. Skipped, not counted
    towards the consecutive non-finite stop (steps 2, 3 and 4 all empty: still no stop)."""
    from megatron_zaya.training import loop
    original = loop.Trainer.train_step

    def train_step(trainer, micro_batches):
        if trainer.state.iteration + 1 in (2, 3, 4):
            micro_batches = [{**mb, "loss_mask": mb["loss_mask"] * 0} for mb in micro_batches]
        return original(trainer, micro_batches)

    monkeypatch.setattr(loop.Trainer, "train_step", train_step)
    save = str(tmp_path / "empty")
    rec = train(flags(ckpt_corpus, 5, "--save", save, "--save-interval", "1", cache=ckpt_cache))
    assert rec.trainer.state.skipped_iterations == 3 and rec.trainer.state.iteration == 5
    assert rec.trainer.state.scheduled_samples == 2 * 4                # only steps 1 and 5 moved the schedule
    out = capsys.readouterr().out
    assert "SKIPPED: no loss tokens in the global batch" in out
    assert "iteration        2/       5 | " in out
    assert "| number of skipped iterations:   1 | number of nan iterations:   1 |" in out
    w1, w4 = (load_full_model_state(os.path.join(save, f"iter_000000{i}"))[0] for i in (1, 4))
    assert all(torch.equal(w1[k], w4[k]) for k in w1)                  # (balancing biases included)


def test_nan_in_the_forward_of_one_rank_is_traced_to_its_rank_and_layer(ckpt_corpus, ckpt_cache, tmp_path):
    """2 ranks under torchrun; rank 1's layers.1 outputs NaN: after the reduction every rank's gradients
    are NaN, yet the stop names rank 1 and layers.1 (and not rank 0)."""
    import subprocess
    import sys
    from ckpt_harness import RUNNER, ROOT, subprocess_env
    from tests.parallel.parallel_launcher import free_port
    env = dict(subprocess_env(), CKPT_TEST_NAN_FORWARD="1:1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), RUNNER, *flags(ckpt_corpus, 6, cache=ckpt_cache)]
    result = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert result.returncode != 0
    stops = re.findall(r"^\[rank(\d)\]: megatron_zaya\.training\.loop\.NonFiniteLossError: (.*)$", result.stderr, re.M)
    assert sorted(rank for rank, _ in stops) == ["0", "1"], result.stderr[-4000:]   # both ranks stop,
    stops = [text for _, text in stops]
    assert stops[0] == stops[1]                                                       # with the same diagnosis
    assert "3 consecutive steps" in stops[0] and "non-finite produced on rank(s) [1]: " in stops[0], stops[0]
    assert stops[0].endswith("rank 1: loss non-finite, first non-finite output: layers.1"), stops[0]
    assert "rank 0:" not in stops[0]
    assert "SKIPPED (non-finite) non-finite produced on rank(s) [1]" in result.stdout


def test_nan_loss_with_finite_blocks_is_blamed_on_the_head_or_loss(ckpt_corpus, ckpt_cache, monkeypatch):
    import dataclasses
    from megatron_zaya.model.zaya import ZayaModel
    original = ZayaModel.forward

    def forward(model, *args, **kwargs):
        out = original(model, *args, **kwargs)
        return dataclasses.replace(out, token_losses=out.token_losses * float("nan"))

    monkeypatch.setattr(ZayaModel, "forward", forward)
    with pytest.raises(NonFiniteLossError, match=r"rank\(s\) \[0\]: rank 0: loss non-finite, every block's output "
                                                r"finite \(the head or the loss\)"):
        train(flags(ckpt_corpus, 6, cache=ckpt_cache))


def test_nan_in_an_earlier_micro_batch_is_traced_to_its_layer(ckpt_corpus, ckpt_cache, monkeypatch, capsys):
    """Two micro-batches a step; layers.1 gives NaN on the first micro-batch of step 1 only (keyed by its
    tokens, so the re-run sees it too). The diagnosis re-runs that micro-batch, not the last (whose re-run
    was finite: it blamed "the head or the loss")."""
    from megatron_zaya.model.zaya import ZayaModel
    original, poisoned = ZayaModel.forward, {}

    def forward(model, tokens, *args, **kwargs):
        if model.training and "tokens" not in poisoned:
            poisoned["tokens"] = tokens.clone()
        hook = None
        if poisoned["tokens"].shape == tokens.shape and torch.equal(poisoned["tokens"], tokens):
            # (on its input: the diagnosis's own output hooks, registered first, see the NaN it makes)
            hook = model.layers[1].register_forward_pre_hook(lambda m, args: (args[0] * float("nan"), *args[1:]))
        try:
            return original(model, tokens, *args, **kwargs)
        finally:
            if hook is not None:
                hook.remove()

    monkeypatch.setattr(ZayaModel, "forward", forward)
    rec = train(flags(ckpt_corpus, 3, cache=ckpt_cache))
    assert rec.trainer.state.skipped_iterations == 1
    out = capsys.readouterr().out
    assert "SKIPPED (non-finite) non-finite produced on rank(s) [0]: rank 0: loss non-finite, first non-finite " \
           "output: layers.1" in out, out
