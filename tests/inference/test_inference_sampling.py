"""Sampling: greedy, temperature, top-k, top-p, vocabulary limit, seeded reproducibility."""
import pytest
import torch

from megatron_zaya.inference.sampling import SamplingParams, filter_logits, make_generator, sample_next_token

from inference_helpers import one_cpu_thread  # noqa: F401 (fixture)


def test_greedy_is_argmax_and_respects_vocab_limit():
    logits = torch.tensor([[0.0, 3.0, 1.0, 9.0], [5.0, 1.0, 2.0, 0.0]])
    assert sample_next_token(logits, SamplingParams(greedy=True)).tolist() == [3, 0]
    assert sample_next_token(logits, SamplingParams(temperature=0)).tolist() == [3, 0]
    assert sample_next_token(logits, SamplingParams(greedy=True), vocab_limit=3).tolist() == [1, 0]
    for _ in range(20):  # padded rows are never sampled either
        assert sample_next_token(logits, SamplingParams(), make_generator(_), vocab_limit=3)[0] != 3


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.5, 0.3]])
    kept = torch.isfinite(filter_logits(logits, SamplingParams(top_k=2)))[0]
    assert kept.tolist() == [False, True, False, True, False]
    gen = make_generator(0)
    draws = sample_next_token(logits.expand(4000, -1), SamplingParams(top_k=2), gen)
    assert set(draws.tolist()) == {1, 3}
    # Renormalised over the two kept tokens.
    expected = torch.softmax(torch.tensor([2.0, 1.5]), 0)[0].item()
    assert (draws == 1).float().mean().item() == pytest.approx(expected, abs=0.03)
    assert sample_next_token(logits, SamplingParams(top_k=1), gen).item() == 1


@pytest.mark.parametrize("top_p,kept", [(0.4, [0]), (0.75, [0, 1]), (0.85, [0, 1, 2]), (1.0, [0, 1, 2, 3])])
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, kept):
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    perm = [2, 0, 3, 1]                      # position j holds token perm[j]'s logit
    filtered = filter_logits(probs.log()[perm][None], SamplingParams(top_p=top_p))[0]
    kept_ids = sorted(perm[j] for j in torch.nonzero(torch.isfinite(filtered)).flatten().tolist())
    assert kept_ids == kept


def test_top_p_sampling_frequencies():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    draws = sample_next_token(probs.log().expand(6000, -1), SamplingParams(top_p=0.75), make_generator(1))
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    torch.testing.assert_close(freq, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.03, rtol=0)


def test_temperature_sharpens_and_flattens():
    logits = torch.tensor([[1.0, 0.0]])
    for t, expected in [(0.5, torch.sigmoid(torch.tensor(2.0))), (2.0, torch.sigmoid(torch.tensor(0.5)))]:
        draws = sample_next_token(logits.expand(6000, -1), SamplingParams(temperature=t), make_generator(2))
        assert (draws == 0).float().mean().item() == pytest.approx(expected.item(), abs=0.03)


def test_seeded_sampling_is_reproducible():
    logits = torch.randn(8, 100)
    params = SamplingParams(temperature=1.3, top_k=50, top_p=0.95)
    a = sample_next_token(logits, params, make_generator(7))
    b = sample_next_token(logits, params, make_generator(7))
    c = [sample_next_token(logits, params, make_generator(s)) for s in range(8, 12)]
    assert torch.equal(a, b)
    assert any(not torch.equal(a, x) for x in c)


@pytest.mark.parametrize("kwargs,flag", [(dict(temperature=-1), "--temperature"), (dict(top_k=-2), "--top-k"),
                                         (dict(top_p=0.0), "--top-p"), (dict(top_p=1.5), "--top-p"),
                                         (dict(temperature=float("nan")), "--temperature"),
                                         (dict(temperature=float("inf")), "--temperature"),
                                         (dict(top_p=float("nan")), "--top-p")])
def test_invalid_parameters_name_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        SamplingParams(**kwargs)


def test_top_k_1_is_greedy_and_ties_go_to_the_lowest_id():
    """top-k 1 is greedy, as the docs say: tied top logits (common in bf16) do not make it random."""
    logits = torch.tensor([[0.0, 5.0, 1.0, 5.0]])
    assert SamplingParams(top_k=1).is_greedy
    assert {int(sample_next_token(logits, SamplingParams(top_k=1), make_generator(s))) for s in range(20)} == {1}


@pytest.mark.parametrize("temperature", [1e-6, 1e-45, 1e-300])
def test_a_tiny_temperature_samples_the_top_tokens_without_overflow(temperature):
    """(logits - max) / T in float64: no inf - inf or 0 / 0 however small T is (float32's smallest number
    is 1.4e-45); only the tied top tokens stay possible, and the padded rows never."""
    logits = torch.tensor([[1.0, 5.0, 5.0, -2.0, 9.0]])
    drawn = {int(sample_next_token(logits, SamplingParams(temperature=temperature), make_generator(s), vocab_limit=4))
             for s in range(40)}
    assert drawn == {1, 2}


def test_seeds_outside_the_generators_range_are_refused_by_name():
    from megatron_zaya.inference.sampling import check_seed
    assert check_seed(2 ** 64 - 1) == 2 ** 64 - 1
    for bad in (2 ** 64, -1, 1.5, True):
        with pytest.raises(ValueError, match="--seed"):
            check_seed(bad)


def test_top_p_stops_at_the_token_that_reaches_p_exactly():
    """Probabilities that are exact binary fractions (no rounding in the cumulative sum): with top_p 0.5 the
    first token alone reaches p, so only it is kept (reference: the definition, smallest set reaching p)."""
    logits = torch.tensor([[0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.5, 0.5, 2.0 ** -30]]).log()
    kept = torch.isfinite(filter_logits(logits, SamplingParams(top_p=0.5))).tolist()
    assert kept == [[True, False, False], [False, True, False], [True, False, False]]
    kept = torch.isfinite(filter_logits(logits[:1], SamplingParams(top_p=0.75))).tolist()
    assert kept == [[True, True, False]]
