"""inference.completions and inference.streaming without a model: the request checks at their boundaries,
Completer.cut (EOD, stop strings, a piece's leading space), what best_of ranks a sample on, the usage
counts, and a streamed first token's text at its place. The tokenizer is SentencePiece-like: each id is a
piece, and decode drops the leading space of the text's first piece, as SentencePiece does."""
from types import SimpleNamespace

import pytest

from megatron_zaya.data.tokenizer import build_tokenizer
from megatron_zaya.inference import completions
from megatron_zaya.inference.completions import Completer, mean_logprob, parse_completion_request
from megatron_zaya.inference.decode import GenerationOutput, TokenScores
from megatron_zaya.inference.server import MAX_PROMPTS, GenerationRequest, RequestError, TextGenerationService
from megatron_zaya.inference.streaming import ChoiceStream

EOD = 0
PIECES = {EOD: "", 1: " the", 2: " cat", 3: " sat", 4: "!", 5: " on"}


class PieceTokenizer:
    eod, vocab_size = EOD, len(PIECES)

    def decode(self, ids):
        return "".join(PIECES[i] for i in ids).removeprefix(" ")

    def encode(self, text):
        return [next(i for i, p in PIECES.items() if p and p.strip() == word) for word in text.split()]


def completer():
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64))
    return Completer(TextGenerationService(model, PieceTokenizer()))


