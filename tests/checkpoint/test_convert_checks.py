"""checkpoint/convert.py's checks in isolation, on a one-layer zaya1-tiny: the output folder (a latest file
alone refuses it), the default world size (TP x CP), a model state that lacks a weight, and the tokenizer
bound (a vocabulary exactly the embedding's size fits).

    python -m pytest -q tests/checkpoint/test_convert_checks.py
"""
import pytest

from megatron_zaya.checkpoint import convert
from megatron_zaya.checkpoint.format import CheckpointError
from megatron_zaya.config import model_config_from_preset
from megatron_zaya.errors import UserInputError
from megatron_zaya.model import ZayaModel


@pytest.fixture(scope="module")
def tiny():
    return ZayaModel(model_config_from_preset("zaya1-tiny", num_layers=1, vocab_size=256))


def test_a_folder_holding_only_a_latest_file_is_refused(tmp_path):
    convert.check_output_folder(str(tmp_path))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3\n")
    with pytest.raises(UserInputError, match="already holds latest_checkpointed_iteration.txt"):
        convert.check_output_folder(str(tmp_path))


def test_the_default_world_size_is_tensor_times_context_parallel(tmp_path, tiny):
    assert convert.check_sharded_output(str(tmp_path / "o"), tiny.config, tp=1, cp=2) == 2
    assert convert.check_sharded_output(str(tmp_path / "o"), tiny.config, tp=2, cp=2) == 4
    assert convert.check_sharded_output(str(tmp_path / "o"), tiny.config, tp=1, cp=2, world_size=4) == 4


def test_a_state_lacking_a_weight_is_refused(tiny):
    state = dict(tiny.state_dict())
    name = next(k for k in state if k != "embedding.weight")
    del state[name]
    with pytest.raises(CheckpointError, match=f"missing \\['{name}'\\]"):
        convert._sharded_model(state, tiny.config, 1, 1, 1, 1, 0)


def test_a_tokenizer_as_large_as_the_embedding_fits(tmp_path, tiny, monkeypatch):
    from megatron_zaya.checkpoint.hf_format import save_hf_folder

    save_hf_folder(tiny.state_dict(), tiny.config, tmp_path / "hf")
    ckpt = convert.hf_to_checkpoint(str(tmp_path / "hf"), str(tmp_path / "ckpt"))

    class Tok:
        def __init__(self, n):
            self.vocab_size = n

    class Passed(Exception):
        pass

    def reached(*args, **kwargs):
        raise Passed
    monkeypatch.setattr(convert, "load_full_model_state", reached)
    with pytest.raises(Passed):          # 256 tokens, 256 rows: past the check
        convert.checkpoint_to_hf(ckpt, str(tmp_path / "out1"), tokenizer=Tok(256))
    with pytest.raises(CheckpointError, match="257 tokens do not fit the checkpoint's 256"):
        convert.checkpoint_to_hf(ckpt, str(tmp_path / "out2"), tokenizer=Tok(257))


def test_a_reshard_keeps_the_train_state_and_the_recorded_tokenizer(tmp_path, tiny):
    from megatron_zaya.checkpoint.format import read_folder_metadata
    from megatron_zaya.checkpoint.inspection import resolve_folder

    state = {"iteration": 4, "consumed_samples": 40, "consumed_tokens": 640, "consumed_valid_samples": 8,
             "skipped_iterations": 1}
    tok = {"args": {"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": "tok", "vocab_file": None},
           "working_directory": "/work/dir"}
    src = convert.save_model_as_checkpoint(tiny.state_dict(), tiny.config, str(tmp_path / "src"), iteration=4,
                                           train_state=state, tokenizer=tok)
    out = read_folder_metadata(resolve_folder(convert.reshard_checkpoint(src, str(tmp_path / "same"), tp=2)))
    assert out["train_state"] == state and out["consumed_samples"] == 40 and out["tokens_seen"] == 640
    assert out["args"] == {"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": "tok"}
    assert out["working_directory"] == "/work/dir"
    out = read_folder_metadata(resolve_folder(convert.reshard_checkpoint(src, str(tmp_path / "new"), iteration=9)))
    assert out["train_state"] == {"iteration": 9, "consumed_samples": 0, "consumed_tokens": 0,
                                  "consumed_valid_samples": 0, "skipped_iterations": 0}


def test_from_hf_refuses_a_negative_iteration_before_reading_a_weight(tmp_path, tiny, monkeypatch):
    from megatron_zaya.checkpoint.hf_format import save_hf_folder

    save_hf_folder(tiny.state_dict(), tiny.config, tmp_path / "hf")

    def no_weights(*args, **kwargs):
        raise AssertionError("a weight was read")
    monkeypatch.setattr(convert, "load_hf_folder", no_weights)
    with pytest.raises(UserInputError, match="--iteration=-1: must be >= 0"):
        convert.hf_to_checkpoint(str(tmp_path / "hf"), str(tmp_path / "out"), iteration=-1)
    assert not (tmp_path / "out").exists()
