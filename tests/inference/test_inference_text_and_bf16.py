"""Text generation through a real SentencePiece tokenizer, and bf16 decoding against the bf16 full forward."""
import json

import pytest
import torch

from megatron_zaya.inference import InferenceCache, SamplingParams, forward_with_cache, generate, prefill
from megatron_zaya.inference.loading import inference_autocast, load_model_for_inference

from inference_helpers import hf_checkpoint, load_tool, one_cpu_thread, sp_model, tiny_model  # noqa: F401 (fixtures)


def test_a_hugging_face_folder_brings_its_own_tokenizer(tiny_model, sp_model, tmp_path, capsys):
    """--load of an export with its tokenizer (convert_checkpoint.py to-hf --tokenizer-type ...) needs no
    tokenizer flags: the same ids and text as with the training run's flags."""
    from megatron_zaya.checkpoint.hf_format import save_hf_folder
    from megatron_zaya.data.tokenizer import build_tokenizer
    folder = tmp_path / "hf"
    save_hf_folder(tiny_model.state_dict(), tiny_model.config, folder,
                   tokenizer=build_tokenizer("GPTSentencePieceTokenizer", sp_model))
    tool = load_tool("generate")
    args = ["--load", str(folder), "--prompt", "the quick brown fox", "--greedy", "--max-new-tokens", "6",
            "--output-json", str(tmp_path / "gen.json")]
    assert tool.main(args) == 0
    assert f"tokenizer: {folder / 'tokenizer.json'} of --load" in capsys.readouterr().err
    own = json.loads((tmp_path / "gen.json").read_text())["samples"]
    assert tool.main(args + ["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", sp_model]) == 0
    assert json.loads((tmp_path / "gen.json").read_text())["samples"] == own
    assert own[0]["generated"] and own[0]["prompt_ids"] == build_tokenizer("GPTSentencePieceTokenizer", sp_model).encode(
        "the quick brown fox")


