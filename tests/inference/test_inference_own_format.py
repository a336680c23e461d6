"""The loader and inspect_checkpoint.py on megatron-zaya's own sharded checkpoints (a TP2 x EP2 layout
written from a model), through the checkpoint package's load_full_model_state / inspect_checkpoint.
Skipped when the checkpoint package does not provide them (the HF tests cover the rest)."""
import pytest
import torch

from megatron_zaya.inference import SamplingParams, generate
from megatron_zaya.inference.loading import load_model_for_inference

from inference_helpers import load_tool, one_cpu_thread, tiny_model  # noqa: F401 (fixtures)

convert = pytest.importorskip("megatron_zaya.checkpoint.convert",
                              reason="megatron_zaya.checkpoint.convert (own-format writer) not available")


def test_sharded_checkpoint_loads_and_inspects(tiny_model, tmp_path, capsys):
    save_dir = str(tmp_path / "ckpt")
    convert.save_model_as_checkpoint(tiny_model.state_dict(), tiny_model.config, save_dir, tp=2, ep=2,
                                     world_size=4, iteration=12)
    model, config, info = load_model_for_inference(save_dir)
    assert info["format"] == "megatron-zaya" and info["iteration"] == 12
    assert config.num_layers == tiny_model.config.num_layers
    tokens = torch.randint(0, 8000, (2, 20))
    torch.testing.assert_close(model(tokens).logits, tiny_model(tokens).logits, rtol=0, atol=0)
    prompts = [[1, 2, 3], [9]]
    assert (generate(model, prompts, 5, SamplingParams(greedy=True)).tokens
            == generate(tiny_model, prompts, 5, SamplingParams(greedy=True)).tokens)
    tool = load_tool("inspect_checkpoint")
    assert tool.main([save_dir]) == 0
    out = capsys.readouterr().out
    assert "iteration:   12" in out and "tensor_model_parallel_size=2" in out and "status:      OK" in out
