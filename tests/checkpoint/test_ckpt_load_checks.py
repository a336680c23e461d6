"""What a --load accepts: the model config must fit (shape fields always; the rest on a plain resume),
a checkpoint without optimizer state needs --finetune or --no-load-optim, gaps in the optimizer
state are warned about; offline reshards keep the data position and are marked weights-only."""
import json
import os
import shutil

import pytest

from ckpt_harness import convert_tool, flags, train
from megatron_zaya.arguments import parse_args
from megatron_zaya.checkpoint import CheckpointError
from megatron_zaya.checkpoint.format import METADATA_FILE, list_complete, read_latest
from megatron_zaya.checkpoint.preflight import check_model_config




def no_build(*args, **kwargs):
    raise AssertionError("the run got as far as building its runtime and model")


def metadata(folder) -> dict:
    return json.load(open(os.path.join(folder, METADATA_FILE)))


def test_model_config_mismatch_is_refused_before_the_model_is_built(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch):
    src = str(tmp_path / "src")
    train(flags(ckpt_corpus, 1, "--save", src, cache=ckpt_cache))
    monkeypatch.setattr("megatron_zaya.training.setup.build_runtime", no_build)
    with pytest.raises(CheckpointError, match=r"different model config \(rotary_base: 10000\.0 in the checkpoint, "
                                              r"500\.0 in this run\).*--finetune"):
        train(flags(ckpt_corpus, 2, "--load", src, "--rotary-base", "500", cache=ckpt_cache))
    for extra in (["--no-load-optim"], ["--finetune"]):
        with pytest.raises(CheckpointError, match=r"tensor shapes \(num_layers: 2 in the checkpoint, 1 in this run\)"):
            train(flags(ckpt_corpus, 2, "--load", src, "--num-layers", "1", *extra, cache=ckpt_cache))


def test_model_config_changes_allowed_with_finetune_or_a_new_data_phase(ckpt_corpus, ckpt_cache, tmp_path):
    """The recipe's 32K phase raises rotary_base on a resume (no --finetune): a new data phase may
    change non-shape fields, with a warning; seq_length and initial values never matter."""
    src = str(tmp_path / "src")
    train(flags(ckpt_corpus, 1, "--save", src, cache=ckpt_cache))
    meta = metadata(os.path.join(src, "iter_0000001"))

    def run_of(*extra):
        run = parse_args(flags(ckpt_corpus, 2, "--load", src, *extra, cache=ckpt_cache))
        run.model = run.model.replace(vocab_size=meta["model_config"]["vocab_size"])   # as resolve_vocab does
        return run

    assert check_model_config(meta, run_of("--init-method-std", "0.5"), False, src) == []
    with pytest.raises(CheckpointError, match="norm_epsilon"):
        check_model_config(meta, run_of("--norm-epsilon", "1e-3"), False, src)
    [note] = check_model_config(meta, run_of("--rotary-base", "500"), True, src)
    assert "(--finetune): rotary_base: 10000.0 in the checkpoint, 500.0 in this run" in note
    [note] = check_model_config(meta, run_of("--rotary-base", "500", "--seq-length", "64"), False, src)
    assert "(a new data phase starts): rotary_base" in note
    with pytest.raises(CheckpointError, match="rotary_base"):      # another batch size is not a new data phase
        check_model_config(meta, run_of("--rotary-base", "500", "--global-batch-size", "8"), False, src)


def test_reshard_keeps_the_data_position_and_needs_no_load_optim(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch):
    """reshard's output holds weights only: a plain resume is refused (before any build, and again at
    load time for a checkpoint without the weights-only mark); --no-load-optim continues at the
    source's iteration with the source's next batch."""
    src, resharded = str(tmp_path / "src"), str(tmp_path / "resharded")
    train(flags(ckpt_corpus, 2, "--save", src, cache=ckpt_cache))
    assert convert_tool().main(["reshard", src, resharded]) == 0
    meta = metadata(os.path.join(resharded, "iter_0000002"))
    assert meta["weights_only"] and meta["train_state"] == metadata(os.path.join(src, "iter_0000002"))["train_state"]
    assert meta["consumed_samples"] == 8

    with monkeypatch.context() as m:
        m.setattr("megatron_zaya.training.setup.build_runtime", no_build)
        with pytest.raises(CheckpointError, match="holds model weights only.*--finetune.*--no-load-optim"):
            train(flags(ckpt_corpus, 3, "--load", resharded, cache=ckpt_cache))
    del meta["weights_only"]                       # as a conversion written before the mark existed
    json.dump(meta, open(os.path.join(resharded, "iter_0000002", METADATA_FILE), "w"))
    with pytest.raises(CheckpointError, match="holds no optimizer state.*--finetune.*--no-load-optim"):
        train(flags(ckpt_corpus, 3, "--load", resharded, cache=ckpt_cache))

    straight = train(flags(ckpt_corpus, 3, "--load", src, cache=ckpt_cache))
    fresh_optim = train(flags(ckpt_corpus, 3, "--load", resharded, "--no-load-optim", cache=ckpt_cache))
    assert sorted(fresh_optim.losses) == [3] and fresh_optim.tokens[3] == straight.tokens[3]
    assert fresh_optim.trainer.state.consumed_samples == 12


