"""A command-line client for the text generation server (Megatron-LM's tools/text_generation_cli.py).

    python tools/text_generation_cli.py localhost:5000                      # asks for a prompt and a length, repeatedly
    python tools/text_generation_cli.py localhost:5000 --tokens-to-generate 64 --temperature 0.8 --top-p 0.9
    echo "Once upon a time" | python tools/text_generation_cli.py localhost:5000 --tokens-to-generate 32

Each prompt goes to the server's PUT /api (tools/run_text_generation_server.py) and the answer's text is
printed. Without --tokens-to-generate the length is asked for each prompt, as Megatron-LM's client does.
Prompts are read until end of input (Ctrl-D). A request the server refuses prints its message and the
next prompt is read; a server that cannot be reached ends the client with exit status 1. A flag value the
server would refuse in every request (its own checks, request_fields.FIELD_CHECKS) is a usage error (exit status 2)
before any prompt is read.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request


class ServerUnreachable(Exception):
    pass


def api_url(address: str) -> str:
    """'host:port', 'http://host:port' or a full URL ending in /api -> the /api URL."""
    url = address if "://" in address else f"http://{address}"
    return url.rstrip("/") if url.rstrip("/").endswith("/api") else url.rstrip("/") + "/api"


def request_text(url: str, body: dict, timeout: float) -> str:
    """The generated text of one request; ValueError with the server's message when it refuses it."""
    data = json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data=data, method="PUT", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())["text"][0]
    except urllib.error.HTTPError as err:
        try:
            answer = json.loads(err.read())           # the server answers an error with its message
        except json.JSONDecodeError:
            answer = None
        message = answer if isinstance(answer, str) else err.reason
        raise ValueError(f"error {err.code}: {message}") from None
    except (urllib.error.URLError, OSError) as err:
        raise ServerUnreachable(f"cannot reach {url}: {getattr(err, 'reason', err)}") from None


def read_line(prompt: str, interactive: bool) -> str | None:
    try:
        return input(prompt if interactive else "")
    except EOFError:
        return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("address", help="the server: host:port (as Megatron-LM's client takes it) or a URL")
    p.add_argument("--tokens-to-generate", type=int, default=None,
                   help="tokens per answer (default: asked for each prompt)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for one answer")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.tokens_to_generate is not None and args.tokens_to_generate < 1:
        build_parser().error(f"--tokens-to-generate={args.tokens_to_generate}: must be >= 1")
    if not 0 < args.timeout <= 1e9:     # (NaN fails it too) the socket refused it at every prompt, or overflowed
        build_parser().error(f"--timeout={args.timeout}: must be a positive number of seconds, at most 1e9")
    # What the server refuses in every request (server.parse_request, by its own checks), said once before any
    # prompt is read
    from megatron_zaya.inference.request_fields import FIELD_CHECKS
    for flag, field in (("--temperature", "temperature"), ("--top-k", "top_k"), ("--top-p", "top_p"),
                        ("--random-seed", "random_seed")):
        value = getattr(args, field)
        valid, what = FIELD_CHECKS[field]
        if value is not None and not valid(value):
            build_parser().error(f"{flag}={value}: the server takes {what}")
    if args.top_k and args.top_p:
        build_parser().error("--top-k and --top-p: the server takes one of them, not both")
    url, interactive = api_url(args.address), sys.stdin.isatty()
    try:                # a malformed address once, before any prompt ("localhost:abc", "http://[bad")
        parts = urllib.parse.urlsplit(url)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError as err:
        build_parser().error(f"address {args.address!r}: {err}")
    if not usable:
        build_parser().error(f"address {args.address!r}: expected host:port or an http(s):// URL")
    options = {key: value for key, value in (("temperature", args.temperature), ("top_k", args.top_k),
                                             ("top_p", args.top_p), ("random_seed", args.random_seed))
               if value is not None}
    while True:
        prompt = read_line("Enter prompt: ", interactive)
        if prompt is None:
            return 0
        tokens = args.tokens_to_generate
        if tokens is None:
            answer = read_line("Enter number of tokens to generate: ", interactive)
            if answer is None:
                return 0
            try:
                tokens = int(answer)
            except ValueError:
                print(f"not a number of tokens: {answer!r}", file=sys.stderr)
                continue
        try:
            text = request_text(url, {"prompts": [prompt], "tokens_to_generate": tokens, **options}, args.timeout)
        except ValueError as err:
            print(err, file=sys.stderr)
            continue
        except ServerUnreachable as err:
            print(f"text_generation_cli.py: {err}", file=sys.stderr)
            return 1
        print("Megatron Response: " if interactive else "", end="")
        print(text, flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from megatron_zaya.interrupts import quiet_when_the_reader_leaves
    sys.exit(quiet_when_the_reader_leaves(main))
