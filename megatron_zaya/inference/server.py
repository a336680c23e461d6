"""Megatron-LM's text generation REST API over `generate` (behind tools/run_text_generation_server.py),
and the OpenAI completions API at /v1/completions (and Megatron-LM's /completions): inference/completions.py.

PUT (or POST) /api with a JSON body

    {"prompts": ["Once upon a time"], "tokens_to_generate": 64, "logprobs": false,
     "temperature": 1.0, "top_k": 0, "top_p": 0.0, "add_BOS": false, "random_seed": -1, "no_log": false}

answers, as Megatron-LM's server does,

    {"text": [prompt + generated text], "tokens": [prompt ids + generated ids],
     "segments": [[the text of each token]], "logprobs": [[log p of every token after the first]]}

("logprobs" only when asked: the model's log-probabilities over its whole vocabulary, before
temperature, top-k or top-p, as the training loss counts them; tokens_to_generate 0 with logprobs
scores the prompts alone, which is how evaluation harnesses use this API). Megatron-LM's
conventions: top_k 0 and top_p 0.0 are off, and only one of them may be set; top_k 1 is greedy;
generation stops at the tokenizer's EOD. A bad field gets HTTP 400 and a message that names it;
Megatron-LM's beam search and end-of-line stops are refused by name. Requests are served one at a
time (a lock around the model), as in Megatron-LM.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import socket
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from megatron_zaya.inference.decode import generate
from megatron_zaya.inference.request_fields import FIELD_CHECKS
from megatron_zaya.inference.sampling import SamplingParams
from megatron_zaya.inference.text_offsets import token_texts

MAX_PROMPTS = 128                # as Megatron-LM
OPENAI_PATHS = ("/v1/completions", "/completions")
MAX_BODY_BYTES = 64 << 20
CLIENT_TIMEOUT = 60.0            # seconds a connection may block a read or a write (a client that stops reading)
CLIENT_CHECK_STEPS = 4           # decode steps between two checks that the client waiting for an answer is there
# Megatron-LM fields this server does not implement: accepted only at their "off" value.
UNSUPPORTED = {"beam_width": None, "stop_on_eol": False, "stop_on_double_eol": False,
               "prevent_newline_after_colon": False, "top_p_decay": 0.0, "top_p_bound": 0.0, "top_n_logprobs": 0}
RENAMED = {"max_len": "tokens_to_generate", "sentences": "prompts"}
KNOWN = {"prompts", "tokens_to_generate", "logprobs", "temperature", "top_k", "top_p", "add_BOS", "random_seed",
         "no_log", "stop_token", "length_penalty", *UNSUPPORTED}


class RequestError(ValueError):
    """A bad request: answered with HTTP 400 and this message."""


class ClientClosed(Exception):
    """Raised from a generation's on_step: the client closed its connection, nobody waits for the answer."""


class ServerStopping(Exception):
    """Raised from a generation's on_step: the server is stopping (TextGenerationService.stop)."""


@dataclass
class GenerationRequest:
    prompts: list[str]
    tokens_to_generate: int = 64
    logprobs: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    add_bos: bool = False
    random_seed: int = -1            # -1: a fresh seed per request
    no_log: bool = False


def apply_checked_fields(body: dict, request, checks: dict) -> None:
    """Each field of `checks` ({name: (valid, what it must be)}) present in `body` is validated
    (RequestError naming it) and set on `request` where it has an attribute of that (lower-case) name."""
    for field, (valid, what) in checks.items():
        if field in body:
            if not valid(body[field]):
                raise RequestError(f"{field} must be {what}, got {json.dumps(body[field])}")
            if hasattr(request, field.lower()):
                setattr(request, field.lower(), body[field])


def check_length(config, index: int, prompt: list[int], new_tokens: int, field: str) -> None:
    """Prompt + new tokens within the model's positions (RequestError naming the request's field)."""
    if len(prompt) + new_tokens > config.max_position_embeddings:
        raise RequestError(f"prompt {index}: {len(prompt)} tokens + {field} {new_tokens} exceeds the model's "
                           f"max_position_embeddings {config.max_position_embeddings}")


def encode_prompt(tokenizer, index: int, text: str) -> list[int]:
    """The prompt's token ids (RequestError where the tokenizer cannot encode it: NullTokenizer on text that is
    not integers)."""
    try:
        return tokenizer.encode(text)
    except ValueError as e:
        raise RequestError(f"prompt {index} cannot be tokenized with {type(tokenizer).__name__} ({e})") from None


def check_vocabulary(tokenizer, index: int, ids: list[int]) -> None:
    """Every id within the tokenizer's vocabulary (RequestError naming the first few that are not: the padded
    embedding rows beyond it were never trained, and ids past those would fail inside the model)."""
    bad = [t for t in ids if not 0 <= t < tokenizer.vocab_size]
    if bad:
        raise RequestError(f"prompt {index}: token ids {bad[:5]} outside the tokenizer's vocabulary "
                           f"[0, {tokenizer.vocab_size})")