def test_conversion_into_a_folder_with_checkpoints_is_refused(ckpt_corpus, ckpt_cache, tmp_path, capsys):
    src, later = str(tmp_path / "src"), str(tmp_path / "later")
    train(flags(ckpt_corpus, 1, "--save", src, cache=ckpt_cache))
    train(flags(ckpt_corpus, 2, "--save", later, cache=ckpt_cache))
    before = sorted(os.listdir(later))
    assert convert_tool().main(["reshard", src, later, "--iteration", "0"]) == 2
    assert f"{later}: already holds checkpoints (iterations [2])" in capsys.readouterr().err
    assert sorted(os.listdir(later)) == before and read_latest(later) == 2
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    (lonely / "latest_checkpointed_iteration.txt").write_text("5\n")
    assert convert_tool().main(["reshard", src, str(lonely)]) == 2
    assert "already holds latest_checkpointed_iteration.txt" in capsys.readouterr().err


def test_gaps_in_the_optimizer_state_are_warned_about(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch, capsys):
    from megatron_zaya.checkpoint import training as ckpt_training
    save = str(tmp_path / "gaps")
    real_entries = ckpt_training.optimizer_entries

    def without_one(optimizer, model):
        entries, objects = real_entries(optimizer, model)
        return [e for e in entries if not e.key.startswith("optim/final_norm.weight/")], objects
    with monkeypatch.context() as m:
        m.setattr(ckpt_training, "optimizer_entries", without_one)
        m.setattr(ckpt_training, "balancer_entries", lambda balancer, rank: ([], {}))
        train(flags(ckpt_corpus, 1, "--save", save, cache=ckpt_cache))
    capsys.readouterr()
    rec = train(flags(ckpt_corpus, 2, "--load", save, cache=ckpt_cache))
    out = capsys.readouterr().out
    assert rec.trainer.checkpointer.loaded["optimizer"]
    assert "WARNING: no optimizer state in the checkpoint for 1 of" in out and "['final_norm.weight']" in out
    assert "WARNING: no balancing-bias optimizer state in the checkpoint" in out


def test_a_skip_target_given_on_resume_starts_the_balancer_afresh(ckpt_corpus, ckpt_cache, tmp_path, capsys):
    """--moe-router-skip-target balances E + 1 classes, the default E: a resume that adds it (or drops it) loads
    the biases with the weights and starts the balancing Adam's moments afresh, with a warning saying why."""
    skip = ["--moe-router-skip-target", "0.1"]
    for saved_with, loaded_with in (([], skip), (skip, [])):
        save = str(tmp_path / f"skip{len(saved_with)}")
        train(flags(ckpt_corpus, 1, "--save", save, *saved_with, cache=ckpt_cache))
        capsys.readouterr()
        rec = train(flags(ckpt_corpus, 2, "--load", save, *loaded_with, cache=ckpt_cache))
        out = capsys.readouterr().out
        assert rec.trainer.checkpointer.loaded["optimizer"] and not rec.trainer.checkpointer.loaded["balancer"]
        assert "--moe-router-skip-target in one run only" in out and rec.trainer.balancer.steps == 1


def test_a_damaged_latest_file_is_warned_about_and_the_newest_checkpoint_loads(ckpt_corpus, ckpt_cache, tmp_path,
                                                                               capsys):
    save = str(tmp_path / "ckpt")
    train(flags(ckpt_corpus, 2, "--save", save, "--save-interval", "1", cache=ckpt_cache))
    with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("abc\n")
    capsys.readouterr()
    resumed = train(flags(ckpt_corpus, 3, "--save", save, "--load", save, cache=ckpt_cache))
    out = capsys.readouterr().out
    assert "latest_checkpointed_iteration.txt: holds 'abc', not an iteration number" in out, out
    assert sorted(resumed.losses) == [3] and read_latest(save) == 3


