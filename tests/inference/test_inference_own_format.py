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


def test_a_checkpoint_with_more_tp_ranks_than_kv_heads_is_written_offline_and_loads(tiny_model, tmp_path):
    """TP 4 over 2 KV heads (each KV head replicated on 2 ranks, as ZAYA1-base's 2 heads at TP 4 or 8): the offline
    writer (convert_checkpoint.py from-hf / reshard) has no process group, so it must not ask for the replicas'
    groups; the checkpoint loads back to the same logits."""
    assert tiny_model.config.num_query_groups < 4
    save_dir = str(tmp_path / "ckpt")
    convert.save_model_as_checkpoint(tiny_model.state_dict(), tiny_model.config, save_dir, tp=4, world_size=4,
                                     iteration=3)
    model, _, info = load_model_for_inference(save_dir)
    tokens = torch.randint(0, 8000, (2, 20))
    torch.testing.assert_close(model(tokens).logits, tiny_model(tokens).logits, rtol=0, atol=0)


def test_generate_and_evaluate_tools_on_a_sharded_checkpoint(tiny_model, tmp_path, capsys):
    """The command lines, not only the loader: a TP2 x EP2 checkpoint of ours gives the tools the same
    output as the model it was written from (greedy ids; loss on a small dataset)."""
    import json

    import numpy as np

    from megatron_zaya.data import IndexedDatasetWriter

    save_dir = str(tmp_path / "ckpt")
    convert.save_model_as_checkpoint(tiny_model.state_dict(), tiny_model.config, save_dir, tp=2, ep=2,
                                     world_size=4, iteration=12)
    gen_json = tmp_path / "gen.json"
    assert load_tool("generate").main(["--load", save_dir, "--prompt-ids", "5 9 100 7", "--prompt-ids", "42",
                                       "--greedy", "--max-new-tokens", "6", "--output-json", str(gen_json)]) == 0
    expected = generate(tiny_model, [[5, 9, 100, 7], [42]], 6, SamplingParams(greedy=True)).tokens
    assert [s["generated_ids"] for s in json.loads(gen_json.read_text())["samples"]] == expected

    prefix = str(tmp_path / "docs_text_document")
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 7999, size=40).tolist() + [8000] for _ in range(12)]
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for doc in docs:
            writer.add_document(doc)
    eval_json = tmp_path / "eval.json"
    assert load_tool("evaluate").main(["--load", save_dir, "--data-path", prefix, "--split", "0,100,0",
                                       "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "8000",
                                       "--seq-length", "16", "--micro-batch-size", "2", "--eval-iters", "2",
                                       "--output-json", str(eval_json)]) == 0
    report = json.loads(eval_json.read_text())
    assert report["samples"] == 4 and report["tokens"] == 4 * 16
    capsys.readouterr()
    # The same evaluation of the in-memory model through its HF export gives the same loss.
    from megatron_zaya.checkpoint.hf_format import save_hf_folder
    save_hf_folder(tiny_model.state_dict(), tiny_model.config, tmp_path / "hf")
    hf_json = tmp_path / "eval_hf.json"
    assert load_tool("evaluate").main(["--load", str(tmp_path / "hf"), "--data-path", prefix, "--split", "0,100,0",
                                       "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "8000",
                                       "--seq-length", "16", "--micro-batch-size", "2", "--eval-iters", "2",
                                       "--output-json", str(hf_json)]) == 0
    assert report["loss"] == json.loads(hf_json.read_text())["loss"]
    assert report["loss"] < 2 * np.log(8000) and np.isfinite(report["loss"])