def test_request_fields_at_their_bounds():
    """top_p must be > 0 (0 keeps no token); a request of exactly MAX_PROMPTS sequences and one of MAX_STOPS
    stop strings are allowed, one more of either is not."""
    with pytest.raises(RequestError, match=r"top_p must be a number in \(0, 1\]"):
        parse_completion_request({"prompt": "a", "top_p": 0})
    assert parse_completion_request({"prompt": "a", "top_p": 1e-6}).top_p == 1e-6
    assert len(parse_completion_request({"prompt": ["a"] * MAX_PROMPTS}).prompts) == MAX_PROMPTS
    assert parse_completion_request({"prompt": ["a"] * (MAX_PROMPTS // 2), "n": 2}).best_of == 2
    stops = [f"s{i}" for i in range(completions.MAX_STOPS)]
    assert parse_completion_request({"prompt": "a", "stop": stops}).stop == tuple(stops)


def test_cut_keeps_the_texts_leading_space_and_ends_at_eod_or_before_a_stop():
    """The completion's text is what it adds to the prompt's (" cat", not "cat"); EOD ends it and is not one of
    its tokens; a stop string drops the token whose text starts where the stop starts."""
    c = completer()
    assert c.cut([1], [2, 3], ()) == ([2, 3], " cat sat", "length")
    assert c.cut([1], [2, EOD, 3], ()) == ([2], " cat", "stop")
    assert c.cut([1], [2, 3, 4], (" sat",)) == ([2], " cat", "stop")
    assert c.cut([1], [2, 3, 4], ("t!", "xyz")) == ([2, 3], " cat sa", "stop")   # " sat" starts before "t!"


def test_best_of_ranks_a_sample_on_its_returned_tokens_and_the_eod_that_ended_it():
    """returned_logprobs: the log-probabilities of the kept tokens, plus the EOD's when the sample ended there
    (a stop string's cut tokens are not counted)."""
    c = completer()
    result = GenerationOutput(prompts=[[1], [1]], tokens=[[2, EOD], [2, 3, 4]],
                              scores=[TokenScores([-1.0, -3.0]), TokenScores([-1.0, -2.0, -5.0])])
    assert c.returned_logprobs(result, 0, [2]) == [-1.0, -3.0]
    assert c.returned_logprobs(result, 1, [2]) == [-1.0]
    assert mean_logprob([]) == 0.0


def test_usage_counts_every_sample_of_best_of_and_the_total(monkeypatch):
    """best_of 3, n 1: one choice per prompt, but the usage's completion tokens are those of all 3 samples,
    and total_tokens adds the prompt's."""
    samples = [[2, 3, 4], [2, 5], [3, 5, 1]]

    def generate(model, rows, max_tokens, sampling, **kwargs):
        assert len(rows) == 3
        return GenerationOutput(prompts=rows, tokens=[list(s) for s in samples],
                                prompt_scores=[TokenScores([]) for _ in rows],
                                scores=[TokenScores([-1.0] * len(s)) for s in samples])
    monkeypatch.setattr(completions, "generate", generate)
    answer = completer().respond(parse_completion_request({"prompt": "the", "best_of": 3, "max_tokens": 3}))
    assert len(answer["choices"]) == 1
    assert answer["usage"] == {"prompt_tokens": 1, "completion_tokens": 3 + 2 + 3, "total_tokens": 1 + 8}


def test_a_streamed_first_tokens_text_keeps_its_leading_space():
    """ChoiceStream scores a token at its place after the prompt: the first completion token's text in the
    logprobs is " cat" (what it adds to the prompt's text), as the unstreamed answer has it, not "cat"."""
    c = completer()
    choice = ChoiceStream(c, [1], 0, (), 0)
    chunks = choice.add(2, EOD, -0.5, None) + choice.add(3, EOD, -0.25, None) + choice.finish("length")
    assert "".join(ch["text"] for ch in chunks) == " cat sat"
    assert [t for ch in chunks for t in ch["logprobs"]["tokens"]] == [" cat", " sat"]
    assert [o for ch in chunks for o in ch["logprobs"]["text_offset"]] == [3, 7]


def test_generation_ends_once_every_row_has_met_eod_or_a_stop_string():
    """until_every_row_ends, generate's on_step for an unstreamed request: a row ends at EOD or when a stop
    string is in its text (across tokens too); generation ends when all have; None without stop strings."""
    c = completer()
    assert c.until_every_row_ends([[1]], ()) is None
    on_step = c.until_every_row_ends([[1], [1], [1]], (" sat", "t!"))
    assert on_step([2, 2, 2], None) is False                 # " cat" three times
    assert on_step([5, EOD, 3], None) is False               # " cat on"; EOD; " cat sat" has the stop
    assert on_step([3, None, 4], None) is True               # " cat on sat": all have ended (row 2 at step 2)
    on_step = c.until_every_row_ends([[1], [1]], ("t!",))
    assert on_step([2, 2], None) is False
    assert on_step([4, 5], None) is False                    # " cat!" has "t!"; " cat on" not
    assert on_step([None, 0], None) is True                  # row 1 at EOD


@pytest.mark.parametrize("prompt,error", [("1 x", r"prompt 0 cannot be tokenized with NullTokenizer \(invalid literal"),
                                          ("5 101", r"prompt 0: token ids \[101\] outside the tokenizer's vocabulary "
                                                    r"\[0, 101\)"),
                                          ("-1", r"token ids \[-1\] outside")])
def test_both_endpoints_refuse_prompts_the_tokenizer_cannot_encode_or_ids_past_its_vocabulary(prompt, error):
    """NullTokenizer (text = ids, vocabulary 0..100 with EOD 100): text that is not ids, and ids past the
    vocabulary (the model's padded rows, or past them), are the request's fault on /api and /v1/completions
    alike (RequestError, a 400; /api answered 500 for both and generated from an untrained padded row)."""
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64))
    service = TextGenerationService(model, build_tokenizer("NullTokenizer", "100"))
    assert service.prompt_ids(GenerationRequest(prompts=["3 100"], tokens_to_generate=1)) == [[3, 100]]
    with pytest.raises(RequestError, match=error):
        service.prompt_ids(GenerationRequest(prompts=[prompt], tokens_to_generate=1))
    with pytest.raises(RequestError, match=error):
        Completer(service).prompt_ids(parse_completion_request({"prompt": prompt}))
    with pytest.raises(RequestError, match=error.replace("prompt 0", "prompt 1")):      # the bad one of a batch
        service.prompt_ids(GenerationRequest(prompts=["3", prompt], tokens_to_generate=1))
    with pytest.raises(RequestError, match=error.replace("prompt 0", "prompt 1")):
        Completer(service).prompt_ids(parse_completion_request({"prompt": ["3", prompt]}))