def test_no_save_optim_and_no_save_rng_write_weights_and_train_state_only(ckpt_corpus, ckpt_cache, tmp_path, capsys):
    """--no-save-optim --no-save-rng (Megatron-LM): no optim/, balancer/ or rng/ tensors in the checkpoint,
    which is smaller; a plain resume is refused naming --no-load-optim, which then continues at the
    saved iteration with a fresh optimizer and says the RNG was not restored."""
    from megatron_zaya.checkpoint.format import CheckpointFolder
    full, light = str(tmp_path / "full"), str(tmp_path / "light")
    train(flags(ckpt_corpus, 2, "--save", full, cache=ckpt_cache))
    train(flags(ckpt_corpus, 2, "--save", light, "--no-save-optim", "--no-save-rng", cache=ckpt_cache))
    folder = CheckpointFolder(os.path.join(light, "iter_0000002"))
    assert folder.keys("model/") and not folder.keys("optim/") and not folder.keys("balancer/")
    assert not folder.keys("rng/")
    from megatron_zaya.checkpoint import inspect_checkpoint           # what a resume would find, said
    assert inspect_checkpoint(light)["holds"] == {"optimizer": False, "rng": False, "weights_only": False,
                                                  "converted_from": None}
    assert inspect_checkpoint(full)["holds"]["optimizer"] and inspect_checkpoint(full)["holds"]["rng"]

    def size(root):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)
    assert size(light) < size(full) / 2
    with pytest.raises(CheckpointError, match="holds no optimizer state.*--no-load-optim"):
        train(flags(ckpt_corpus, 3, "--load", light, cache=ckpt_cache))
    capsys.readouterr()
    rec = train(flags(ckpt_corpus, 3, "--load", light, "--no-load-optim", cache=ckpt_cache))
    assert sorted(rec.losses) == [3]
    assert "no RNG state in the checkpoint" in capsys.readouterr().out


def test_the_main_rank_says_when_another_rank_has_no_rng_state(ckpt_corpus, ckpt_cache, tmp_path, capsys,
                                                                monkeypatch):
    """A checkpoint of 1 rank loaded by 2: rank 1 has no RNG state, and only the main rank prints, which has
    its own: the ranks agree on it (here the other rank's answer is made "no"), so the note is seen."""
    import megatron_zaya.checkpoint.training as ckpt_training
    save = str(tmp_path / "ckpt")
    train(flags(ckpt_corpus, 2, "--save", save, cache=ckpt_cache))
    capsys.readouterr()
    real_agree, real_load_rng = ckpt_training.TrainingCheckpointer.agree, ckpt_training.load_rng
    asked = []

    def another_rank_without(self, flag):      # the first agreement after the RNG load: the other rank's "no"
        if asked == ["rng"]:
            asked.append(flag)
            return False
        return real_agree(self, flag)
    monkeypatch.setattr(ckpt_training, "load_rng", lambda *a: asked.append("rng") or real_load_rng(*a))
    monkeypatch.setattr(ckpt_training.TrainingCheckpointer, "agree", another_rank_without)
    rec = train(flags(ckpt_corpus, 3, "--load", save, cache=ckpt_cache))
    out = capsys.readouterr().out
    assert asked == ["rng", True] and rec.trainer.checkpointer.loaded["rng"]     # this rank's own was restored
    assert "no RNG state in the checkpoint for every rank of this run (saved with 1 rank(s)" in out
    assert "RNG NOT loaded on every rank" in out
    monkeypatch.undo()
    train(flags(ckpt_corpus, 3, "--load", save, "--no-load-rng", cache=ckpt_cache))     # not asked: not a problem
    out = capsys.readouterr().out
    assert "RNG not loaded" in out and "every rank" not in out