def request_seed(seed: int | None) -> int:
    """The request's seed, or a fresh one (None or negative)."""
    return seed if seed is not None and seed >= 0 else int.from_bytes(os.urandom(4), "little")


def parse_request(body) -> GenerationRequest:
    """The request of a JSON body, every field checked (RequestError names the first bad one)."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object, e.g. {\"prompts\": [\"Hello\"], \"tokens_to_generate\": 16}")
    for old, new in RENAMED.items():
        if old in body:
            raise RequestError(f"{old} is no longer used: replace it with {new}")
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise RequestError(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(KNOWN))}")
    for field, off in UNSUPPORTED.items():
        if field in body and body[field] != off:
            raise RequestError(f"{field} is not supported by this server (only {json.dumps(off)})")
    if "prompts" not in body:
        raise RequestError("prompts argument required")
    prompts = body["prompts"]
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise RequestError("prompts is not a list of strings")
    if not prompts:
        raise RequestError("prompts is empty")
    if len(prompts) > MAX_PROMPTS:
        raise RequestError(f"Maximum number of prompts is {MAX_PROMPTS}")
    check_unicode(prompts, "prompts")
    request = GenerationRequest(prompts)
    apply_checked_fields(body, request, FIELD_CHECKS)      # stop_token, length_penalty: beam search's, unused
    if request.top_k > 0 and request.top_p > 0.0:
        raise RequestError("cannot set both top_k and top_p")
    if request.tokens_to_generate == 0 and not request.logprobs:
        raise RequestError("tokens_to_generate=0 implies logprobs should be true")
    if any(p == "" for p in request.prompts) and not request.add_bos:
        raise RequestError("Empty prompts require add_BOS=true")
    return request


def check_unicode(texts: list, field: str) -> None:
    """RequestError for a text JSON can carry but no tokenizer can read: a lone UTF-16 surrogate ("\\ud800")."""
    for i, text in enumerate(texts):
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as err:
                raise RequestError(f"{field}[{i}] is not valid Unicode: {err.reason} at character {err.start}") from None


class TextGenerationService:
    """Tokenizes a request's prompts, generates under a lock, and builds Megatron-LM's response."""

    def __init__(self, model, tokenizer, log=None, name: str = "zaya"):
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.log = log or (lambda message: None)

    def stop(self) -> None:
        """The generation under way ends at its next decode step (a prefill runs to its end) and none starts
        after this: ServerStopping. A server calls it before it joins its handler threads, when it stops."""
        self.stopping.set()

    @contextlib.contextmanager
    def generating(self):
        """The model's lock, held for one generation (ServerStopping once stop() was called)."""
        with self.lock:
            if self.stopping.is_set():
                raise ServerStopping("the server is stopping")
            yield

    def prompt_ids(self, request: GenerationRequest) -> list[list[int]]:
        config = self.model.config
        prompts = []
        for i, text in enumerate(request.prompts):
            ids = encode_prompt(self.tokenizer, i, text)
            check_vocabulary(self.tokenizer, i, ids)
            if request.add_bos:
                if self.tokenizer.bos is None:
                    raise RequestError("add_BOS: the tokenizer has no BOS token")
                ids = [self.tokenizer.bos] + ids
            if not ids:
                raise RequestError(f"prompts[{i}] has no tokens (its text encodes to none); add_BOS=true gives it one")
            check_length(config, i, ids, request.tokens_to_generate, "tokens_to_generate")
            prompts.append(ids)
        return prompts

    def stoppable(self, on_step=None, client_closed=None):
        """An on_step for `generate`: raises ServerStopping once stop() is called, and ClientClosed when
        client_closed() (asked every CLIENT_CHECK_STEPS steps) says the client has left, either of which ends
        the generation; otherwise `on_step`'s answer."""
        steps = itertools.count(1)

        def checked(tokens, scores) -> bool:
            if self.stopping.is_set():
                raise ServerStopping("the server is stopping")
            if client_closed is not None and next(steps) % CLIENT_CHECK_STEPS == 0 and client_closed():
                raise ClientClosed("the client closed its connection")
            return bool(on_step is not None and on_step(tokens, scores))
        return checked

    def respond(self, request: GenerationRequest, client_closed=None) -> dict:
        """Megatron-LM's answer to `request`; `client_closed()`: whether its client has left (ClientClosed)."""
        prompts = self.prompt_ids(request)
        sampling = SamplingParams(temperature=request.temperature, top_k=request.top_k,
                                  top_p=request.top_p if request.top_p > 0 else 1.0)
        seed = request_seed(request.random_seed)
        eod = self.tokenizer.eod
        with self.generating():
            if not request.no_log:
                self.log(json.dumps({"prompts": len(prompts), "tokens_to_generate": request.tokens_to_generate,
                                     "logprobs": request.logprobs, "seed": seed}))
            result = generate(self.model, prompts, request.tokens_to_generate, sampling, eod=eod, seed=seed,
                              vocab_limit=self.tokenizer.vocab_size, return_logprobs=request.logprobs,
                              on_step=self.stoppable(client_closed=client_closed))
        tokens = [prompt + new for prompt, new in zip(result.prompts, result.tokens)]
        decode = self.tokenizer.decode

        def segments(ids: list[int]) -> list[str]:
            """Each token's text where it stands (a piece's leading space kept; a character split over byte
            tokens the last one's), EOD's '': they join to the sequence's text."""
            texts = iter(token_texts(decode, [t for t in ids if t != eod]))
            return ["" if t == eod else next(texts) for t in ids]

        return {      # (Megatron-LM sends logprobs null when not asked for)
            "text": [decode([t for t in ids if t != eod]) for ids in tokens],
            "tokens": tokens,
            "segments": [segments(ids) for ids in tokens],
            "logprobs": [p + g for p, g in zip(result.prompt_logprobs, result.logprobs)] if request.logprobs else None,
        }


