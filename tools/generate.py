"""Sample text from a ZAYA checkpoint with the CCA inference cache (prefill, then token-by-token decode).

    python tools/generate.py --load CKPT --tokenizer-type GPTSentencePieceTokenizer \\
        --tokenizer-model tok.model --prompt "Once upon a time" --max-new-tokens 64 --top-p 0.9
    python tools/generate.py --load CKPT --prompt-ids "1 17 42" --prompt-ids "5" --greedy
    python tools/generate.py --load CKPT --tokenizer-type ... --prompt "Once upon a time" --stream

CKPT is a Hugging Face ZAYA folder (config.json + model.safetensors) or a megatron-zaya checkpoint (see
megatron_zaya/inference/loading.py). Without tokenizer flags the folder's tokenizer.json, or the tokenizer
flags the training run recorded in the checkpoint, serve. Several --prompt / --prompt-ids give a batch of prompts of
different lengths (each prefilled into its own cache row, then decoded together). Decoding stops at
the tokenizer's EOD (or --eod-id) unless --ignore-eod. Sampling: --greedy (or --temperature 0),
--temperature, --top-k, --top-p, reproducible with --seed. --output-json writes prompts and
generated ids (and text when a tokenizer is given). --stream prints one prompt's text as it is sampled
(a character split over tokens, and a stop, as the completions stream handles them). See docs/INFERENCE.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megatron_zaya.errors import UserInputError  # noqa: E402
from megatron_zaya.interrupts import say  # noqa: E402
from megatron_zaya.inference.cli_checks import (  # noqa: E402
    OWN_TOKENIZER, add_tokenizer_arguments, check_device, check_prompts_fit, check_threads, check_tokenizer_fits,
    check_writable_output, peek_model_config, tokenizer_from_flags, write_output_json)
from megatron_zaya.inference.decode import generate  # noqa: E402
from megatron_zaya.inference.loading import DTYPES, load_model_for_inference, parse_dtype  # noqa: E402
from megatron_zaya.inference.sampling import SamplingParams, check_seed  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load", required=True, help="checkpoint: HF ZAYA folder or megatron-zaya checkpoint")
    p.add_argument("--prompt", action="append", default=[], help="a text prompt (repeat for a batch)")
    p.add_argument("--prompt-file", help="a file with one text prompt per line (- : standard input)")
    p.add_argument("--prompt-ids", action="append", default=[],
                   help="a prompt as space-separated token ids (repeat for a batch; no tokenizer needed)")
    add_tokenizer_arguments(p)
    p.add_argument("--add-bos", action="store_true", help="prepend the tokenizer's BOS to text prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--greedy", action="store_true", help="argmax decoding (same as --temperature 0)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0: off)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--stream", action="store_true", help="print the text as it is sampled (one prompt, a tokenizer)")
    p.add_argument("--eod-id", type=int, default=None, help="stop token (default: the tokenizer's EOD)")
    p.add_argument("--ignore-eod", action="store_true", help="always generate --max-new-tokens tokens")
    p.add_argument("--prefill-chunk", type=int, default=None,
                   help="prefill long prompts in chunks of N >= 1 tokens (default: the whole prompt at once)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (checked before loading)")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="cast parameters (default: as stored)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (0: torch's default)")
    p.add_argument("--output-json", help="write prompts and generations to this file")
    return p


def check_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The flags that need neither the tokenizer nor the checkpoint: sizes, device, output path."""
    if args.max_new_tokens < 0:
        parser.error(f"--max-new-tokens={args.max_new_tokens} must be >= 0")
    if args.prefill_chunk is not None and args.prefill_chunk < 1:
        parser.error(f"--prefill-chunk={args.prefill_chunk} must be >= 1 (omit it to prefill whole prompts)")
    if args.eod_id is not None and args.eod_id < 0:
        parser.error(f"--eod-id={args.eod_id} must be >= 0")
    try:
        check_seed(args.seed)
    except ValueError as err:
        parser.error(str(err))
    try:
        check_threads(args.threads)
        check_device(args.device)
        check_writable_output("--output-json", args.output_json, load=args.load)
    except UserInputError as err:
        parser.error(str(err))


def read_prompt_file(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """The non-blank lines of --prompt-file (UTF-8; `-` or a pipe, e.g. <(...), is read too), one prompt each."""
    if path != "-" and not os.path.exists(path):
        parser.error(f"--prompt-file {path}: no such file")
    if os.path.isdir(path):
        parser.error(f"--prompt-file {path}: a folder, not a file of prompts")
    try:
        if path == "-":
            return [line.rstrip("\n") for line in sys.stdin if line.strip()]
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f if line.strip()]
    except UnicodeDecodeError as err:
        parser.error(f"--prompt-file {path}: not UTF-8 text (byte {err.start}: {err.reason})")
    except OSError as err:
        parser.error(f"--prompt-file {path}: cannot read ({err.strerror})")


