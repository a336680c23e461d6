"""Cached decoding against the full forward (fp32, 1e-5), and the cache size against the accounting."""
import pytest
import torch

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.inference import InferenceCache, forward_with_cache, prefill
from megatron_zaya.model.accounting import decode_state_bytes_per_sequence, kv_cache_bytes_per_token

from inference_helpers import load_tool, make_model, one_cpu_thread, tiny_model  # noqa: F401 (fixtures)

TOL = 1e-5


def full_logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits.float()


def test_token_by_token_matches_full_forward(tiny_model):
    torch.manual_seed(1)
    tokens = torch.randint(0, tiny_model.config.vocab_size, (2, 48))
    full = full_logits(tiny_model, tokens)
    cache = InferenceCache(tiny_model.config, 2, 48)
    steps = torch.stack([forward_with_cache(tiny_model, cache, tokens[:, i:i + 1]) for i in range(48)], dim=1)
    assert full.abs().max() > 1.0            # logits are not trivially small
    torch.testing.assert_close(steps, full, rtol=0, atol=TOL)
    assert cache.lengths.tolist() == [48, 48]


@pytest.mark.parametrize("chunk", [1, 5, 16, 48])
def test_chunked_prefill_then_decode_matches_full_forward(tiny_model, chunk):
    torch.manual_seed(2)
    tokens = torch.randint(0, tiny_model.config.vocab_size, (1, 48))
    full = full_logits(tiny_model, tokens)[0]
    cache = InferenceCache(tiny_model.config, 1, 64)
    last = prefill(tiny_model, cache, 0, tokens[0, :30], chunk_size=chunk)
    torch.testing.assert_close(last, full[29], rtol=0, atol=TOL)
    chunk_logits = forward_with_cache(tiny_model, cache, tokens[:, 30:33], all_logits=True)[0]
    torch.testing.assert_close(chunk_logits, full[30:33], rtol=0, atol=TOL)
    for i in range(33, 48):
        torch.testing.assert_close(forward_with_cache(tiny_model, cache, tokens[:, i:i + 1])[0], full[i],
                                   rtol=0, atol=TOL)


def test_batched_rows_of_different_lengths_match_their_own_full_forward(tiny_model):
    torch.manual_seed(3)
    lengths, new = [5, 23, 1, 12], 10
    seqs = [torch.randint(0, tiny_model.config.vocab_size, (n + new,)) for n in lengths]
    cache = InferenceCache(tiny_model.config, len(seqs), max(lengths) + new)
    firsts = [prefill(tiny_model, cache, row, s[:n]) for row, (s, n) in enumerate(zip(seqs, lengths))]
    decoded = []
    for step in range(new):
        step_tokens = torch.stack([s[n + step] for s, n in zip(seqs, lengths)])[:, None]
        decoded.append(forward_with_cache(tiny_model, cache, step_tokens))
    for row, (s, n) in enumerate(zip(seqs, lengths)):
        full = full_logits(tiny_model, s[None])[0]
        torch.testing.assert_close(firsts[row], full[n - 1], rtol=0, atol=TOL)
        torch.testing.assert_close(torch.stack([d[row] for d in decoded]), full[n:], rtol=0, atol=TOL)


@pytest.mark.parametrize("state", ["conv_inputs", "delayed_value", "keys"])
def test_dropping_any_part_of_the_decode_state_breaks_equivalence(tiny_model, state):
    """Negative control: each piece of the cache is needed, so the equivalence tests can fail."""
    torch.manual_seed(4)
    tokens = torch.randint(0, tiny_model.config.vocab_size, (1, 20))
    full = full_logits(tiny_model, tokens)[0]
    cache = InferenceCache(tiny_model.config, 1, 20)
    prefill(tiny_model, cache, 0, tokens[0, :19])
    for layer in cache.layers:
        getattr(layer, state)[..., :1, :].zero_() if state == "keys" else getattr(layer, state).zero_()
    wrong = forward_with_cache(tiny_model, cache, tokens[:, 19:])[0]
    assert (wrong - full[19]).abs().max() > 100 * TOL


def test_other_conv_kernels_and_untied_head():
    model = make_model(seed=5, num_layers=2, cca_depthwise_kernel=3, cca_grouped_kernel=1,
                       untie_embeddings_and_output_weights=True)
    tokens = torch.randint(0, model.config.vocab_size, (1, 16))
    full = full_logits(model, tokens)[0]
    cache = InferenceCache(model.config, 1, 16)
    prefill(model, cache, 0, tokens[0, :7], chunk_size=3)
    steps = torch.stack([forward_with_cache(model, cache, tokens[:, i:i + 1])[0] for i in range(7, 16)])
    torch.testing.assert_close(steps, full[7:], rtol=0, atol=TOL)


