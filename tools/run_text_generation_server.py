"""Serve a ZAYA checkpoint over Megatron-LM's text generation REST API.

    python tools/run_text_generation_server.py --load CKPT --tokenizer-type GPTSentencePieceTokenizer \\
        --tokenizer-model tok.model [--port 5000] [--host 0.0.0.0] [--device cuda] [--dtype bf16]

    curl -X PUT http://localhost:5000/api -H 'Content-Type: application/json' \\
        -d '{"prompts": ["Once upon a time"], "tokens_to_generate": 32, "top_k": 1}'

CKPT is a Hugging Face ZAYA folder or a megatron-zaya checkpoint (megatron_zaya/inference/loading.py); without
tokenizer flags the folder's own tokenizer.json, or the tokenizer flags the training run recorded in the
checkpoint, are used.
The request and response fields are Megatron-LM's (prompts, tokens_to_generate, logprobs,
temperature, top_k, top_p, add_BOS, random_seed; text, tokens, segments, logprobs): see
megatron_zaya/inference/server.py and docs/INFERENCE.md. POST /v1/completions (or /completions)
speaks the OpenAI completions API (megatron_zaya/inference/completions.py). The server listens on --host
(default 127.0.0.1, this machine only; 0.0.0.0 serves other machines) until Ctrl-C or SIGTERM.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megatron_zaya.errors import UserInputError  # noqa: E402
from megatron_zaya.inference.cli_checks import (  # noqa: E402
    OWN_TOKENIZER, add_tokenizer_arguments, check_device, check_threads, check_tokenizer_fits, peek_model_config,
    tokenizer_from_flags)
from megatron_zaya.inference.loading import DTYPES, load_model_for_inference, parse_dtype  # noqa: E402
from megatron_zaya.inference.server import CLIENT_TIMEOUT, TextGenerationService, make_server  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load", required=True, help="checkpoint: HF ZAYA folder or megatron-zaya checkpoint")
    add_tokenizer_arguments(p)      # required, unless --load brings its own tokenizer (cli_checks.OWN_TOKENIZER)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=5000, help="port to listen on (0: any free port, printed)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (checked before loading)")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="cast parameters (default: as stored)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (0: torch's default)")
    p.add_argument("--client-timeout", type=float, default=CLIENT_TIMEOUT,
                   help="seconds a read from or a write to a client may block before its connection is dropped "
                        "(a streaming client that stops reading would hold the model for everyone)")
    p.add_argument("--quiet", action="store_true", help="no line per request on stderr")
    return p


def prepare(argv=None):
    """(service, server) from the flags: every flag checked before the checkpoint is read, and the
    port bound before the model loads (a port in use fails at once)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port={args.port} must be in [0, 65535]")
    if not 0 < args.client_timeout < float("inf"):
        parser.error(f"--client-timeout={args.client_timeout} must be a number of seconds > 0")
    try:
        check_threads(args.threads)
        check_device(args.device)
        dtype = parse_dtype(args.dtype)
        tokenizer = tokenizer_from_flags(args)
        if tokenizer is None:
            raise UserInputError(f"--tokenizer-type is required (the server takes and returns text), unless "
                                 f"{OWN_TOKENIZER}")
        peeked = peek_model_config(args.load)        # config.json / metadata.json only: no tensor read yet
        if peeked is not None:
            check_tokenizer_fits(tokenizer, peeked, args)
    except ValueError as err:           # UserInputError included
        parser.error(str(err))
    if args.threads:
        torch.set_num_threads(args.threads)
    service = TextGenerationService(None, tokenizer,
                                    log=None if args.quiet else lambda line: print(line, file=sys.stderr, flush=True))
    try:
        server = make_server(service, args.host, args.port, client_timeout=args.client_timeout)
    except OSError as err:
        parser.error(f"--host {args.host} --port {args.port}: cannot listen ({err.strerror or err})")
    try:
        model, config, info = load_model_for_inference(args.load, device=args.device, dtype=dtype)
        check_tokenizer_fits(tokenizer, config, args)
    except (OSError, ValueError, RuntimeError) as err:
        server.server_close()
        parser.error(f"--load: {err}")
    service.model = model
    service.name = os.path.basename(os.path.normpath(args.load))
    host, port = server.server_address[:2]
    print(f"serving {info.get('path', args.load)} [{info.get('format')}] on http://{host}:{port}/api "
          f"(PUT a JSON body; Ctrl-C stops)", flush=True)
    return service, server


def main(argv=None) -> int:
    _, server = prepare(argv)
    # SIGTERM (a job's end) stops the loop as Ctrl-C does; shutdown() must come from another thread.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop_requests()      # the generation under way ends at its next step (503), reads end
        server.server_close()       # and its handler threads, before the interpreter exits
    print("server stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
