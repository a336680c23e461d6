"""Exact resume, async saves, keep-N, and --no-load-optim / --no-load-rng / --finetune."""
import json
import os

import pytest
import torch

import megatron_zaya.training.setup as setup
from ckpt_harness import flags, train
from megatron_zaya.checkpoint import inspect_checkpoint
from megatron_zaya.checkpoint.format import CheckpointError, CheckpointFolder, list_complete, read_latest
from megatron_zaya.model import ZayaModel
from megatron_zaya.checkpoint.save_lock import LOCK_FILE


def folder_tensors(path):
    folder = CheckpointFolder(path)
    return {k: folder.full(k) for k in folder.index if not k.startswith("rng/")}


def assert_same_tensors(a, b):
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_exact_resume_bit_identical_sync_and_async(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch):
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    full = train(flags(ckpt_corpus, 6, "--save", straight, "--save-interval", "3", cache=ckpt_cache))
    first = train(flags(ckpt_corpus, 6, "--save", split, "--save-interval", "3", "--exit-interval", "3",
                        "--async-save", cache=ckpt_cache))
    assert sorted(first.losses) == [1, 2, 3]
    initialised_on = []        # a restart allocates the weights it loads, without initialising them first
    real_reset = ZayaModel.reset_parameters
    monkeypatch.setattr(ZayaModel, "reset_parameters",
                        lambda self: initialised_on.append(self.embedding.weight.device.type) or real_reset(self))
    second = train(flags(ckpt_corpus, 6, "--save", split, "--load", split, "--save-interval", "3", "--async-save",
                         cache=ckpt_cache))
    assert sorted(second.losses) == [4, 5, 6] and set(initialised_on) == {"meta"}
    assert second.trainer.checkpointer.loaded["iteration"] == 3
    resumed = {**first.losses, **second.losses}
    assert [full.losses[i] for i in range(1, 7)] == [resumed[i] for i in range(1, 7)]     # bit-identical fp32
    assert [full.tokens[i] for i in range(1, 7)] == [{**first.tokens, **second.tokens}[i] for i in range(1, 7)]
    # The async save of iteration 3 holds exactly what the synchronous one does, and the final
    # weights, optimizer and balancing state agree to the bit.
    for it in (3, 6):
        assert_same_tensors(folder_tensors(os.path.join(straight, f"iter_{it:07d}")),
                            folder_tensors(os.path.join(split, f"iter_{it:07d}")))
        # and the random state, which the resumed job's data loaders must not have drawn from
        straight_rng, split_rng = (CheckpointFolder(os.path.join(run, f"iter_{it:07d}")).ranks[0]
                                   for run in (straight, split))
        assert torch.equal(straight_rng.get("rng/torch_cpu"), split_rng.get("rng/torch_cpu")), it
        assert straight_rng.meta["objects"]["rng"] == split_rng.meta["objects"]["rng"], it
    assert read_latest(split) == 6 and list_complete(split) == [3, 6]
    assert not [n for n in os.listdir(split) if "partial" in n]
    report = inspect_checkpoint(split)
    assert report["ok"] and report["iteration"] == 6 and report["tokens_seen"] == 6 * 4 * 32
    meta = json.load(open(os.path.join(split, "iter_0000006", "metadata.json")))
    assert meta["train_state"]["consumed_samples"] == 24
    assert any(k.startswith("optim/") and k.endswith("/exp_avg") for k in folder_tensors(os.path.join(split, "iter_0000006")))
    assert any(k.endswith("/momentum_buffer") for k in folder_tensors(os.path.join(split, "iter_0000006")))