def test_ckpt_step_loads_that_iteration(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch):
    """Megatron-LM's --ckpt-step N: iteration N's checkpoint from --load, not the latest."""
    src = str(tmp_path / "src")
    first = train(flags(ckpt_corpus, 4, "--save", src, "--save-interval", "2", cache=ckpt_cache))
    resumed = train(flags(ckpt_corpus, 3, "--load", src, "--ckpt-step", "2", cache=ckpt_cache))
    assert sorted(resumed.losses) == [3]                 # iteration 2's state: only step 3 left to run
    assert resumed.losses[3] == first.losses[3]          # and the same step 3 as the first run's
    monkeypatch.setattr("megatron_zaya.training.setup.build_runtime", no_build)
    # the same folder as --save: loading iteration 2 would prune or overwrite 4
    # the error names --ckpt-step, which chose the folder, not the iter_ folder the user never typed
    with pytest.raises(CheckpointError) as refused:
        train(flags(ckpt_corpus, 3, "--load", src, "--ckpt-step", "2", "--save", src, cache=ckpt_cache))
    message = str(refused.value)
    assert f"--ckpt-step 2 loads iteration 2 of --load {src}, older than the latest one" in message, message
    assert "(without --finetune or --ckpt-step)" in message and "iter_0000002" not in message, message
    # from another folder, and with --finetune: the same words for what the user gave
    from megatron_zaya.checkpoint.preflight import check_save_folder
    other = str(tmp_path / "other")
    shutil.copytree(src, other)
    picked = f"--ckpt-step 2 loads iteration 2 of --load {src}"
    for finetune, reason in ((False, f"{picked}, another folder"),
                             (True, f"restarts the iteration count at 0 ({picked})")):
        with pytest.raises(CheckpointError) as refused:
            check_save_folder(other, os.path.join(src, "iter_0000002"), finetune, 2)
        assert reason in str(refused.value) and "iter_0000002" not in str(refused.value), refused.value


def test_ckpt_step_errors_name_the_flag(ckpt_corpus, ckpt_cache, tmp_path, capsys):
    """A missing iteration (or none at all) is named with the iterations --load does hold, before
    anything is built."""
    src = str(tmp_path / "src")
    train(flags(ckpt_corpus, 2, "--save", src, "--save-interval", "2", cache=ckpt_cache))
    for extra, expected in (
            (["--load", src, "--ckpt-step", "3"], f"--ckpt-step 3: --load {src} has no complete checkpoint of "
                                                  f"iteration 3 (complete ones: 2)"),
            (["--load", os.path.join(src, "iter_0000002"), "--ckpt-step", "2"], "already one iteration's checkpoint"),
            (["--ckpt-step", "2"], "--ckpt-step 2 needs --load"),
            (["--load", src, "--ckpt-step", "-1"], "--ckpt-step=-1: an iteration, >= 0"),
            (["--load", str(tmp_path / "empty"), "--ckpt-step", "2"], "it holds no complete checkpoint")):
        with pytest.raises(SystemExit):
            parse_args(flags(ckpt_corpus, 3, *extra, cache=ckpt_cache))
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert expected in line, line


def test_exit_on_missing_checkpoint_stops_before_the_model(ckpt_corpus, ckpt_cache, tmp_path, monkeypatch):
    """--exit-on-missing-checkpoint: a --load without a checkpoint (a typo, no save yet) stops the run
    instead of training from scratch, and so does --finetune; without them it trains from scratch, as before."""
    missing = str(tmp_path / "typo")
    monkeypatch.setattr("megatron_zaya.training.setup.build_runtime", no_build)
    with pytest.raises(CheckpointError, match=rf"--exit-on-missing-checkpoint: --load {missing} holds no checkpoint"):
        train(flags(ckpt_corpus, 1, "--load", missing, "--exit-on-missing-checkpoint", cache=ckpt_cache))
    with pytest.raises(CheckpointError, match=rf"--finetune: --load {missing} holds no checkpoint to start from"):
        train(flags(ckpt_corpus, 1, "--load", missing, "--finetune", cache=ckpt_cache))    # its weights are the point
    with pytest.raises(CheckpointError, match=r"Org/Model-x looks like a Hugging Face Hub name, .* then give --load "
                                              r"CKPT --finetune$"):
        train(flags(ckpt_corpus, 1, "--load", "Org/Model-x", "--finetune", cache=ckpt_cache))
    monkeypatch.undo()
    assert sorted(train(flags(ckpt_corpus, 1, "--load", missing, cache=ckpt_cache)).losses) == [1]


