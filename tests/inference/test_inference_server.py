"""tools/run_text_generation_server.py: Megatron-LM's REST API over HTTP, checked against the full
forward of the same model (greedy tokens and every log-probability), plus its request checks."""
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

from megatron_zaya.data.tokenizer import build_tokenizer

from inference_helpers import hf_checkpoint, load_tool, one_cpu_thread, sp_model, tiny_model  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def server_url(hf_checkpoint, sp_model):
    service, server = load_tool("run_text_generation_server").prepare([
        "--load", str(hf_checkpoint), "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", sp_model,
        "--port", "0", "--quiet"])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def call(url, body, method="PUT", path="/api"):
    """(HTTP status, decoded JSON answer)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def reference_greedy(model, ids, new_tokens, vocab_limit, eod):
    """Greedy decoding by full forwards (no cache), and log p of every token after the first."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1, :vocab_limit]
            ids.append(int(torch.argmax(logits)))
            if ids[-1] == eod:
                break
        logits = model(torch.tensor([ids])).logits[0].double()
    logprobs = torch.log_softmax(logits, dim=-1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    return ids, logprobs.tolist()


def test_greedy_generation_and_logprobs_match_the_full_forward(server_url, tiny_model, sp_model):
    tok = build_tokenizer("GPTSentencePieceTokenizer", sp_model)
    prompts = ["the quick brown fox", "a"]
    status, answer = call(server_url, {"prompts": prompts, "tokens_to_generate": 6, "top_k": 1, "logprobs": True})
    assert status == 200, answer
    for i, text in enumerate(prompts):
        ids, logprobs = reference_greedy(tiny_model, tok.encode(text), 6, tok.vocab_size, tok.eod)
        assert answer["tokens"][i] == ids
        assert answer["logprobs"][i] == pytest.approx(logprobs, abs=1e-4)
        assert answer["text"][i] == tok.decode([t for t in ids if t != tok.eod])
        assert answer["text"][i].startswith(text)
        # each token's text where it stands (the prefixes' difference): they join to the text
        assert answer["segments"][i] == [tok.decode(ids[:k + 1])[len(tok.decode(ids[:k])):] for k in range(len(ids))]
        assert "".join(answer["segments"][i]) == tok.decode(ids)
    # tokens_to_generate 0 with logprobs scores the prompt alone (what evaluation harnesses send)
    status, scored = call(server_url, {"prompts": prompts[:1], "tokens_to_generate": 0, "logprobs": True})
    prompt_ids = tok.encode(prompts[0])
    assert status == 200 and scored["tokens"] == [prompt_ids]
    assert scored["logprobs"][0] == pytest.approx(answer["logprobs"][0][:len(prompt_ids) - 1], abs=1e-5)
    status, started = call(server_url, {"prompts": [""], "add_BOS": True, "tokens_to_generate": 3, "top_k": 1})
    assert status == 200 and started["logprobs"] is None          # as Megatron-LM: null when not asked for
    assert started["tokens"][0] == reference_greedy(tiny_model, [tok.bos], 3, tok.vocab_size,
                                                                      tok.eod)[0]


def test_sampling_is_reproducible_with_a_seed(server_url):
    body = {"prompts": ["the", "a b"], "tokens_to_generate": 8, "temperature": 0.9, "top_p": 0.9, "random_seed": 7}
    first, second = call(server_url, body), call(server_url, body)
    assert first[0] == 200 and first == second
    assert first[1]["logprobs"] is None
    other = call(server_url, {**body, "random_seed": 8})[1]
    assert other["tokens"] != first[1]["tokens"]


@pytest.mark.parametrize("body, status, message", [
    ({"tokens_to_generate": 4}, 400, "prompts argument required"),
    ({"prompts": "hello"}, 400, "prompts is not a list of strings"),
    ({"prompts": []}, 400, "prompts is empty"),
    ({"prompts": ["a"], "temperature": 0}, 400, "temperature must be a number in (0, 100], got 0"),
    ({"prompts": ["a"], "top_k": 5, "top_p": 0.5}, 400, "cannot set both top_k and top_p"),
    ({"prompts": ["a"], "tokens_to_generate": 0}, 400, "tokens_to_generate=0 implies logprobs"),
    ({"prompts": ["a"], "tokens_to_generate": True}, 400, "tokens_to_generate must be an integer >= 0, got true"),
    ({"prompts": ["a"], "beam_width": 2}, 400, "beam_width is not supported"),
    ({"prompts": ["a"], "max_len": 5}, 400, "max_len is no longer used: replace it with tokens_to_generate"),
    ({"prompts": ["a"], "temprature": 0.5}, 400, "unknown field(s) temprature"),
    ({"prompts": [""]}, 400, "Empty prompts require add_BOS=true"),
    ({"prompts": ["a", " \n"]}, 400, "prompts[1] has no tokens"),
    ({"prompts": ["a"], "random_seed": 2 ** 64}, 400, "random_seed must be an integer in [0, 2**64)"),
    ({"prompts": ["a"], "tokens_to_generate": 5000}, 400, "exceeds the model's max_position_embeddings"),
    (b"{not json", 400, "the body is not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, 400, "the body is not JSON: maximum recursion depth"),   # not a closed
    (b'{"prompts": [' + b"1" * 5000 + b"]}", 400, "the body is not JSON: Exceeds the limit"),   # connection
    ({"prompts": ["a", "b\ud800"]}, 400, "prompts[1] is not valid Unicode: surrogates not allowed at character 1"),
])
def test_bad_requests_get_400_naming_the_field(server_url, body, status, message):
    got_status, answer = call(server_url, body)
    assert got_status == status and message in answer, answer


def test_other_methods_and_paths(server_url):
    assert call(server_url, {"prompts": ["a"]}, path="/generate")[0] == 404
    request = urllib.request.Request(server_url + "/api", method="GET")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=30)
    assert err.value.code == 405
    status, answer = call(server_url, {"prompts": ["a"], "tokens_to_generate": 2}, method="POST")
    assert status == 200 and len(answer["tokens"][0]) >= 2
    for path, key in (("/v1/models", "data"), ("/health", "status")):     # GET: OpenAI's model list, health
        with urllib.request.urlopen(urllib.request.Request(server_url + path, method="GET"), timeout=30) as reply:
            assert key in json.loads(reply.read())
    with urllib.request.urlopen(server_url + "/v1/models", timeout=30) as reply:
        assert json.loads(reply.read())["data"][0]["object"] == "model"


@pytest.mark.parametrize("length", ["abc", "-1", "\u00b2"])
def test_a_content_length_that_is_no_byte_count_gets_400(server_url, length):
    """Not a dropped connection (abc) or a read that waits for the client to close (-1)."""
    host, port = server_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(f"PUT /api HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n{{}}".encode("latin-1"))
        answer = b""
        while chunk := conn.recv(4096):             # the server closes the connection after its answer
            answer += chunk
    answer = answer.decode()
    assert answer.startswith("HTTP/1.0 400") and "is not a byte count" in answer, answer


def test_a_chunked_body_gets_411_not_a_wrong_complaint_about_its_json(server_url):
    host, port = server_url.removeprefix("http://").split(":")
    body = json.dumps({"prompts": ["a"], "tokens_to_generate": 1}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(b"PUT /api HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    answer = answer.decode()
    assert answer.startswith("HTTP/1.0 411") and "Content-Length" in answer, answer


def test_a_streamed_request_whose_prompt_fails_to_tokenize_gets_an_answer(tiny_model):
    """An error before the stream's headers is a 500 like any request's, not a connection closed without one."""
    from megatron_zaya.inference.server import TextGenerationService, make_server

    class BrokenTokenizer:
        eod, bos, vocab_size = 0, None, 500

        def encode(self, text):
            raise RuntimeError("the tokenizer broke")
    server = make_server(TextGenerationService(tiny_model, BrokenTokenizer()), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        status, answer = call(f"http://127.0.0.1:{server.server_address[1]}", {"prompt": "a", "stream": True},
                              method="POST", path="/v1/completions")
    finally:
        server.shutdown()
        server.server_close()
    want = {"message": "RuntimeError: the tokenizer broke", "type": "server_error", "param": None, "code": None}
    assert status == 500 and answer == {"error": want}, (status, answer)


def test_flags_are_checked_before_the_checkpoint_loads(hf_checkpoint, sp_model, tmp_path, capsys):
    tool = load_tool("run_text_generation_server")
    base = ["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", sp_model, "--quiet"]
    with pytest.raises(SystemExit):
        tool.prepare(["--load", str(tmp_path / "missing"), *base, "--port", "0"])
    assert "--load:" in capsys.readouterr().err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(SystemExit):
            tool.prepare(["--load", str(hf_checkpoint), *base, "--port", str(busy.getsockname()[1])])
    assert "cannot listen" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tool.prepare(["--load", str(hf_checkpoint), *base, "--port", "70000"])
    assert "--port=70000 must be in [0, 65535]" in capsys.readouterr().err


def test_prompt_logprobs_do_not_depend_on_the_prefill_chunk(tiny_model):
    """Chunked prefill (chunk 3 over 10 tokens: boundaries inside the prompt) gives every prompt
    token's log-probability, equal to the full forward's."""
    from megatron_zaya.inference import generate
    prompt = torch.randint(0, 8000, (10,)).tolist()
    whole = generate(tiny_model, [prompt], 2, eod=None, return_logprobs=True)
    chunked = generate(tiny_model, [prompt], 2, eod=None, return_logprobs=True, prefill_chunk=3)
    _, expected = reference_greedy(tiny_model, prompt, 0, None, None)
    assert len(chunked.prompt_logprobs[0]) == 9 and len(chunked.logprobs[0]) == 2
    assert chunked.prompt_logprobs[0] == pytest.approx(expected, abs=1e-4)
    assert whole.prompt_logprobs[0] == pytest.approx(expected, abs=1e-4)


def test_the_script_serves_until_sigterm(hf_checkpoint, sp_model):
    """The entry script as users run it: it prints its address, answers, and stops cleanly on SIGTERM, also
    during a generation, which it stops and answers with 503 first (an interpreter that exits under a thread
    inside torch aborts, status 134), and with a client still sending its request a byte at a time (its
    reading side is shut: the exit waited for as long as it sent)."""
    import os
    import re
    import signal
    import subprocess
    import sys

    from inference_helpers import ROOT, trickle_request
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", "run_text_generation_server.py"),
                                "--load", str(hf_checkpoint), "--tokenizer-type", "GPTSentencePieceTokenizer",
                                "--tokenizer-model", sp_model, "--port", "0", "--threads", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    long_request, trickler = socket.socket(), socket.socket()
    try:
        line = process.stdout.readline()
        url = re.search(r"on (http://\S+)/api", line).group(1)
        status, answer = call(url, {"prompts": ["the"], "tokens_to_generate": 2, "top_k": 1})
        assert status == 200 and len(answer["tokens"][0]) >= 2
        assert '"tokens_to_generate": 2' in process.stderr.readline()     # the request log line (no --quiet)
        body = json.dumps({"prompts": ["the"] * 16, "tokens_to_generate": 3000, "top_k": 1}).encode()
        long_request.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        long_request.sendall(b"PUT /api HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        while (logged := process.stderr.readline()) and '"tokens_to_generate": 3000' not in logged:
            pass
        assert logged, "the long request was not logged"          # it is being generated
        # and a client that sends its request a byte at a time, which no --client-timeout ends
        trickler.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        trickle_request(trickler)
        time.sleep(0.5)
        stopped = time.monotonic()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
        assert time.monotonic() - stopped < 20, "the trickling client held the server's exit"
        assert long_request.recv(1 << 16).startswith(b"HTTP/1.0 503"), err       # stopped, and told so
    finally:
        process.kill()
        long_request.close()
        trickler.close()
    assert process.returncode == 0, err
    assert "server stopped" in out


# --- OpenAI completions (POST /v1/completions) -------------------------------------------------------


def full_forward_logprobs(model, ids):
    """float64 log-softmax of the full forward: row i is the distribution of token i + 1."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)


def test_completions_greedy_with_echo_and_top_logprobs_match_the_full_forward(server_url, tiny_model, sp_model):
    tok = build_tokenizer("GPTSentencePieceTokenizer", sp_model)
    prompt_ids = tok.encode("the quick brown fox")
    status, answer = call(server_url, {"prompt": [prompt_ids, tok.encode("a")], "max_tokens": 5, "temperature": 0,
                                       "logprobs": 2, "echo": True}, method="POST", path="/v1/completions")
    assert status == 200, answer
    assert answer["object"] == "text_completion" and len(answer["choices"]) == 2
    expected_ids, _ = reference_greedy(tiny_model, prompt_ids, 5, tok.vocab_size, tok.eod)
    choice = answer["choices"][0]
    new = expected_ids[len(prompt_ids):]
    kept = new[:new.index(tok.eod)] if tok.eod in new else new
    ids = prompt_ids + kept
    assert choice["finish_reason"] == ("stop" if tok.eod in new else "length")
    assert choice["text"] == tok.decode(prompt_ids) + tok.decode(ids)[len(tok.decode(prompt_ids)):]
    logprobs = choice["logprobs"]
    # each token's text as it stands in the text (a piece's leading space kept): the tokens join to the text
    texts = [tok.decode(ids[:k + 1])[len(tok.decode(ids[:k])):] for k in range(len(ids))]
    assert logprobs["tokens"] == texts and "".join(texts) == choice["text"]
    reference = full_forward_logprobs(tiny_model, ids)
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert logprobs["token_logprobs"][1:] == pytest.approx([reference[k - 1, ids[k]].item()
                                                            for k in range(1, len(ids))], abs=1e-4)
    for k in range(1, len(ids)):
        best = torch.topk(reference[k - 1, :tok.vocab_size], 2)     # among the tokenizer's ids
        want = {}       # by text at the place, the larger value of one text, then ids[k] (a prompt token) if not in
        for t, v in zip(best.indices.tolist() + [ids[k]], best.values.tolist() + [reference[k - 1, ids[k]].item()]):
            want.setdefault(tok.decode(ids[:k] + [t])[len(tok.decode(ids[:k])):], v)
        assert list(logprobs["top_logprobs"][k]) == list(want), k
        assert logprobs["top_logprobs"][k] == pytest.approx(want, abs=1e-4), k
    assert logprobs["text_offset"] == [len(tok.decode(ids[:k])) for k in range(len(ids))]
    assert answer["usage"]["prompt_tokens"] == len(prompt_ids) + len(tok.encode("a"))


def test_completions_score_a_prompt_and_stop_at_a_stop_string(server_url, tiny_model, sp_model):
    tok = build_tokenizer("GPTSentencePieceTokenizer", sp_model)
    ids = tok.encode("a b c d e")
    # max_tokens 0 with echo: the prompt scored alone, as an evaluation harness does
    status, scored = call(server_url, {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0},
                          method="POST", path="/v1/completions")
    assert status == 200 and scored["choices"][0]["logprobs"]["top_logprobs"] is None
    reference = full_forward_logprobs(tiny_model, ids)
    assert scored["choices"][0]["logprobs"]["token_logprobs"][1:] == pytest.approx(
        [reference[k - 1, ids[k]].item() for k in range(1, len(ids))], abs=1e-4)
    # a stop string taken from the greedy completion cuts the text before it
    body = {"prompt": "the", "max_tokens": 8, "temperature": 0}
    full = call(server_url, body, method="POST", path="/completions")[1]["choices"][0]
    text = full["text"]
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert len(text) > 4 and stop.strip(), text          # deterministic: the fixture's model and prompt
    cut = call(server_url, {**body, "stop": [stop, "never there"]}, method="POST", path="/v1/completions")
    assert cut[1]["choices"][0]["text"] == text[:text.find(stop)] and cut[1]["choices"][0]["finish_reason"] == "stop"


def test_completions_stop_decoding_once_every_choice_met_a_stop_string(server_url, monkeypatch):
    """An unstreamed request with a large max_tokens (as evaluation harnesses send their `until` strings) stops
    decoding when its stop string appears, as the streamed one does, with the same answer."""
    from megatron_zaya.inference import decode

    body = {"prompt": "the", "temperature": 0}
    text = call(server_url, {**body, "max_tokens": 3}, method="POST", path="/v1/completions")[1]["choices"][0]["text"]
    stop = text.strip()[:2]
    assert len(stop) == 2, text          # deterministic: the fixture's model and prompt
    seen = []
    real = decode._hidden_with_cache

    def counting(model, cache, tokens, *args, **kwargs):
        seen.append(tokens.numel())
        return real(model, cache, tokens, *args, **kwargs)
    monkeypatch.setattr(decode, "_hidden_with_cache", counting)
    status, answer = call(server_url, {**body, "max_tokens": 60, "stop": ["never there", stop]}, method="POST",
                          path="/v1/completions")
    assert status == 200, answer
    assert answer["choices"][0]["text"] == text[:text.find(stop)] and answer["choices"][0]["finish_reason"] == "stop"
    assert len(seen) <= 3, seen          # the prefill and at most 2 decode steps (the stop is in 3 tokens), not 60


def test_completions_n_samples_and_best_of_keeps_the_most_likely(server_url):
    """n: that many choices per prompt, prompt i's j-th at index i * n + j (greedy: n copies of the one
    completion; sampled: different ones). best_of: the n of best_of samples with the highest mean
    log-probability per generated token; with the same seed they are the samples n = best_of returns."""
    def choices(**fields):
        status, answer = call(server_url, {"prompt": ["the", "a quick"], "max_tokens": 6, "seed": 7, **fields},
                              method="POST", path="/v1/completions")
        assert status == 200, answer
        return answer["choices"]

    greedy = choices(temperature=0)
    copies = choices(temperature=0, n=3)
    assert [c["index"] for c in copies] == list(range(6))
    assert [c["text"] for c in copies] == [greedy[0]["text"]] * 3 + [greedy[1]["text"]] * 3
    sampled = choices(temperature=1.5, n=4, logprobs=0)
    assert len({c["text"] for c in sampled[:4]}) > 1 and len({c["text"] for c in sampled[4:]}) > 1
    # No sample stops at EOD, so its token_logprobs are every generated token's, as best_of ranks them.
    assert all(c["finish_reason"] == "length" for c in sampled)

    def mean(choice):
        values = choice["logprobs"]["token_logprobs"]
        return sum(values) / len(values)

    best = choices(temperature=1.5, n=2, best_of=4, logprobs=0)
    assert [c["index"] for c in best] == [0, 1, 2, 3]
    for prompt in range(2):
        ranked = sorted(sampled[4 * prompt:4 * prompt + 4], key=mean, reverse=True)
        assert [c["text"] for c in best[2 * prompt:2 * prompt + 2]] == [c["text"] for c in ranked[:2]], prompt
    # With stop strings best_of ranks on the tokens each sample returns (the same samples, cut): on every
    # token sampled, another sample won for some stop.
    differs = 0
    for stop in (["e"], ["a"], [" "], ["e", "a"], ["t"]):
        cut = choices(temperature=1.5, n=4, logprobs=0, stop=stop)
        best = choices(temperature=1.5, n=1, best_of=4, stop=stop)
        for prompt in range(2):
            samples = cut[4 * prompt:4 * prompt + 4]
            winner = max(samples, key=lambda c: mean(c) if c["logprobs"]["tokens"] else 0.0)
            assert best[prompt]["text"] == winner["text"], (stop, prompt)
            differs += winner["text"] != max(zip(sampled[4 * prompt:4 * prompt + 4], samples),
                                             key=lambda pair: mean(pair[0]))[1]["text"]
    assert differs


def stream(url, body):
    """(HTTP status, Content-Type, the JSON events before [DONE]) of a streamed completions request."""
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        raw = response.read().decode("utf-8")
        kind = response.headers.get("Content-Type")
    events = [block[len("data: "):] for block in raw.split("\n\n") if block]
    assert events[-1] == "[DONE]" and all(block.startswith("data: ") for block in raw.split("\n\n") if block)
    return response.status, kind, [json.loads(e) for e in events[:-1]]


def test_streamed_completions_join_to_the_unstreamed_answer(server_url, sp_model):
    """stream: true sends server-sent events as tokens are sampled; per choice, the chunks' texts, tokens and
    log-probabilities joined equal the unstreamed answer to the same request (seeded sampling, n 2, a stop
    string or none, logprobs 1), and the last chunk of each choice carries its finish_reason."""
    # sampled with a seed (the tiny random model's greedy text repeats one token); the text has characters
    # split over tokens (U+FFFD until complete), which the stream holds back
    plain = {"prompt": ["the", "a quick"], "max_tokens": 12, "temperature": 0.8, "seed": 3, "logprobs": 1, "n": 2}
    full = call(server_url, plain, method="POST", path="/v1/completions")[1]["choices"]
    text = full[0]["text"]
    # a stop string first met a few characters in (deterministic: the fixture's model and prompt)
    stop = next(text[i:i + 2] for i in range(3, len(text) - 1) if text.find(text[i:i + 2]) == i)
    for body in (plain, {**plain, "stop": [stop, "never there"]}):
        want = call(server_url, body, method="POST", path="/v1/completions")[1]["choices"]
        status, kind, events = stream(server_url, body)
        assert status == 200 and kind == "text/event-stream"
        assert all(e["object"] == "text_completion" and len(e["choices"]) == 1 for e in events)
        assert len({e["id"] for e in events}) == 1
        for choice in want:
            chunks = [e["choices"][0] for e in events if e["choices"][0]["index"] == choice["index"]]
            assert len(chunks) > 1 or "stop" in body                # streamed, not one answer at the end
            assert "".join(c["text"] for c in chunks) == choice["text"]
            assert [c["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + [choice["finish_reason"]]
            for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                joined = [x for c in chunks for x in c["logprobs"][field]]
                assert joined == pytest.approx(choice["logprobs"][field], abs=1e-5) if field == "token_logprobs" \
                    else joined == choice["logprobs"][field], (field, choice["index"])
        if "stop" in body:
            assert want[0]["finish_reason"] == "stop" and want[0]["text"] == text[:text.find(stop)] != ""
    # Checked before the stream starts: a plain 400
    status, answer = call(server_url, {**plain, "stream": True, "echo": True}, method="POST", path="/v1/completions")
    assert status == 400 and "echo is not supported with stream" in answer["error"]["message"]


@pytest.mark.parametrize("body, message", [
    ({"max_tokens": 4}, "prompt is required"),
    ({"prompt": []}, "prompt must be a string"),
    ({"prompt": "a", "n": 21}, "n must be an integer in [1, 20]"),
    ({"prompt": "a", "n": 3, "best_of": 2}, "best_of=2 must be >= n=3"),
    ({"prompt": "a", "stream": 1}, "stream must be a boolean"),
    ({"prompt": "a", "stream": True, "n": 2, "best_of": 3}, "best_of > n is not supported with stream"),
    ({"prompt": "a", "max_tokens": 0}, "max_tokens=0 returns nothing unless echo=true"),
    ({"prompt": "a", "logprobs": 50}, "logprobs must be null or an integer in [0, 20]"),
    ({"prompt": [1, 600]}, "token ids [600] outside the tokenizer's vocabulary [0, 500)"),
    ({"prompt": "a", "stop": ["x"] * 17}, "stop must be a non-empty string or a list of up to 16"),
    ({"prompt": "a", "stop": [""]}, "stop must be a non-empty string"),
    ({"prompt": "a", "best_of": 21}, "best_of must be null or an integer in [1, 20]"),
    ({"prompt": "a", "seed": 2 ** 70}, "seed must be null or an integer in [0, 2**64)"),
    ({"prompt": "a", "seed": 2 ** 70, "stream": True}, "seed must be null or an integer in [0, 2**64)"),
    ({"prompt": "a\ud800"}, "prompt[0] is not valid Unicode"),
    ({"prompt": "a\ud800", "stream": True}, "prompt[0] is not valid Unicode"),       # a 400, not a closed connection
    ({"prompt": ["a"] * 9, "n": 16}, "9 prompt(s) x n=16 = 144 sequences; at most 128 per request"),
    ({"prompt": ["a"] * 7, "n": 2, "best_of": 20}, "7 prompt(s) x best_of=20 = 140 sequences"),
    ({"prompt": ["a"] * 129}, "129 prompt(s) x n=1 = 129 sequences"),
])
def test_bad_completion_requests_get_400(server_url, body, message):
    """As OpenAI answers them: {"error": {"message", "type", "param", "code"}}, which OpenAI clients read."""
    status, answer = call(server_url, body, method="POST", path="/v1/completions")
    assert status == 400 and message in answer["error"]["message"], answer
    assert answer["error"]["type"] == "invalid_request_error"


def test_null_fields_of_a_completion_request_mean_their_defaults(server_url):
    """OpenAI types max_tokens, temperature, top_p, n, echo, stream, stop, ... as nullable (its SDK sends the
    None a caller passes): the answer is that of the request without them (with a seed, sampled alike)."""
    nulls = dict.fromkeys(("max_tokens", "temperature", "top_p", "n", "best_of", "echo", "stream", "stop",
                           "logprobs", "suffix", "logit_bias", "presence_penalty", "frequency_penalty", "user"))
    answers = [call(server_url, {"prompt": "the", "seed": 3, **extra}, method="POST", path="/v1/completions")
               for extra in ({}, nulls)]
    assert [status for status, _ in answers] == [200, 200], answers
    assert answers[0][1]["choices"] == answers[1][1]["choices"] and answers[0][1]["usage"]["completion_tokens"] == 16


def test_a_loglikelihood_request_as_evaluation_harnesses_send_it(server_url, tiny_model, sp_model):
    """lm-evaluation-harness's local-completions loglikelihood payload: context + continuation as
    token ids, echo, max_tokens 1, logprobs 1; the continuation's log-likelihood is the sum of
    token_logprobs[len(context):-1], and greediness compares each token with its top-1."""
    tok = build_tokenizer("GPTSentencePieceTokenizer", sp_model)
    context, continuation = tok.encode("the quick brown"), tok.encode(" fox jumps")
    body = {"model": "zaya", "prompt": [context + continuation], "temperature": 0, "max_tokens": 1, "logprobs": 1,
            "seed": 1234, "echo": True}
    status, answer = call(server_url, body, method="POST", path="/v1/completions")
    assert status == 200, answer
    logprobs = answer["choices"][0]["logprobs"]
    got = sum(logprobs["token_logprobs"][len(context):-1])
    ids = context + continuation
    reference = full_forward_logprobs(tiny_model, ids)
    want = sum(reference[k - 1, ids[k]].item() for k in range(len(context), len(ids)))
    assert got == pytest.approx(want, abs=1e-4)
    # the harness's greediness: the top entry's text against the token's; the token is always in its entry
    # (OpenAI's logprobs + 1 at most)
    for k, token, top in zip(range(len(context), len(ids)), logprobs["tokens"][len(context):-1],
                             logprobs["top_logprobs"][len(context):-1]):
        assert token in top and len(top) <= 2
        greedy = int(reference[k - 1, :tok.vocab_size].argmax()) == ids[k]
        assert (max(top, key=top.get) == token) == greedy and (len(top) == 1) == greedy, k


def test_the_command_line_client_prints_the_servers_answers(server_url, capsys, monkeypatch):
    """tools/text_generation_cli.py (Megatron-LM's client): prompts from standard input, one PUT /api each,
    the greedy text printed; a refused request prints the server's message and the next prompt is read;
    the length is asked for each prompt without --tokens-to-generate; an unreachable server ends with 1."""
    import io

    cli = load_tool("text_generation_cli")
    assert cli.api_url("localhost:5000") == "http://localhost:5000/api"
    assert cli.api_url("http://host:1/api/") == "http://host:1/api"
    status, expected = call(server_url, {"prompts": ["The king"], "tokens_to_generate": 6, "top_k": 1})
    assert status == 200
    monkeypatch.setattr("sys.stdin", io.StringIO("The king\n"))
    assert cli.main([server_url, "--tokens-to-generate", "6", "--top-k", "1"]) == 0
    assert capsys.readouterr().out == expected["text"][0] + "\n"
    monkeypatch.setattr("sys.stdin", io.StringIO("The king\n5000\nThe king\nmany\nThe king\n5000\n"))
    assert cli.main([server_url, "--top-k", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("error 400") == 2 and "max_position_embeddings" in captured.err
    assert "not a number of tokens: 'many'" in captured.err
    # a flag the server refuses in every request: one usage error (the server's own checks, request_fields.FIELD_CHECKS)
    for flags, message in ((["--temperature", "-1"], "--temperature=-1.0: the server takes a number in (0, 100]"),
                           (["--top-k", "2000"], "--top-k=2000: the server takes an integer in [0, 1000]"),
                           (["--top-p", "1.5"], "--top-p=1.5: the server takes a number in [0, 1]"),
                           (["--random-seed", "-5"], "--random-seed=-5: the server takes an integer in [0, 2**64)"),
                           (["--top-k", "2", "--top-p", "0.5"], "--top-k and --top-p")):
        with pytest.raises(SystemExit) as stopped:        # refused before any prompt is read
            cli.main([server_url] + flags)
        assert stopped.value.code == 2 and message in capsys.readouterr().err
    # a malformed address: said once, before any prompt (a traceback, or every prompt "refused" and exit 0)
    for address, message in (("localhost:abc", "Port could not be cast"), ("http://[bad", "Invalid IPv6 URL"),
                             ("ftp://host:1", "expected host:port or an http(s):// URL")):
        with pytest.raises(SystemExit) as stopped:
            cli.main([address, "--tokens-to-generate", "4"])
        assert stopped.value.code == 2 and f"address {address!r}: {message}" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("The king\n"))
    assert cli.main(["127.0.0.1:1", "--tokens-to-generate", "4"]) == 1
    assert "cannot reach http://127.0.0.1:1/api" in capsys.readouterr().err


def test_completions_score_with_the_generation_itself(server_url, sp_model, monkeypatch):
    """The log-probabilities come from the generation's own forwards: a scoring request (max_tokens 0,
    echo) runs each prompt once through the model, and max_tokens 2 adds one decode step, no second pass."""
    from megatron_zaya.inference import decode

    tok = build_tokenizer("GPTSentencePieceTokenizer", sp_model)
    prompt = tok.encode("the quick brown fox")
    seen = []
    real = decode._hidden_with_cache       # every forward of the model over cached rows goes through it

    def counting(model, cache, tokens, *args, **kwargs):
        seen.append(tokens.numel())
        return real(model, cache, tokens, *args, **kwargs)
    monkeypatch.setattr(decode, "_hidden_with_cache", counting)
    for max_tokens, expected in ((0, [len(prompt)]), (2, [len(prompt), 1])):
        seen.clear()
        status, answer = call(server_url, {"prompt": [prompt], "max_tokens": max_tokens, "echo": True, "logprobs": 2,
                                           "temperature": 0}, method="POST", path="/v1/completions")
        assert status == 200, answer
        assert seen == expected
        logprobs = answer["choices"][0]["logprobs"]
        assert len(logprobs["token_logprobs"]) == len(prompt) + max_tokens
        assert all(token in top and len(top) in (2, 3) for token, top in zip(logprobs["tokens"][1:],
                                                                             logprobs["top_logprobs"][1:]))
    seen.clear()      # echo alone: nothing to generate or score, no forward
    status, answer = call(server_url, {"prompt": [prompt], "max_tokens": 0, "echo": True}, method="POST",
                          path="/v1/completions")
    assert status == 200 and seen == [] and answer["choices"][0]["logprobs"] is None


def test_api_text_leaves_out_the_eod_that_ended_the_generation(tiny_model):
    """A stub tokenizer whose text shows every id (so an EOD would show) and whose EOD is the greedy next
    token of the prompt (reference: a full forward's argmax): the generation stops there, "tokens" ends
    with it, "text" is the decoded ids without it."""
    from megatron_zaya.inference.server import GenerationRequest, TextGenerationService

    prompt = [5, 9, 100, 7]
    with torch.no_grad():
        first = int(tiny_model(torch.tensor([prompt])).logits[0, -1].argmax())

    class IdTokenizer:
        eod, bos, vocab_size = first, None, tiny_model.config.vocab_size

        def encode(self, text):
            return [int(t) for t in text.split()]

        def decode(self, ids):
            return " ".join(f"<{t}>" for t in ids)
    answer = TextGenerationService(tiny_model, IdTokenizer()).respond(
        GenerationRequest(["5 9 100 7"], tokens_to_generate=4, top_k=1))
    assert answer["tokens"] == [prompt + [first]]
    assert answer["text"] == ["<5> <9> <100> <7>"]