def test_keep_last_n_and_latest(ckpt_corpus, ckpt_cache, tmp_path):
    save = str(tmp_path / "keep")
    rec = train(flags(ckpt_corpus, 5, "--save", save, "--save-interval", "1", "--ckpt-keep", "2", cache=ckpt_cache))
    assert list_complete(save) == [4, 5] and read_latest(save) == 5
    assert sorted(os.listdir(save)) == [LOCK_FILE, "iter_0000004", "iter_0000005",
                                         "latest_checkpointed_iteration.txt"]
    assert [e["iteration"] for e in rec.trainer.checkpointer.save_log] == [1, 2, 3, 4, 5]
    # the model's parameters, as model_stats counts them (not the routers' balancing-bias buffers too)
    assert inspect_checkpoint(save)["parameters"] == sum(p.numel() for p in rec.trainer.model.parameters())


def test_save_retain_interval_keeps_its_multiples_and_the_newest(ckpt_corpus, ckpt_cache, tmp_path):
    """Megatron-LM's --save-retain-interval 4 with --save-interval 2 over 7 iterations (a final save
    at 7): 2 and 6 go once a newer checkpoint is complete; with --ckpt-keep 2 too, 6 stays (newest
    two); checkpoints older than a resumed run's start are never removed by it."""
    save = str(tmp_path / "retain")
    train(flags(ckpt_corpus, 7, "--save", save, "--save-interval", "2", "--save-retain-interval", "4",
                cache=ckpt_cache))
    assert list_complete(save) == [4, 7] and read_latest(save) == 7
    both = str(tmp_path / "both")
    train(flags(ckpt_corpus, 7, "--save", both, "--save-interval", "2", "--save-retain-interval", "4",
                "--ckpt-keep", "2", cache=ckpt_cache))
    assert list_complete(both) == [4, 6, 7]
    # a run resumed at 7 into a folder saved without the flag: checkpoints from before its start
    # (2 and 6) stay; 7, where it started, goes once 8 is complete, and 10 once 11 is
    mixed = str(tmp_path / "mixed")
    train(flags(ckpt_corpus, 7, "--save", mixed, "--save-interval", "2", cache=ckpt_cache))
    assert list_complete(mixed) == [2, 4, 6, 7]
    train(flags(ckpt_corpus, 11, "--save", mixed, "--load", mixed, "--save-interval", "2",
                "--save-retain-interval", "4", cache=ckpt_cache))
    assert list_complete(mixed) == [2, 4, 6, 8, 11]


def test_no_load_optim_no_load_rng_finetune(ckpt_corpus, ckpt_cache, tmp_path):
    save = str(tmp_path / "base")
    base = train(flags(ckpt_corpus, 5, "--save", save, "--save-interval", "3", cache=ckpt_cache))
    src = os.path.join(save, "iter_0000003")

    exact = train(flags(ckpt_corpus, 5, "--load", src, cache=ckpt_cache))
    assert exact.losses == {4: base.losses[4], 5: base.losses[5]}
    assert exact.trainer.checkpointer.loaded["optimizer"] and exact.trainer.checkpointer.loaded["rng"]

    no_optim = train(flags(ckpt_corpus, 5, "--load", src, "--no-load-optim", cache=ckpt_cache))
    assert sorted(no_optim.losses) == [4, 5]                 # iteration and data position restored
    assert no_optim.losses[4] == base.losses[4]               # same weights, same batch
    assert no_optim.losses[5] != base.losses[5]               # fresh Adam/Muon state: a different update
    assert not no_optim.trainer.checkpointer.loaded["optimizer"]

    no_rng = train(flags(ckpt_corpus, 5, "--load", src, "--no-load-rng", cache=ckpt_cache))
    assert not no_rng.trainer.checkpointer.loaded["rng"] and no_rng.trainer.checkpointer.loaded["optimizer"]
    assert no_rng.losses[4] == base.losses[4]

    fine = train(flags(ckpt_corpus, 2, "--load", src, "--finetune", "--save", str(tmp_path / "ft"), cache=ckpt_cache))
    assert sorted(fine.losses) == [1, 2]                      # iteration and samples reset
    assert fine.tokens[1] == base.tokens[1]                   # data from the start again
    assert fine.losses[1] != base.losses[1]                   # but with the loaded weights
    loaded = fine.trainer.checkpointer.loaded
    assert not loaded["optimizer"] and not loaded["rng"]
    assert read_latest(str(tmp_path / "ft")) == 2