def load_tokenizer(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The tokenizer of the tokenizer flags, or None when none is given; a bad flag is a usage error."""
    try:     # the flags are checked (check_tokenizer_flags) before anything is loaded
        return tokenizer_from_flags(args)
    except UserInputError as err:
        parser.error(str(err))


class StreamPrinter:
    """--stream: prints the prompt, then each piece of text as the sampled tokens make it final."""

    def __init__(self, tokenizer, prompt: list[int], eod: int | None):
        from megatron_zaya.inference.streaming import ChoiceStream
        self.choice, self.eod = ChoiceStream(tokenizer, prompt, 0, (), None), eod
        say(f"=== sample 0 ({len(prompt)} prompt tokens, streamed)")
        say(tokenizer.decode(prompt), end="")

    def step(self, tokens, scores) -> bool:
        if tokens[0] is not None and self.choice.finish_reason is None:
            for chunk in self.choice.add(tokens[0], self.eod, None, None):
                say(chunk["text"], end="")
        return self.choice.finish_reason is not None

    def end(self) -> None:
        if self.choice.finish_reason is None:
            for chunk in self.choice.finish("length"):
                say(chunk["text"], end="")
        say()


def check_against_config(parser, args, config, prompts, tokenizer, eod) -> None:
    """Tokenizer vocabulary, prompt ids, the stop token and the length against the checkpoint's config."""
    try:
        check_tokenizer_fits(tokenizer, config, args)
        check_prompts_fit(config, prompts, args.max_new_tokens, eod,
                          tokenizer.vocab_size if tokenizer is not None else None)
    except UserInputError as err:
        parser.error(str(err))


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_flags(parser, args)
    if args.threads:
        torch.set_num_threads(args.threads)
    texts = list(args.prompt)
    if args.prompt_file:
        texts += read_prompt_file(parser, args.prompt_file)
    if not texts and not args.prompt_ids:
        parser.error("give at least one --prompt, --prompt-file or --prompt-ids")
    tokenizer = load_tokenizer(parser, args)
    if texts and tokenizer is None:
        parser.error(f"text prompts need --tokenizer-type and --tokenizer-model, unless {OWN_TOKENIZER} (or use "
                     f"--prompt-ids)")
    try:
        sampling = SamplingParams(greedy=args.greedy, temperature=args.temperature, top_k=args.top_k,
                                  top_p=args.top_p)
        dtype = parse_dtype(args.dtype)
    except ValueError as err:
        parser.error(str(err))

    prompts: list[list[int]] = []
    for text in texts:
        ids = tokenizer.encode(text)
        if args.add_bos:
            if tokenizer.bos is None:
                parser.error(f"--add-bos: tokenizer {args.tokenizer_type} has no BOS token")
            ids = [tokenizer.bos] + ids
        prompts.append(ids)
    for spec in args.prompt_ids:
        words = spec.replace(",", " ").split()
        if not all(w.isascii() and w.isdigit() for w in words):    # (int() also reads "1_2" as 12, and "+3")
            parser.error(f"--prompt-ids {spec!r}: expected space-separated integers")
        prompts.append([int(w) for w in words])
    if args.stream and tokenizer is None:
        parser.error("--stream needs --tokenizer-type and --tokenizer-model (it prints text)")
    if args.stream and len(prompts) != 1:
        parser.error(f"--stream prints one prompt's text as it is sampled: give one prompt, not {len(prompts)}")
    eod = None if args.ignore_eod else (args.eod_id if args.eod_id is not None
                                        else (tokenizer.eod if tokenizer is not None else None))
    peeked = peek_model_config(args.load)       # config.json / metadata.json only: no tensor read yet
    if peeked is not None:
        check_against_config(parser, args, peeked, prompts, tokenizer, eod)

    try:
        model, config, info = load_model_for_inference(args.load, device=args.device, dtype=dtype)
    except (OSError, ValueError, RuntimeError) as err:
        parser.error(f"--load: {err}")
    check_against_config(parser, args, config, prompts, tokenizer, eod)
    vocab_limit = tokenizer.vocab_size if tokenizer is not None else None
    streamed = StreamPrinter(tokenizer, prompts[0], eod) if args.stream else None
    start = time.perf_counter()
    try:
        result = generate(model, prompts, args.max_new_tokens, sampling, eod=eod, seed=args.seed,
                          vocab_limit=vocab_limit, prefill_chunk=args.prefill_chunk,
                          on_step=streamed.step if streamed else None)
    except ValueError as err:
        parser.error(str(err))
    elapsed = time.perf_counter() - start
    if streamed:
        streamed.end()

    records = []
    for i, (prompt, new) in enumerate(zip(result.prompts, result.tokens)):
        record = {"prompt_ids": prompt, "generated_ids": new, "stopped_at_eod": result.stopped_at_eod[i]}
        if tokenizer is not None:     # decoded whole: a first generated piece keeps its leading space
            record["prompt"] = tokenizer.decode(prompt)
            record["text"] = tokenizer.decode(prompt + [t for t in new if t != eod])
            record["generated"] = record["text"][len(record["prompt"]):] if record["text"].startswith(
                record["prompt"]) else tokenizer.decode([t for t in new if t != eod])
        records.append(record)
    if args.output_json:              # before the prints: written even when their reader has gone (`| head`)
        try:
            write_output_json("--output-json", args.output_json,
                              {"checkpoint": info, "sampling": vars(sampling), "seed": args.seed, "samples": records})
        except UserInputError as err:
            parser.error(str(err))
    for i, (prompt, new, record) in enumerate(zip(result.prompts, result.tokens, records)):
        if streamed:
            break
        say(f"=== sample {i} ({len(prompt)} prompt tokens, {len(new)} generated"
            f"{', stopped at EOD' if result.stopped_at_eod[i] else ''})")
        if tokenizer is not None:
            say(record["text"])
        if tokenizer is None or i >= len(texts):    # --prompt-ids: ids in, ids out (the text too, with a tokenizer)
            say("prompt ids:    " + " ".join(map(str, prompt)))
            say("generated ids: " + " ".join(map(str, new)))
    generated = sum(len(t) for t in result.tokens)
    say(f"[{info.get('format')}] {generated} tokens in {elapsed:.2f}s "
        f"({generated / max(elapsed, 1e-9):.1f} tokens/s, batch {len(prompts)})", sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