def test_cache_full_and_bad_rows_raise(tiny_model):
    cache = InferenceCache(tiny_model.config, 2, 4)
    with pytest.raises(ValueError, match="cache is full"):
        forward_with_cache(tiny_model, cache, torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="empty"):
        prefill(tiny_model, cache, 0, [])


@pytest.mark.parametrize("dtype,nbytes", [(torch.bfloat16, 2), (torch.float32, 4)])
def test_cache_bytes_match_accounting_and_model_stats(dtype, nbytes, capsys):
    config = model_config_from_preset("zaya1-base")
    cache = InferenceCache(config.replace(num_layers=config.num_layers), 1, 1, device="meta", dtype=dtype)
    assert cache.bytes_per_token() == kv_cache_bytes_per_token(config, nbytes) == 40 * 2 * 2 * 128 * nbytes
    assert cache.state_bytes_per_sequence() == decode_state_bytes_per_sequence(config, nbytes)
    # 8x smaller than 16-head attention with the same head dim.
    assert 40 * 2 * 16 * 128 * nbytes == 8 * cache.bytes_per_token()
    if dtype is torch.bfloat16:
        assert load_tool("model_stats").main(["--preset", "zaya1-base"]) == 0
        out = capsys.readouterr().out
        line = next(l for l in out.splitlines() if l.startswith("KV-cache bytes per token"))
        assert f"{cache.bytes_per_token():,}" in line


def test_a_repeated_prompt_is_prefilled_once_and_decodes_like_its_own_row(tiny_model, monkeypatch):
    """generate with a prompt given three times (n / best_of samples) runs one prefill for it and copies
    the cache row: each copy then decodes exactly as the prompt alone (tokens and log-probabilities),
    with the other prompt's row left alone."""
    from megatron_zaya.inference import decode

    torch.manual_seed(5)
    p, q = torch.randint(0, 500, (9,)).tolist(), torch.randint(0, 500, (4,)).tolist()
    calls = []
    real_prefill = decode.prefill
    monkeypatch.setattr(decode, "prefill", lambda *a, **k: calls.append(a[3]) or real_prefill(*a, **k))
    greedy = decode.SamplingParams(greedy=True)
    both = decode.generate(tiny_model, [p, q, p, p], 6, greedy, return_logprobs=True, top=2)
    assert sorted(list(c) for c in calls) == sorted([p, q])        # (filled in the prompts' sorted order)
    for row, prompt in enumerate([p, q, p, p]):
        alone = decode.generate(tiny_model, [prompt], 6, greedy, return_logprobs=True, top=2)
        assert both.tokens[row] == alone.tokens[0], row
        assert both.prompt_scores[row].logprobs == pytest.approx(alone.prompt_scores[0].logprobs, abs=TOL)
        assert both.scores[row].logprobs == pytest.approx(alone.scores[0].logprobs, abs=TOL)
    assert both.prompt_scores[2] is not both.prompt_scores[0]


def test_prompt_scores_take_the_lm_head_a_block_of_positions_at_a_time(tiny_model, monkeypatch):
    """Scoring a prompt never holds its whole (S, V) logits: with the block cut to 3 positions, the LM head
    sees at most 3 rows at a time, and the log-probabilities and top ids are those of the whole-prompt
    computation (fp32, 1e-5)."""
    from megatron_zaya.inference import decode

    torch.manual_seed(6)
    prompt = torch.randint(0, 500, (20,)).tolist()
    whole = decode.generate(tiny_model, [prompt], 0, return_logprobs=True, top=3).prompt_scores[0]
    rows = []
    real = decode.lm_logits
    monkeypatch.setattr(decode, "lm_logits", lambda model, hidden: rows.append(hidden.shape[0]) or real(model, hidden))
    monkeypatch.setattr(decode, "SCORE_BLOCK_LOGITS", 3 * tiny_model.config.vocab_size)
    blocked = decode.generate(tiny_model, [prompt], 0, return_logprobs=True, top=3).prompt_scores[0]
    assert rows and max(rows) <= 3 and sum(r for r in rows if r > 1) >= 18, rows
    assert blocked.logprobs == pytest.approx(whole.logprobs, abs=TOL) and len(blocked.logprobs) == 19
    assert [list(t) for t in blocked.top] == [list(t) for t in whole.top]