def test_load_of_empty_dir_starts_from_scratch(ckpt_corpus, ckpt_cache, tmp_path):
    save = str(tmp_path / "fresh")
    rec = train(flags(ckpt_corpus, 2, "--save", save, "--load", save, cache=ckpt_cache))
    assert sorted(rec.losses) == [1, 2] and read_latest(save) == 2
    again = train(flags(ckpt_corpus, 3, "--save", save, "--load", save, cache=ckpt_cache))
    assert sorted(again.losses) == [3]


def test_a_checkpoint_gone_after_the_checks_stops_the_run(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch):
    """The model of a run that will load weights is not initialised: if the checkpoint the checks found
    has gone by the time of the load, the run stops instead of training uninitialised weights; and it leaves
    the caller's SIGINT/SIGTERM handlers as it found them (its own stayed installed: a later Ctrl-C in the
    calling process only set a flag)."""
    import signal
    monkeypatch.setattr(setup, "check_before_build", lambda run, found=None: True)     # as if --load held one, then
    save = str(tmp_path / "gone")
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(CheckpointError, match="the checkpoint found before the model was built is gone"):
        train(flags(ckpt_corpus, 2, "--save", save, "--load", save, cache=ckpt_cache))
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_train_state_of_a_checkpoint_saved_before_tokens_were_counted():
    from megatron_zaya.checkpoint.training import restore_train_state
    from megatron_zaya.training.loop import TrainState

    old = {"train_state": {"iteration": 6, "consumed_samples": 24, "consumed_valid_samples": 0,
                           "skipped_iterations": 1}, "model_config": {"seq_length": 32}}
    state = restore_train_state(TrainState, old)
    assert (state.iteration, state.consumed_samples, state.skipped_iterations) == (6, 24, 1)
    assert state.consumed_tokens == 24 * 32 and state.data_signature == ""
    assert state.scheduled_samples == 24 and state.scheduled_iterations == 6   # saved before skips were left out
    new = {"train_state": {**old["train_state"], "consumed_tokens": 1000}, "model_config": {"seq_length": 32}}
    assert restore_train_state(TrainState, new).consumed_tokens == 1000   # counted per step: kept as saved


def samples_of(recorder) -> list[tuple]:
    """Every sample a run trained on, in order (one process: micro-batches in sequence)."""
    return [tuple(s) for it in sorted(recorder.tokens) for mb in recorder.tokens[it] for s in mb]


def test_a_new_global_batch_size_keeps_reading_where_the_run_stopped(ckpt_corpus, ckpt_cache, tmp_path, capsys):
    """Only --global-batch-size changes on resume: no new data phase, and the next samples are exactly
    those a run at the old batch size would have read next (nothing trained on twice, nothing skipped)."""
    straight = samples_of(train(flags(ckpt_corpus, 7, cache=ckpt_cache)))            # 7 x 4 = 28 samples
    save = str(tmp_path / "ckpt")
    first = samples_of(train(flags(ckpt_corpus, 3, "--save", save, cache=ckpt_cache)))            # 12 samples
    capsys.readouterr()
    second = samples_of(train(flags(ckpt_corpus, 5, "--save", save, "--load", save, "--global-batch-size", "8",
                                    cache=ckpt_cache)))                                             # 2 x 8 more
    out = capsys.readouterr().out
    assert "new data phase" not in out
    assert "data: 896 training tokens" in out           # 28 samples of 32: 12 before and 16 to come, not 5 x 8
    assert first == straight[:12] and second == straight[12:28]
    state = json.loads(open(os.path.join(save, "iter_0000005", "metadata.json")).read())["train_state"]
    assert (state["consumed_samples"], state["data_start_iteration"], state["data_start_samples"]) == (28, 0, 0)
    # The LR schedule continues at iteration 5 (3 steps of 4, then 2 of 8), not at 28 samples / 8 = 3.5:
    # ZAYA1's 32K phase halves the sequences per step and keeps the schedule of the run.
    assert state["scheduled_iterations"] == 5 and state["scheduled_samples"] == 28


