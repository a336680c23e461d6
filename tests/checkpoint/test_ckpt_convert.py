"""tools/convert_checkpoint.py: sharded -> Hugging Face folder -> sharded in another layout (and an
offline re-layout), with identical weights, and training continues from the converted checkpoint."""
import importlib.util
import os

import pytest
import torch

from ckpt_harness import ROOT, flags, train
from megatron_zaya.checkpoint import inspect_checkpoint, load_full_model_state
from megatron_zaya.checkpoint.hf_format import load_hf_folder


def _tool():
    spec = importlib.util.spec_from_file_location("_convert_checkpoint", os.path.join(ROOT, "tools", "convert_checkpoint.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].shape == b[k].shape and torch.equal(a[k], b[k].to(a[k].dtype)), k


def test_sharded_to_hf_and_back_into_any_layout(ckpt_corpus, ckpt_cache, tmp_path, capsys):
    tool = _tool()
    src = str(tmp_path / "src")
    train(flags(ckpt_corpus, 2, "--save", src, cache=ckpt_cache))
    original, config, info = load_full_model_state(src)
    assert info["iteration"] == 2

    hf = str(tmp_path / "hf")
    capsys.readouterr()
    assert tool.main(["to-hf", src, hf]) == 0
    progress = capsys.readouterr().err        # progress lines: every tenth of the weights read, then the write
    weights = len([k for k in original])
    assert f"read {weights}/{weights} weights (" in progress and f"] writing {hf}" in progress, progress
    hf_state, hf_config = load_hf_folder(hf)
    _same(original, hf_state)
    assert hf_config.hidden_size == config.hidden_size and hf_config.num_experts == config.num_experts
    assert tool.main(["to-hf", src, hf]) == 1            # refuses to overwrite
    assert "refusing to overwrite" in capsys.readouterr().err

    sharded = str(tmp_path / "tp2ep2")
    assert tool.main(["from-hf", hf, sharded, "--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2",
                      "--world-size", "4"]) == 0
    assert "wrote rank 4/4" in capsys.readouterr().err
    report = inspect_checkpoint(sharded)
    assert report["ok"] and report["layout"]["world_size"] == 4 and report["iteration"] == 0
    assert report["layout"]["tensor_model_parallel_size"] == 2
    _same(original, load_full_model_state(sharded)[0])

    relayout = str(tmp_path / "ep2")
    assert tool.main(["reshard", sharded, relayout, "--expert-model-parallel-size", "2", "--world-size", "2",
                      "--iteration", "7", "--no-progress"]) == 0
    assert "[convert" not in capsys.readouterr().err
    assert inspect_checkpoint(relayout)["iteration"] == 7
    _same(original, load_full_model_state(relayout)[0])

    # Training starts from the converted weights exactly as from the original checkpoint.
    from_original = train(flags(ckpt_corpus, 1, "--load", src, "--finetune", cache=ckpt_cache))
    from_converted = train(flags(ckpt_corpus, 1, "--load", sharded, "--finetune", cache=ckpt_cache))
    assert from_original.losses == from_converted.losses


def test_bad_source_is_a_clear_error(tmp_path, capsys):
    tool = _tool()
    assert tool.main(["to-hf", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 1
    assert "nothing" in capsys.readouterr().err


def test_failed_hf_write_leaves_no_temporary_folder(tmp_path, monkeypatch):
    """A write that fails half-way (here: the weights file) removes its hidden temporary folder."""
    import errno
    from megatron_zaya.checkpoint import hf_format
    from megatron_zaya.config import model_config_from_preset
    from megatron_zaya.model import ZayaModel
    config = model_config_from_preset("zaya1-tiny", num_layers=1, hidden_size=32, num_attention_heads=2,
                                      num_query_groups=2, kv_channels=16, vocab_size=128, num_experts=2,
                                      moe_ffn_hidden_size=32, router_hidden_size=8, seq_length=16)
    state = ZayaModel(config).state_dict()

    def disk_full(tensors, path, metadata=None):
        open(path, "wb").write(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device", path)
    monkeypatch.setattr(hf_format, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        hf_format.save_hf_folder(state, config, tmp_path / "hf")
    assert os.listdir(tmp_path) == []
