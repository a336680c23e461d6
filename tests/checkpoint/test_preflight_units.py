"""checkpoint/preflight.py on hand-made folders: which train config a --pretrained-checkpoint start follows,
and the data-phase test of a checkpoint that stored no data signature."""
import json
import os
from types import SimpleNamespace

import pytest

from megatron_zaya.checkpoint.format import COMPLETE_MARKER, CheckpointError, METADATA_FILE, iter_dir_name, write_latest
from megatron_zaya.checkpoint.preflight import check_before_build, starts_new_data_phase
from megatron_zaya.config import model_config_from_preset
from megatron_zaya.training.config import TrainConfig


def fake_checkpoint(save_dir, iteration: int, meta: dict) -> str:
    """A folder that preflight reads as a complete checkpoint (only its metadata.json is read)."""
    folder = os.path.join(save_dir, iter_dir_name(iteration))
    os.makedirs(folder)
    with open(os.path.join(folder, METADATA_FILE), "w") as f:
        json.dump(meta, f)
    open(os.path.join(folder, COMPLETE_MARKER), "w").close()
    write_latest(str(save_dir), iteration)
    return folder


def run_of(**train):
    return SimpleNamespace(train=TrainConfig(**train), model=model_config_from_preset("zaya1-tiny"), data=None)


def test_a_weights_only_pretrained_checkpoint_starts_as_a_fine_tune(tmp_path):
    """--pretrained-checkpoint (read while --load holds none) is loaded as --finetune: a weights-only
    checkpoint (a from-hf conversion) is accepted there, as it is refused for a plain --load."""
    base = tmp_path / "base"
    fake_checkpoint(base, 0, {"weights_only": True, "converted_from": "hf", "model_config": {}})
    own = str(tmp_path / "own")           # empty: the run starts from the pretrained checkpoint
    assert check_before_build(run_of(load=own, save=own, pretrained_checkpoint=str(base))) is True
    with pytest.raises(CheckpointError, match="holds model weights only"):
        check_before_build(run_of(load=str(base)))


def test_a_pretrained_checkpoints_other_settings_are_allowed_as_a_fine_tune(tmp_path):
    base = tmp_path / "base"
    config = model_config_from_preset("zaya1-tiny").to_dict()
    fake_checkpoint(base, 3, {"model_config": {**config, "rotary_base": config["rotary_base"] * 2}})
    own = str(tmp_path / "own")
    assert check_before_build(run_of(load=own, save=own, pretrained_checkpoint=str(base))) is True
    with pytest.raises(CheckpointError, match="resuming with a different model config"):
        check_before_build(run_of(load=str(base)))


def test_without_data_signatures_a_new_sequence_length_starts_a_new_phase():
    """A checkpoint without a data signature (or a run without a data pipeline): the sequence length alone
    tells whether a new data phase starts."""
    run = run_of()
    assert run.model.seq_length == 256
    assert not starts_new_data_phase({"model_config": {"seq_length": 256}}, run)
    assert starts_new_data_phase({"model_config": {"seq_length": 512}}, run)
    assert starts_new_data_phase({"train_state": {"data_signature": ""}, "model_config": {"seq_length": 128}}, run)


def test_load_names_a_megatron_lm_checkpoint_in_its_highest_iteration(tmp_path):
    """Without a tracker file --load reads its highest iter_ folder: a Megatron-LM checkpoint there is named,
    even when an older folder holds one of ours."""
    from megatron_zaya.checkpoint.preflight import check_load_path, latest_iteration_folder
    from megatron_zaya.errors import UserInputError

    ours = tmp_path / iter_dir_name(1)
    ours.mkdir()
    (ours / COMPLETE_MARKER).write_text("")
    (tmp_path / iter_dir_name(20) / "mp_rank_00").mkdir(parents=True)
    assert latest_iteration_folder(str(tmp_path)) == str(tmp_path / iter_dir_name(20))
    with pytest.raises(UserInputError, match="is not a megatron-zaya checkpoint .*mp_rank_00"):
        check_load_path(str(tmp_path))


def test_a_stray_pt_file_in_one_of_our_checkpoints_is_not_megatron_lm(tmp_path):
    from megatron_zaya.checkpoint.preflight import check_load_path

    folder = tmp_path / iter_dir_name(5)
    folder.mkdir()
    for name in (COMPLETE_MARKER, "rank_00000.safetensors", "notes.pt"):
        (folder / name).write_text("")
    check_load_path(str(tmp_path))                     # ours: accepted
    (folder / COMPLETE_MARKER).unlink()
    check_load_path(str(tmp_path))                     # an incomplete one of ours (rank files): still ours
    (folder / "rank_00000.safetensors").unlink()
    with pytest.raises(Exception, match="not a megatron-zaya checkpoint .*notes.pt"):
        check_load_path(str(tmp_path))