def test_train_samples_end_the_run_whatever_the_global_batch_size_of_its_resume(ckpt_corpus, ckpt_cache, tmp_path):
    """--train-samples 28: 3 steps of 4, then a resume at --global-batch-size 8 runs 2 steps (iteration 5, 28
    samples: it ran to iteration 3 and 40 samples, counting 28 / 8 from sample 0); the other way, 1 step of 8, then
    5 of 4 (iteration 6, not 7 and 32 samples)."""
    def samples_flags(*extra):
        argv = flags(ckpt_corpus, 1, *extra, cache=ckpt_cache)
        at = argv.index("--train-iters")
        return argv[:at] + ["--train-samples", "28"] + argv[at + 2:]

    def consumed(save, iteration):
        path = os.path.join(save, f"iter_{iteration:07d}", "metadata.json")
        return json.loads(open(path).read())["train_state"]["consumed_samples"]

    straight = samples_of(train(samples_flags()))
    up, down = str(tmp_path / "up"), str(tmp_path / "down")
    first = samples_of(train(samples_flags("--save", up, "--exit-interval", "3")))
    second = train(samples_flags("--save", up, "--load", up, "--global-batch-size", "8"))
    assert sorted(second.losses) == [4, 5] and read_latest(up) == 5 and consumed(up, 5) == 28
    assert first + samples_of(second) == straight
    train(samples_flags("--save", down, "--exit-interval", "1", "--global-batch-size", "8"))
    resumed = train(samples_flags("--save", down, "--load", down))
    assert sorted(resumed.losses) == [2, 3, 4, 5, 6] and consumed(down, 6) == 28


def test_a_signature_saved_with_the_global_batch_size_is_the_same_data():
    """Checkpoints written before the global batch size left the data signature keep their phase."""
    from megatron_zaya.training.data_phase import data_changed, enter_data_phase
    from megatron_zaya.training.loop import TrainState
    old = json.dumps({"data_path": ["a"], "phases": [], "split": "1", "seq_length": 32, "global_batch_size": 4})
    new = json.dumps({"data_path": ["a"], "phases": [], "split": "1", "seq_length": 32})
    assert not data_changed(old, new)
    assert data_changed(old, new.replace("32", "64"))
    state = TrainState(iteration=3, consumed_samples=12, data_signature=old)
    assert enter_data_phase(state, new) is None and state.data_start_iteration == 0


def capture_loaded_state(monkeypatch) -> dict:
    """Trainer.train replaced by a capture of the loaded weights and fp32 masters (name -> (flat range, master))."""
    from megatron_zaya.checkpoint.state import optimizer_slots
    seen = {}

    def capture(trainer):
        seen["weights"] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        seen["masters"] = {}
        for slot in optimizer_slots(trainer.optimizer, trainer.model):
            for name, p, flat, master, _ in slot.items:
                kept = master if master is not None else slot.container.state.get(p, {}).get("master")
                if kept is not None:
                    seen["masters"][name] = (flat, kept.detach().clone())
        return trainer.state
    monkeypatch.setattr(setup.Trainer, "train", capture)
    return seen