def test_prompts_sharing_a_prefix_prefill_it_once_and_score_as_alone(tiny_model, monkeypatch):
    """The contexts of a multiple-choice question: prompts sharing a 12-token prefix (one is the prefix itself,
    one a duplicate, one continues with a single token), beside an unrelated prompt. The prefix is run once
    (tokens forwarded: 12 + the rests + the other prompt), and each row's prompt scores, greedy tokens and
    their log-probabilities equal those of the prompt alone (fp32, 1e-5)."""
    from megatron_zaya.inference import decode

    torch.manual_seed(7)
    prefix = torch.randint(0, 500, (12,)).tolist()
    rests = [[], [5, 6, 7], [9], [5, 6, 7], [11, 12, 13, 14]]
    other = torch.randint(0, 500, (6,)).tolist()
    prompts = [prefix + rest for rest in rests] + [other]
    forwarded = []
    real = decode._hidden_with_cache
    monkeypatch.setattr(decode, "_hidden_with_cache",
                        lambda model, cache, tokens, *a: forwarded.append(tokens.numel()) or real(model, cache, tokens, *a))
    greedy = decode.SamplingParams(greedy=True)
    together = decode.generate(tiny_model, prompts, 4, greedy, return_logprobs=True, top=2)
    prefill_tokens = sum(forwarded) - 3 * len(prompts)          # less the 3 decode steps of every row
    assert prefill_tokens == 12 + 3 + 1 + 4 + 6, forwarded      # the duplicate prompt is copied
    for row, prompt in enumerate(prompts):
        alone = decode.generate(tiny_model, [prompt], 4, greedy, return_logprobs=True, top=2)
        assert together.tokens[row] == alone.tokens[0], row
        assert together.prompt_scores[row].logprobs == pytest.approx(alone.prompt_scores[0].logprobs, abs=TOL), row
        assert [list(t) for t in together.prompt_scores[row].top] == [list(t) for t in alone.prompt_scores[0].top]
        assert together.scores[row].logprobs == pytest.approx(alone.scores[0].logprobs, abs=TOL), row
    assert decode.shared_prefix_groups(prompts) == [[0, 1, 2, 3, 4], [5]]   # (duplicates included)


def recorded_forwards(monkeypatch) -> list[tuple[int, int]]:
    """The (rows, tokens) shape of every forward the decode runs from now on (decode._hidden_with_cache)."""
    from megatron_zaya.inference import decode
    calls, real = [], decode._hidden_with_cache
    monkeypatch.setattr(decode, "_hidden_with_cache",
                        lambda model, cache, tokens, *a: calls.append(tuple(tokens.shape)) or real(model, cache, tokens, *a))
    return calls


def assert_rows_as_alone(model, prompts, together, new_tokens: int, scores: bool = True) -> None:
    """Each row of `together` (a generate with return_logprobs, top 2) has the tokens and log-probabilities
    (fp32, 1e-5) and the top ids of its prompt generated alone."""
    from megatron_zaya.inference import decode
    for row, prompt in enumerate(prompts):
        alone = decode.generate(model, [prompt], new_tokens, decode.SamplingParams(greedy=True), return_logprobs=True,
                                top=2)
        assert together.tokens[row] == alone.tokens[0], row
        assert together.prompt_scores[row].logprobs == pytest.approx(alone.prompt_scores[0].logprobs, abs=TOL), row
        assert [list(t) for t in together.prompt_scores[row].top] == [list(t) for t in alone.prompt_scores[0].top]
        if scores:
            assert together.scores[row].logprobs == pytest.approx(alone.scores[0].logprobs, abs=TOL), row