def make_server(service: TextGenerationService, host: str, port: int,
                client_timeout: float = CLIENT_TIMEOUT) -> GenerationServer:
    """An HTTP server answering PUT/POST /api with `service` (port 0: any free port). A read from or a write to
    a client that blocks for `client_timeout` seconds drops the connection: a streaming client that stops
    reading would otherwise hold the model's lock, and every other request wait, for as long as it stays.
    Its handler threads are not daemons: server_close() waits for them, as an interpreter that exits under a
    thread inside torch aborts ("terminate called without an active exception", exit status 134); call
    server.stop_requests() first (the generation under way ends at its next step, reads end at once)."""

    class Handler(BaseHTTPRequestHandler):
        timeout = client_timeout        # socketserver sets it on each connection

        def setup(self):
            super().setup()
            self.server.register(self.connection)

        def finish(self):
            try:
                super().finish()
            finally:
                self.server.unregister(self.connection)

        def reply(self, status: int, payload) -> None:
            """`payload` as JSON; an error (a status of 400 or more: its message) in the form of the endpoint's API:
            Megatron-LM's /api sends the message itself, the OpenAI endpoints {"error": {"message", "type", ...}}
            (what OpenAI clients read an error from)."""
            if status >= 400 and self.path.split("?")[0].rstrip("/") in OPENAI_PATHS:
                payload = {"error": {"message": payload, "type": "invalid_request_error" if status < 500 else
                                     "server_error", "param": None, "code": None}}
            body = json.dumps(payload).encode("utf-8")
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError as err:        # BrokenPipeError, ConnectionResetError, TimeoutError: nobody reads it
                service.log(f"{self.address_string()}: the client closed before its answer ({type(err).__name__})")

        def client_closed(self) -> bool:
            """Whether the client has closed (or reset) its connection: readable, with nothing left to read.
            Bytes it sent after its request stay unread. (A client that half-closes its side after sending
            its request counts as gone.)"""
            try:      # poll, not select, which refuses a descriptor above 1023 (a busy server's can be); not
                poller = select.poll()        # a non-blocking recv either: under the socket's timeout it waits
                poller.register(self.connection, select.POLLIN)
                return bool(poller.poll(0)) and self.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

        def do_PUT(self):
            from megatron_zaya.inference.completions import complete      # it imports this module
            endpoints = {"/api": lambda body: service.respond(parse_request(body), self.client_closed),
                         "/v1/completions": lambda body: complete(service, body, self.client_closed),
                         "/completions": lambda body: complete(service, body, self.client_closed)}
            endpoint = endpoints.get(self.path.split("?")[0].rstrip("/"))
            if endpoint is None:
                return self.reply(404, f"no endpoint {self.path}: use PUT /api or POST /v1/completions")
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                return self.reply(411, "send the body with a Content-Length (chunked bodies are not supported)")
            length = (self.headers.get("Content-Length") or "0").strip()
            if not (length.isascii() and length.isdigit()):      # a negative length would read until the client closes
                return self.reply(400, f"Content-Length {length!r} is not a byte count")
            size = int(length)
            if size > MAX_BODY_BYTES:
                return self.reply(413, f"the body has {size} bytes, more than {MAX_BODY_BYTES}")
            try:
                body = json.loads(self.rfile.read(size) or b"null")
            except (ValueError, RecursionError) as err:   # (a JSONDecodeError, bad UTF-8, a 5,000-digit integer,
                return self.reply(400, f"the body is not JSON: {err}")     # arrays nested 100,000 deep)
            if self.path.split("?")[0].rstrip("/") != "/api" and isinstance(body, dict) and body.get("stream") is True:
                return self.stream(body)
            try:
                answer = endpoint(body)
            except RequestError as err:
                return self.reply(400, str(err))
            except ClientClosed:          # the generation stopped a few steps after the client left
                return service.log(f"{self.address_string()}: client closed its connection: generation stopped")
            except ServerStopping as err:
                return self.reply(503, str(err))
            except Exception as err:      # a failed generation must not take the server down
                service.log(f"error: {type(err).__name__}: {err}")
                return self.reply(500, f"{type(err).__name__}: {err}")
            self.reply(200, answer)

        do_POST = do_PUT

        def stream(self, body) -> None:
            """A streamed completions request: 400 for a bad body, else server-sent events until [DONE] (or an
            error event); the connection closes at the end (HTTP/1.0), which ends the stream for the client."""
            from megatron_zaya.inference.completions import Completer, parse_completion_request
            from megatron_zaya.inference.streaming import stream_completion
            try:                          # every check before the headers: a bad request is a plain 400
                request = parse_completion_request(body)
                completer = Completer(service)
                prompts = completer.prompt_ids(request)
            except RequestError as err:
                return self.reply(400, str(err))
            except Exception as err:      # as a request without stream: an answer, not a closed connection
                service.log(f"error: {type(err).__name__}: {err}")
                return self.reply(500, f"{type(err).__name__}: {err}")
            service.log(json.dumps({"completions": len(prompts), "max_tokens": request.max_tokens, "stream": True}))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()

            def send(event) -> None:
                self.wfile.write(b"data: " + json.dumps(event).encode("utf-8") + b"\n\n")
                self.wfile.flush()
            try:
                try:
                    stream_completion(completer, request, prompts, send)
                except OSError:           # the connection's: below
                    raise
                except Exception as err:      # headers are sent: the error goes into the stream
                    service.log(f"error: {type(err).__name__}: {err}")
                    send({"error": {"message": str(err), "type": "invalid_request_error"
                                    if isinstance(err, RequestError) else type(err).__name__}})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except TimeoutError:          # (the model's lock is released: the write was inside the generation)
                service.log(f"{self.address_string()}: the client read nothing for {self.timeout:g} s: "
                            f"its stream is dropped")
            except OSError:               # BrokenPipeError, ConnectionResetError
                service.log("the client closed the stream")

        def do_GET(self):
            path = self.path.split("?")[0].rstrip("/")
            if path == "/v1/models":        # what OpenAI clients ask first: the one model served
                return self.reply(200, {"object": "list", "data": [{"id": service.name, "object": "model",
                                                                     "owned_by": "megatron-zaya"}]})
            if path == "/health":
                return self.reply(200, {"status": "ok", "model": service.name})
            self.reply(405, "use PUT /api with a JSON body such as {\"prompts\": [\"Hello\"], \"tokens_to_generate\": 16}")

        def log_message(self, format, *args):
            service.log(f"{self.address_string()} {format % args}")

    return GenerationServer((host, port), Handler, service)