def test_bf16_zero1_masters_of_a_checkpoint_with_fp32_weights_are_those_weights(ckpt_corpus, ckpt_cache, tmp_path,
                                                                                 monkeypatch):
    """A checkpoint of fp32 weights (a --bf16 run without ZeRO-1 keeps them fp32) resumed with --bf16
    --use-distributed-optimizer: the masters (ZeRO-1 AdamW pieces and distributed Muon's) are the saved fp32
    values, with the optimizer loaded or started afresh, not this run's bf16 rounding of them."""
    from megatron_zaya.checkpoint.inspection import load_full_model_state
    save = str(tmp_path / "bf16")
    train(flags(ckpt_corpus, 2, "--save", save, "--bf16", cache=ckpt_cache))
    trained, _, _ = load_full_model_state(os.path.join(save, "iter_0000002"))
    assert all(t.dtype == torch.float32 for t in trained.values())
    seen = capture_loaded_state(monkeypatch)
    for fresh in ((), ("--no-load-optim",)):
        train(flags(ckpt_corpus, 4, "--load", save, "--bf16", "--use-distributed-optimizer", *fresh, cache=ckpt_cache))
        bf16 = [name for name, w in seen["weights"].items() if w.dtype == torch.bfloat16]
        assert bf16 and set(bf16) <= set(seen["masters"]), fresh
        for name in bf16:
            flat, kept = seen["masters"][name]
            want = trained[name].reshape(-1)
            assert torch.equal(kept.reshape(-1), want if flat is None else want[flat[0]:flat[1]]), (fresh, name)


def test_a_fresh_optimizer_starts_from_the_saved_fp32_masters(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch):
    """A --bf16 ZeRO-1 checkpoint keeps fp32 masters of its bf16 weights. --no-load-optim / --finetune start
    from them as a full load does: an fp32 run takes them as its weights (--no-load-optim's first loss equals
    the full load's), and a bf16 ZeRO-1 run as its masters (both were the bf16 weights, made fp32 again)."""
    from megatron_zaya.checkpoint.inspection import load_full_model_state

    save = str(tmp_path / "zero1")
    zero1 = ("--use-distributed-optimizer", "--bf16")
    train(flags(ckpt_corpus, 3, "--save", save, "--save-interval", "3", *zero1, cache=ckpt_cache))
    src = os.path.join(save, "iter_0000003")
    full = train(flags(ckpt_corpus, 4, "--load", src, cache=ckpt_cache))
    assert train(flags(ckpt_corpus, 4, "--load", src, "--no-load-optim", cache=ckpt_cache)).losses[4] == full.losses[4]
    trained, _, info = load_full_model_state(src)          # the masters where saved
    assert info["masters"] > 10
    seen = capture_loaded_state(monkeypatch)
    for fresh in ("--no-load-optim", "--finetune"):
        train(flags(ckpt_corpus, 4, "--load", src, fresh, cache=ckpt_cache))
        assert all(torch.equal(w, trained[n]) for n, w in seen["weights"].items()), fresh
    train(flags(ckpt_corpus, 4, "--load", src, "--no-load-optim", *zero1, cache=ckpt_cache))
    assert len(seen["masters"]) >= info["masters"]      # (and the pieces of weights kept in fp32)
    for name, (flat, kept) in seen["masters"].items():
        want = trained[name].reshape(-1)
        assert torch.equal(kept.reshape(-1), want if flat is None else want[flat[0]:flat[1]]), name


def test_metadata_names_the_saved_position(ckpt_corpus, ckpt_cache, tmp_path):
    """metadata.json's top-level fields, read by tools outside the trainer (docs/CHECKPOINTING.md: iteration,
    consumed samples, tokens seen): those of the train state it holds. Reference: 2 iterations of the global
    batch of 4 samples of 32 tokens (exact), and the run id of 10 hex digits the save folder was named by."""
    import re
    save = str(tmp_path / "meta")
    train(flags(ckpt_corpus, 2, "--save", save, cache=ckpt_cache))
    meta = json.load(open(os.path.join(save, "iter_0000002", "metadata.json")))
    assert meta["iteration"] == meta["train_state"]["iteration"] == 2
    assert meta["consumed_samples"] == meta["train_state"]["consumed_samples"] == 2 * 4
    assert meta["tokens_seen"] == meta["train_state"]["consumed_tokens"] == 2 * 4 * 32
    assert re.fullmatch(r"[0-9a-f]{10}", meta["run_id"]) and meta["layout"]["data_parallel_size"] == 1
