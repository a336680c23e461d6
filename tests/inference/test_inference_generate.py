"""generate() and tools/generate.py: greedy decoding against a cache-free reference, batches of
different lengths, stopping at EOD, loading a HF folder, text prompts through a tokenizer."""
import json

import pytest
import torch

from megatron_zaya.inference import SamplingParams, generate
from megatron_zaya.inference.loading import load_model_for_inference

from inference_helpers import hf_checkpoint, load_tool, one_cpu_thread, tiny_model  # noqa: F401 (fixtures)


def reference_greedy(model, prompt, n):
    """Cache-free greedy decoding: a full forward over the whole sequence for every new token."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


PROMPTS = [[5, 9, 100, 7, 7, 3000], [42], [8000, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]


def test_greedy_batch_matches_cache_free_reference(tiny_model):
    out = generate(tiny_model, PROMPTS, 12, SamplingParams(greedy=True))
    for prompt, new in zip(PROMPTS, out.tokens):
        assert new == reference_greedy(tiny_model, prompt, 12)
    assert out.stopped_at_eod == [False] * 3
    # Each row alone gives the same tokens as inside the batch.
    assert generate(tiny_model, PROMPTS[1:2], 12, SamplingParams(greedy=True)).tokens[0] == out.tokens[1]


def test_stops_each_row_at_eod(tiny_model):
    free = generate(tiny_model, PROMPTS, 10, SamplingParams(greedy=True)).tokens
    eod = free[0][3]
    out = generate(tiny_model, PROMPTS, 10, SamplingParams(greedy=True), eod=eod)
    first = free[0].index(eod)
    assert out.tokens[0] == free[0][:first + 1] and out.stopped_at_eod[0]
    for row in (1, 2):
        expected = free[row][:free[row].index(eod) + 1] if eod in free[row] else free[row]
        assert out.tokens[row] == expected


def test_sampling_is_seeded(tiny_model):
    params = SamplingParams(temperature=1.5, top_k=100, top_p=0.95)
    a = generate(tiny_model, PROMPTS, 8, params, seed=3).tokens
    assert a == generate(tiny_model, PROMPTS, 8, params, seed=3).tokens
    assert a != generate(tiny_model, PROMPTS, 8, params, seed=4).tokens


def test_bad_prompts_raise(tiny_model):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(tiny_model, [[1], []], 2)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(tiny_model, [[tiny_model.config.vocab_size]], 2)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        generate(tiny_model, [[1]], tiny_model.config.max_position_embeddings)


def test_loaded_hf_folder_generates_like_the_model(tiny_model, hf_checkpoint):
    model, config, info = load_model_for_inference(hf_checkpoint)
    assert info["format"] == "huggingface" and config.num_layers == tiny_model.config.num_layers
    ids = generate(model, PROMPTS, 6, SamplingParams(greedy=True)).tokens
    assert ids == generate(tiny_model, PROMPTS, 6, SamplingParams(greedy=True)).tokens


def test_loader_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no_such"):
        load_model_for_inference(tmp_path / "no_such")
    (tmp_path / "empty").mkdir()
    # Neither a HF folder nor (when the checkpoint package provides a loader) one of ours.
    with pytest.raises((ValueError, RuntimeError), match="empty"):
        load_model_for_inference(tmp_path / "empty")


def test_generate_tool_with_ids_and_null_tokenizer(tiny_model, hf_checkpoint, tmp_path, capsys):
    tool = load_tool("generate")
    out_json = tmp_path / "gen.json"
    assert tool.main(["--load", str(hf_checkpoint), "--prompt-ids", "5 9 100 7 7 3000", "--prompt-ids", "42",
                      "--greedy", "--max-new-tokens", "7", "--output-json", str(out_json)]) == 0
    samples = json.loads(out_json.read_text())["samples"]
    expected = generate(tiny_model, PROMPTS[:2], 7, SamplingParams(greedy=True)).tokens
    assert [s["generated_ids"] for s in samples] == expected
    assert " ".join(map(str, expected[0])) in capsys.readouterr().out
    # Text prompts through a tokenizer (NullTokenizer: ids as text, EOD = vocabulary size).
    assert tool.main(["--load", str(hf_checkpoint), "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "8000",
                      "--prompt", "5 9 100 7 7 3000", "--top-k", "5", "--seed", "1", "--max-new-tokens", "5",
                      "--output-json", str(out_json)]) == 0
    sample = json.loads(out_json.read_text())["samples"][0]
    assert sample["prompt"] == "5 9 100 7 7 3000" and len(sample["generated_ids"]) <= 5
    assert all(t <= 8000 for t in sample["generated_ids"])     # never a padded-vocabulary row
    # --prompt-ids with a tokenizer: the ids are printed too (a recorded tokenizer printed only its text)
    capsys.readouterr()
    assert tool.main(["--load", str(hf_checkpoint), "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "8000",
                      "--prompt-ids", "5 9 100", "--greedy", "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "prompt ids:    5 9 100" in out and "generated ids:" in out
    with pytest.raises(SystemExit):
        tool.main(["--load", str(hf_checkpoint), "--prompt", "hello"])   # text without a tokenizer


def test_one_new_token_for_ragged_prompts_sharing_a_prefix(tiny_model):
    """max_new_tokens 1 over prompts sharing a 10-token prefix and ending at different lengths (extend_rows
    pads the shorter ones): each row's token and log-probability equal those of a full forward over that
    prompt alone (the last position's argmax and log_softmax, 1e-4)."""
    prefix = list(range(5, 15))
    prompts = [prefix + [40], prefix + [41, 42, 43], prefix + [44, 45]]
    out = generate(tiny_model, prompts, 1, SamplingParams(greedy=True), return_logprobs=True)
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            logprobs = torch.log_softmax(tiny_model(torch.tensor([prompt])).logits[0, -1].double(), dim=-1)
            assert out.tokens[i] == [int(logprobs.argmax())], i
            assert out.logprobs[i] == pytest.approx([float(logprobs.max())], abs=1e-4), i


def test_sampled_logprobs_are_the_models_before_temperature_and_top_p(tiny_model):
    """Sampling at temperature 0.5 and top_p 0.9 with return_logprobs: each generated token's log-probability
    is the model's own, log_softmax over the whole vocabulary of one full forward over prompt + generated
    ids (the documented contract: before temperature, top-k, top-p), to 1e-4."""
    out = generate(tiny_model, PROMPTS[:2], 6, SamplingParams(temperature=0.5, top_p=0.9), seed=5,
                   vocab_limit=tiny_model.config.vocab_size - 100, return_logprobs=True)
    with torch.no_grad():
        for prompt, new, got in zip(PROMPTS, out.tokens, out.logprobs):
            ids = prompt + new
            logits = tiny_model(torch.tensor([ids])).logits[0].double()
            logprobs = torch.log_softmax(logits, dim=-1)[torch.arange(len(prompt) - 1, len(ids) - 1),
                                                          torch.tensor(new)]
            assert len(new) == 6 and got == pytest.approx(logprobs.tolist(), abs=1e-4)
            assert max(new) < tiny_model.config.vocab_size - 100