def test_a_checkpoint_with_damaged_metadata_is_named_not_called_missing(ckpt_corpus, ckpt_cache, tmp_path,
                                                                       monkeypatch):
    """--finetune / --exit-on-missing-checkpoint / --skip-train and a --load whose only checkpoint has an
    unreadable metadata.json: the error names that file (it said the folder held no checkpoint)."""
    save = str(tmp_path / "ckpt")
    train(flags(ckpt_corpus, 1, "--save", save, cache=ckpt_cache))
    metadata = os.path.join(save, "iter_0000001", METADATA_FILE)
    with open(metadata, "w") as f:
        f.write('{"format_version": 1')
    monkeypatch.setattr("megatron_zaya.training.setup.build_runtime", no_build)
    for extra in ([], ["--finetune"], ["--exit-on-missing-checkpoint"], ["--skip-train", "--eval-iters", "1"]):
        with pytest.raises(CheckpointError, match=rf"--load {save}: no loadable checkpoint; {metadata}: corrupt JSON"):
            train(flags(ckpt_corpus, 1, "--load", save, *extra, cache=ckpt_cache))    # plain --load too: not later
    # as --pretrained-checkpoint (named so), and as --load beside a good --pretrained-checkpoint, which the load
    # would not fall back to (refused before the model too)
    monkeypatch.undo()
    good = str(tmp_path / "good")
    train(flags(ckpt_corpus, 1, "--save", good, cache=ckpt_cache))
    monkeypatch.setattr("megatron_zaya.training.setup.build_runtime", no_build)
    empty = str(tmp_path / "empty")
    with pytest.raises(CheckpointError, match=rf"^--pretrained-checkpoint {save}: no loadable checkpoint; {metadata}"):
        train(flags(ckpt_corpus, 1, "--load", empty, "--pretrained-checkpoint", save, cache=ckpt_cache))
    with pytest.raises(CheckpointError, match=rf"^--load {save}: no loadable checkpoint; {metadata}"):
        train(flags(ckpt_corpus, 1, "--load", save, "--pretrained-checkpoint", good, cache=ckpt_cache))


def test_a_dry_run_finds_a_truncated_checkpoint_and_says_when_load_holds_none(ckpt_corpus, ckpt_cache, tmp_path,
                                                                             capsys):
    """--dry-run looks at the sizes of the files --load would read (a truncated rank file was found only by the
    real run's load, after the model), and says when --load holds no checkpoint (a typo'd path)."""
    from pretrain_zaya import main
    save = str(tmp_path / "ckpt")
    train(flags(ckpt_corpus, 1, "--save", save, cache=ckpt_cache))
    assert main(flags(ckpt_corpus, 2, "--load", save, "--dry-run", cache=ckpt_cache)) == 0
    assert "no checkpoint found" not in capsys.readouterr().out
    shard = os.path.join(save, "iter_0000001", "rank_00000.safetensors")
    size = os.path.getsize(shard)
    os.truncate(shard, 100)
    assert main(flags(ckpt_corpus, 2, "--load", save, "--dry-run", cache=ckpt_cache)) == 2
    assert (f"--load {save}: no loadable checkpoint; {shard}: corrupt (size 100, expected {size})"
            in capsys.readouterr().err)
    typo = str(tmp_path / "ckpt-typo")
    assert main(flags(ckpt_corpus, 2, "--load", typo, "--dry-run", cache=ckpt_cache)) == 0
    assert f"WARNING --load {typo}: no checkpoint found; the run would train from scratch" in capsys.readouterr().out


def test_pretrained_checkpoint_starts_a_fine_tune_until_load_has_one(ckpt_corpus, ckpt_cache, tmp_path, capsys):
    """Megatron-LM's --pretrained-checkpoint: while --load holds no checkpoint the run starts from it as
    --finetune does (its weights, iteration 0); once the run has saved into --load, a restart resumes
    from there instead. Nowhere to start from is an error naming both folders."""
    pretrained, own = str(tmp_path / "pretrained"), str(tmp_path / "own")
    train(flags(ckpt_corpus, 2, "--save", pretrained, cache=ckpt_cache))
    finetuned = train(flags(ckpt_corpus, 2, "--load", pretrained, "--finetune", cache=ckpt_cache))
    capsys.readouterr()
    first = train(flags(ckpt_corpus, 2, "--load", own, "--save", own, "--pretrained-checkpoint", pretrained,
                        cache=ckpt_cache))
    assert first.losses == finetuned.losses                 # the same start as --load PRETRAINED --finetune
    assert train(flags(ckpt_corpus, 2, "--pretrained-checkpoint", pretrained,      # no --load at all
                       cache=ckpt_cache)).losses == finetuned.losses
    assert f"starting from --pretrained-checkpoint {pretrained} as a fine-tune" in capsys.readouterr().out
    resumed = train(flags(ckpt_corpus, 3, "--load", own, "--save", own, "--pretrained-checkpoint", pretrained,
                          cache=ckpt_cache))
    assert sorted(resumed.losses) == [3]                    # resumed from its own iteration 2
    assert "--pretrained-checkpoint" not in capsys.readouterr().out
    with pytest.raises(CheckpointError, match=r"--pretrained-checkpoint .*nowhere: no checkpoint found \(nor in --load"):
        train(flags(ckpt_corpus, 1, "--load", str(tmp_path / "empty"), "--pretrained-checkpoint",
                    str(tmp_path / "nowhere"), cache=ckpt_cache))