def test_generate_text_with_sentencepiece(hf_checkpoint, sp_model, tmp_path, capsys, monkeypatch):
    from megatron_zaya.data.tokenizer import build_tokenizer
    tok = build_tokenizer("GPTSentencePieceTokenizer", sp_model)
    out_json = tmp_path / "gen.json"
    tool = load_tool("generate")
    prompts = ["the quick brown fox", "a"]
    args = ["--load", str(hf_checkpoint), "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", sp_model,
            "--prompt", prompts[0], "--prompt", prompts[1], "--temperature", "0.8", "--top-p", "0.9",
            "--max-new-tokens", "12", "--seed", "5", "--output-json", str(out_json)]
    assert tool.main(args) == 0
    samples = json.loads(out_json.read_text())["samples"]
    printed = capsys.readouterr().out
    for text, sample in zip(prompts, samples):
        assert sample["prompt_ids"] == tok.encode(text) and sample["prompt"] == text
        assert all(t < tok.vocab_size for t in sample["generated_ids"])   # 500-piece vocab in an 8192-row model
        # decoded whole: prompt + generated is the text (a first generated piece keeps its leading space)
        whole = tok.decode(sample["prompt_ids"] + [t for t in sample["generated_ids"] if t != tok.eod])
        assert sample["text"] == whole == sample["prompt"] + sample["generated"] and whole in printed
    assert tool.main(args) == 0                                  # same seed, same text
    assert json.loads(out_json.read_text())["samples"] == samples
    # --stream prints, as it is sampled, the text the same run prints at the end (one prompt)
    one = args[:args.index("--prompt") + 2] + args[args.index("--temperature"):]
    assert tool.main(one) == 0
    alone = json.loads(out_json.read_text())["samples"]
    capsys.readouterr()
    assert tool.main(one + ["--stream"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(out_json.read_text())["samples"] == alone
    assert printed.splitlines()[0] == f"=== sample 0 ({len(alone[0]['prompt_ids'])} prompt tokens, streamed)"
    want = tok.decode(alone[0]["prompt_ids"] + [t for t in alone[0]["generated_ids"] if t != tok.eod])
    assert printed.split("\n", 1)[1].rstrip("\n") == want
    # prompts from standard input (--prompt-file -), and a reader of stdout that has gone (`| head`): the JSON
    # is still written, with no traceback
    import io
    import os
    import subprocess
    import sys
    monkeypatch.setattr("sys.stdin", io.StringIO(prompts[0] + "\n"))
    assert tool.main(one[:one.index("--prompt")] + ["--prompt-file", "-"] + one[one.index("--prompt") + 2:]) == 0
    assert json.loads(out_json.read_text())["samples"] == alone
    out_json.unlink()
    read, write = os.pipe()
    os.close(read)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, os.path.join(root, "tools", "generate.py"), *args], stdout=write,
                          stderr=subprocess.PIPE, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    os.close(write)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert json.loads(out_json.read_text())["samples"] == samples
    with pytest.raises(SystemExit):
        tool.main(args + ["--stream"])                           # two prompts
    assert "--stream prints one prompt's text as it is sampled" in capsys.readouterr().err


def test_bf16_decode_tracks_bf16_full_forward(hf_checkpoint, tiny_model):
    model, _, _ = load_model_for_inference(hf_checkpoint, dtype=torch.bfloat16)
    assert model.layers[0].attention.linear_q.weight.dtype == torch.bfloat16
    assert model.layers[0].moe.router.fc1.weight.dtype == torch.float32       # the router stays fp32
    tokens = torch.randint(0, 8000, (1, 24))
    with torch.no_grad(), inference_autocast(model):
        full = model(tokens).logits.float()[0]
    with torch.no_grad():
        reference = tiny_model(tokens).logits[0]
    cache = InferenceCache(model.config, 1, 24, dtype=torch.bfloat16)
    prefill(model, cache, 0, tokens[0, :12])
    steps = torch.stack([forward_with_cache(model, cache, tokens[:, i:i + 1])[0] for i in range(12, 24)])
    # bf16 rounding differs between one long and many short matmuls; agreement to bf16 precision.
    scale = reference.abs().max().item()
    assert (steps - full[12:]).abs().max().item() < 0.05 * scale
    assert (full - reference).abs().max().item() < 0.1 * scale
    # Greedy generation runs end to end in bf16.
    out = generate(model, [[1, 2, 3]], 4, SamplingParams(greedy=True))
    assert len(out.tokens[0]) == 4


def test_bf16_stored_checkpoint_loads_as_stored(tiny_model, tmp_path):
    from megatron_zaya.checkpoint.hf_format import save_hf_folder
    folder = tmp_path / "hf_bf16"
    save_hf_folder(tiny_model.state_dict(), tiny_model.config, folder, dtype=torch.bfloat16)
    model, _, _ = load_model_for_inference(folder)              # dtype None: as stored
    assert model.embedding.weight.dtype == torch.bfloat16
    assert model.layers[1].moe.router.down_proj.weight.dtype == torch.float32
    assert model.layers[1].moe.router.balancing_bias.dtype == torch.float32
    with torch.no_grad():
        reference = tiny_model(torch.tensor([[1, 2, 3, 4]])).logits[0, -1]
    cache = InferenceCache(model.config, 1, 4, dtype=torch.bfloat16)
    last = prefill(model, cache, 0, [1, 2, 3, 4])
    assert (last - reference).abs().max().item() < 0.1 * reference.abs().max().item()


def test_float64_decode_runs_without_autocast(tiny_model):
    """A float64 model (an exact reference) decodes with autocast off: autocast has no fp64 and would warn on
    every call ("In CPU autocast, but the target dtype is not supported")."""
    import copy
    import warnings
    model = copy.deepcopy(tiny_model).double().eval()
    tokens = torch.randint(0, 8000, (1, 8))
    cache = InferenceCache(model.config, 1, 8, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        last = prefill(model, cache, 0, tokens[0])
    with torch.no_grad():
        reference = tiny_model(tokens).logits[0, -1]
    assert (last.float() - reference).abs().max().item() < 1e-4 * reference.abs().max().item()