def checkpoint_args(**given):
    args = dict(preset=None, load=None, pretrained_checkpoint=None, vocab_size=None)
    return SimpleNamespace(**{**args, **given})


def test_use_checkpoint_args_reads_load_first_then_the_pretrained_checkpoint(tmp_path):
    from megatron_zaya.checkpoint.preflight import checkpoint_args_source, model_config_from_checkpoint

    config = model_config_from_preset("zaya1-tiny").to_dict()
    own = fake_checkpoint(tmp_path / "own", 7, {"model_config": {**config, "vocab_size": 640}})
    base = fake_checkpoint(tmp_path / "base", 2, {"model_config": {**config, "vocab_size": 768}})
    both = checkpoint_args(load=str(tmp_path / "own"), pretrained_checkpoint=str(tmp_path / "base"))
    assert checkpoint_args_source(both)[0] == own
    only_base = checkpoint_args(load=str(tmp_path / "empty"), pretrained_checkpoint=str(tmp_path / "base"))
    source = checkpoint_args_source(only_base)
    assert source[0] == base
    # the checkpoint's vocabulary counts as given (the tokenizer's padded size does not replace it) ...
    assert model_config_from_checkpoint(only_base, source).vocab_size == 768 and only_base.vocab_size == 768
    # ... unless --vocab-size is given
    given = checkpoint_args(vocab_size=1024)
    assert model_config_from_checkpoint(given, source).vocab_size == 768 and given.vocab_size == 1024


@pytest.mark.parametrize("layout, expected", [({"tensor_model_parallel_size": 1}, 1),
                                              ({"tensor_model_parallel_size": 4}, 4)])
def test_tensor_parallel_size_from_the_checkpoint(layout, expected):
    from megatron_zaya.checkpoint.preflight import tensor_parallel_from_checkpoint

    assert tensor_parallel_from_checkpoint(("ckpt", {"layout": layout})) == expected


@pytest.mark.parametrize("meta", [{}, {"layout": {"tensor_model_parallel_size": 0}},
                                  {"layout": {"tensor_model_parallel_size": "2"}}])
def test_tensor_parallel_size_missing_from_the_checkpoint_is_named(meta):
    from megatron_zaya.checkpoint.preflight import tensor_parallel_from_checkpoint
    from megatron_zaya.errors import UserInputError

    with pytest.raises(UserInputError, match="holds no tensor-parallel size"):
        tensor_parallel_from_checkpoint(("ckpt", meta))


def test_use_checkpoint_args_keeps_a_tokenizer_model_this_run_names():
    """--use-checkpoint-args takes the saving run's tokenizer flags only when this run names no
    --tokenizer-model (and not under --no-use-tokenizer-model-from-checkpoint-args)."""
    from megatron_zaya.checkpoint.preflight import tokenizer_args_from_checkpoint

    source = ("ckpt", {"args": {"tokenizer_type": "NullTokenizer", "tokenizer_model": "32000"}})
    taken = SimpleNamespace(tokenizer_model=None, use_tokenizer_model_from_checkpoint_args=True)
    assert tokenizer_args_from_checkpoint(taken, source) == {"tokenizer_type": "NullTokenizer",
                                                             "tokenizer_model": "32000"}
    own = SimpleNamespace(tokenizer_model="500", use_tokenizer_model_from_checkpoint_args=True)
    assert tokenizer_args_from_checkpoint(own, source) == {}
    off = SimpleNamespace(tokenizer_model=None, use_tokenizer_model_from_checkpoint_args=False)
    assert tokenizer_args_from_checkpoint(off, source) == {}


def test_a_pretrained_checkpoint_without_a_checkpoint_is_refused_before_the_build(tmp_path):
    """--pretrained-checkpoint naming an empty folder (and --load holding none) stops before the build."""
    own = str(tmp_path / "own")
    (tmp_path / "base").mkdir()
    with pytest.raises(CheckpointError, match=r"--pretrained-checkpoint .*base: no checkpoint found \(nor in --load"):
        check_before_build(run_of(load=own, save=own, pretrained_checkpoint=str(tmp_path / "base")))