class GenerationServer(ThreadingHTTPServer):
    """A threading HTTP server whose handler threads are waited for (not daemons), and which knows its open
    connections, so that stop_requests() can end the reads under way."""

    daemon_threads = False

    def __init__(self, address, handler, service: TextGenerationService):
        super().__init__(address, handler)
        self.service = service
        self._connections, self._guard, self._stopped = set(), threading.Lock(), threading.Event()

    def register(self, connection: socket.socket) -> None:
        with self._guard:
            self._connections.add(connection)
            if self._stopped.is_set():      # accepted as the server stopped, after stop_requests() ran
                _shut_reads(connection)

    def unregister(self, connection: socket.socket) -> None:
        with self._guard:
            self._connections.discard(connection)

    def handle_error(self, request, client_address) -> None:
        """A client that reset or dropped its connection (while its request was read): one line in the log, not
        socketserver's traceback; any other error as socketserver reports it."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            self.service.log(f"{client_address[0]}: the connection was lost ({type(error).__name__})")
        else:
            super().handle_error(request, client_address)

    def stop_requests(self) -> None:
        """Before server_close(), which waits for the handler threads: the generation under way ends at its
        next step (service.stop(), 503), and every connection's reading side is shut, so that a request
        still being read (a client that sends a byte now and then, which no --client-timeout ends) ends
        at once; answers can still be written."""
        self.service.stop()
        with self._guard:
            self._stopped.set()
            for connection in self._connections:
                _shut_reads(connection)


def _shut_reads(connection: socket.socket) -> None:
    """End the reads on `connection` (answers can still be written); one the client reset already is left as it
    is (ENOTCONN)."""
    try:
        connection.shutdown(socket.SHUT_RD)
    except OSError:
        pass