def test_skip_train_evaluates_the_loaded_model_and_saves_nothing(ckpt_corpus, ckpt_cache, tmp_path, capsys):
    """Megatron-LM's --skip-train: the loaded model's validation loss, no training step, no save; the
    same loss as that run's own final evaluation. Without a checkpoint it stops, naming the flag."""
    src = str(tmp_path / "src")
    train(flags(ckpt_corpus, 2, "--save", src, "--eval-iters", "2", cache=ckpt_cache))
    trained = capsys.readouterr().out
    save = tmp_path / "unused"
    evaluated = train(flags(ckpt_corpus, 5, "--load", src, "--skip-train", "--eval-iters", "2", "--save", str(save),
                            cache=ckpt_cache))
    out = capsys.readouterr().out
    assert evaluated.losses == {} and not list_complete(str(save))
    final = [line for line in trained.splitlines() if "final validation loss" in line][-1]
    assert final.split("] ", 1)[1] in out, out
    with pytest.raises(CheckpointError, match=r"--skip-train: --load .*empty holds no checkpoint, so no model to evaluate"):
        train(flags(ckpt_corpus, 1, "--load", str(tmp_path / "empty"), "--skip-train", "--eval-iters", "1",
                    cache=ckpt_cache))
    for extra, expected in ((["--eval-iters", "1"], "--skip-train evaluates a trained model: give --load"),
                            (["--load", src, "--eval-iters", "0"], "--skip-train only evaluates: give --eval-iters > 0")):
        with pytest.raises(SystemExit):
            parse_args(flags(ckpt_corpus, 1, "--skip-train", *extra, cache=ckpt_cache))
        assert expected in capsys.readouterr().err


def test_a_vocabulary_that_differs_only_in_its_padding_is_refused_naming_the_flag(tmp_path, monkeypatch):
    """A run pads to a multiple of lcm(--make-vocab-size-divisible-by, TP): a checkpoint of another padding is
    refused saying so, and naming the checkpoint's own multiple as the --make-vocab-size-divisible-by that loads
    it (at TP 1 and 2 with 3, at TP 1 with 6 for a save with 3 at TP 2); a vocabulary of another size gets none."""
    base = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "500", "--preset", "zaya1-tiny",
            "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "1",
            "--data-cache-path", str(tmp_path)]

    def parsed(tp: int, *extra: str):
        monkeypatch.setenv("WORLD_SIZE", str(tp))
        return parse_args(base + ["--tensor-model-parallel-size", str(tp), *extra])

    def refusal(saved_run, saved_tp: int, run) -> str:
        meta = {"model_config": saved_run.model.to_dict(), "layout": {"tensor_model_parallel_size": saved_tp}}
        with pytest.raises(CheckpointError) as caught:
            check_model_config(meta, run, False, "ckpt")
        return str(caught.value)

    by3 = ["--make-vocab-size-divisible-by", "3"]
    saved = parsed(1, *by3)
    old = saved.model.vocab_size
    for run in (parsed(2, *by3), parsed(1, "--make-vocab-size-divisible-by", "2"), parsed(2)):
        assert run.model.vocab_size != old
        assert (f"the checkpoint's {old} is a multiple of 3 (--make-vocab-size-divisible-by=3 at TP 1)" in
                refusal(saved, 1, run)), run.model.vocab_size
        assert refusal(saved, 1, run).endswith("--make-vocab-size-divisible-by=3 with a TP that divides 3 loads it")
    saved_tp2 = parsed(2, *by3)
    message = refusal(saved_tp2, 2, parsed(1, *by3))
    assert "is a multiple of 6 (--make-vocab-size-divisible-by=3 at TP 2)" in message
    assert message.endswith("--make-vocab-size-divisible-by=6 with a TP that divides 6 loads it")
    for tp in (1, 2):          # the advice holds: 6 at a TP dividing 6 gives the checkpoint's size
        assert parsed(tp, "--make-vocab-size-divisible-by", "6").model.vocab_size == saved_tp2.model.vocab_size
    assert refusal(saved, 1, parsed(1, *by3, "--vocab-size", str(old + 3))).endswith("not even with --finetune")