def test_prefixes_shared_at_several_depths_run_once_each(tiny_model, monkeypatch):
    """Few-shot multiple choice: a header all prompts share, each question's context shared by its answers
    (one answer is empty: the context alone), as lm-evaluation-harness sends them in one request. Each
    prefix is run once (header, then each question, then each answer; a question's answers together when
    nothing is decoded after them) and every row scores as alone (fp32, 1e-5)."""
    from megatron_zaya.inference import decode

    torch.manual_seed(8)
    header = torch.randint(0, 500, (10,)).tolist()
    questions = [torch.randint(0, 500, (9,)).tolist() for _ in range(2)]
    answers = [[[3, 4], [7], []], [[3, 5, 6], [8, 9]]]
    prompts = [header + question + answer for question, choices in zip(questions, answers) for answer in choices]
    calls = recorded_forwards(monkeypatch)
    together = decode.generate(tiny_model, prompts, 1, decode.SamplingParams(greedy=True), return_logprobs=True, top=2)
    # one new token: nothing runs after the prefill, so each question's answers (2 and 1 tokens; 3 and 2) share
    # one forward, padded to the longer (decode.extend_rows)
    # (the questions in their tokens' sorted order)
    forwarded = [rows * tokens for rows, tokens in calls]
    assert forwarded in ([10, 9, 2 * 2, 9, 2 * 3], [10, 9, 2 * 3, 9, 2 * 2]), forwarded
    calls.clear()            # two: a decode step follows, and answers of different lengths run one by one
    decode.generate(tiny_model, prompts, 2, decode.SamplingParams(greedy=True))
    forwarded = [rows * tokens for rows, tokens in calls]
    assert sorted(forwarded[:-1]) == sorted([10, 9, 2, 1, 9, 3, 2]), forwarded   # (at the header alone: 63 tokens)
    assert_rows_as_alone(tiny_model, prompts, together, 1, scores=False)


def test_sibling_answers_of_one_length_run_as_one_forward(tiny_model, monkeypatch):
    """Multiple choice with letter answers (" A" .. " D", one token each) and two-token answers: the
    consecutive answers of one length after a shared question run as one forward of all their rows
    (decode.extend_rows), and every row still scores and generates as alone (fp32, 1e-5)."""
    from megatron_zaya.inference import decode

    torch.manual_seed(9)
    header = torch.randint(0, 500, (10,)).tolist()
    questions = [torch.randint(0, 500, (9,)).tolist() for _ in range(2)]
    answers = [[[11], [12], [13], [14]], [[21, 1], [22, 2], [23, 3]]]
    prompts = [header + question + answer for question, choices in zip(questions, answers) for answer in choices]
    calls = recorded_forwards(monkeypatch)
    greedy = decode.SamplingParams(greedy=True)
    together = decode.generate(tiny_model, prompts, 2, greedy, return_logprobs=True, top=2)
    prefill_calls = calls[:-1]                                 # the last call is the decode step of every row
    assert prefill_calls == [(1, 10), (1, 9), (4, 1), (1, 9), (3, 2)], calls
    plain = decode.generate(tiny_model, prompts, 2, greedy)    # the logits-only path batches the same way
    assert plain.tokens == together.tokens
    assert_rows_as_alone(tiny_model, prompts, together, 2)


def test_interleaved_prompts_are_regrouped_by_their_prefixes(tiny_model, monkeypatch):
    """Requests in an evaluation harness's order (sorted by length, so one question's answers interleave with
    another's): the prompts are filled in sorted order, each question's letter answers in one forward, and
    every row, put back in its own place, scores and generates as alone (fp32, 1e-5)."""
    from megatron_zaya.inference import decode

    torch.manual_seed(10)
    questions = [torch.randint(0, 500, (12,)).tolist() for _ in range(2)]
    prompts = [questions[i % 2] + [30 + i] for i in range(8)]          # q0 a0, q1 a1, q0 a2, q1 a3, ...
    calls = recorded_forwards(monkeypatch)
    together = decode.generate(tiny_model, prompts, 3, decode.SamplingParams(greedy=True), return_logprobs=True, top=2)
    assert calls[:4] == [(1, 12), (4, 1), (1, 12), (4, 1)], calls
    assert_rows_as_alone(tiny_model, prompts, together, 3)


def test_answers_of_one_length_around_a_longer_one_run_as_their_consecutive_runs(tiny_model, monkeypatch):
    """Answers " A", " B x", " C", " D" of one question: the one-token answers are not consecutive rows (the
    two-token one lies between them), so " A" runs alone and " C", " D" as one forward; a forward of rows that
    are not consecutive would fill another prompt's row. Every row scores and generates as alone (fp32, 1e-5)."""
    from megatron_zaya.inference import decode

    torch.manual_seed(11)
    question = torch.randint(0, 500, (12,)).tolist()
    prompts = [question + answer for answer in ([11], [12, 5], [13], [14])]
    calls = recorded_forwards(monkeypatch)
    together = decode.generate(tiny_model, prompts, 2, decode.SamplingParams(greedy=True), return_logprobs=True, top=2)
    prefill_calls = calls[:-1]                                 # the last call is the decode step of every row
    assert prefill_calls[0] == (1, 12) and sorted(prefill_calls[1:]) == [(1, 1), (1, 2), (2, 1)], calls
    assert_rows_as_alone(tiny_model, prompts, together, 2)
