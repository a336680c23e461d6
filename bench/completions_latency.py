"""Latency of OpenAI completions requests with log-probabilities, as evaluation harnesses send them (echo,
logprobs 1, greedy), through the server's own request handler (inference.completions.complete) without
HTTP; random weights and prompt tokens.

    python bench/completions_latency.py                                   # zaya1-100m, max_tokens 0 1 16
    python bench/completions_latency.py --preset zaya1-tiny --max-tokens 0 1
    python bench/completions_latency.py --preset zaya1-tiny --shared-prefix 512 --prompt-lengths 16 24 32 40 --max-tokens 0 1
    python bench/completions_latency.py --preset zaya1-tiny --shared-prefix 512 --questions 4 --question-length 128 \
        --prompt-lengths 4 6 8 10 --max-tokens 0 [--by-length]
    python bench/completions_latency.py --preset zaya1-tiny --prompt-lengths 4000 --max-tokens 0 \
        --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model data/tokenizer/shakespeare_sp8k.model

Prints the median seconds of --repeats requests (after one untimed) for each --max-tokens.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megatron_zaya.config import PRESETS, model_config_from_preset  # noqa: E402
from megatron_zaya.data import build_tokenizer  # noqa: E402
from megatron_zaya.inference.completions import complete  # noqa: E402
from megatron_zaya.inference.server import TextGenerationService  # noqa: E402
from megatron_zaya.model import ZayaModel  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="zaya1-100m", choices=sorted(PRESETS))
    parser.add_argument("--prompt-lengths", type=int, nargs="+", default=[128, 256, 384, 512])
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[0, 1, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--tokenizer-type", default="NullTokenizer",
                        help="the tokenizer that decodes the texts and offsets (NullTokenizer: the model's vocabulary)")
    parser.add_argument("--tokenizer-model", default=None)
    parser.add_argument("--n", type=int, default=1, help="completions per prompt (the request's n)")
    parser.add_argument("--shared-prefix", type=int, default=0,
                        help="tokens every prompt starts with before its own --prompt-lengths tokens (the context "
                             "of a multiple-choice question)")
    parser.add_argument("--questions", type=int, default=0,
                        help="with --question-length: that many questions after the shared prefix, each followed by "
                             "every --prompt-lengths answer (few-shot multiple choice: header, question, answer)")
    parser.add_argument("--question-length", type=int, default=0)
    parser.add_argument("--by-length", action="store_true",
                        help="send the prompts longest first, as lm-evaluation-harness orders its requests (one "
                             "question's answers then interleave with the others')")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = ZayaModel(model_config_from_preset(args.preset)).eval()
    tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model or str(model.config.vocab_size - 1))
    service = TextGenerationService(model, tokenizer, name=args.preset)
    shared = torch.randint(0, tokenizer.vocab_size - 1, (args.shared_prefix,)).tolist()
    questions = [torch.randint(0, tokenizer.vocab_size - 1, (args.question_length,)).tolist()
                 for _ in range(args.questions)] or [[]]
    prompts = [shared + question + torch.randint(0, tokenizer.vocab_size - 1, (n,)).tolist()
               for question in questions for n in args.prompt_lengths]
    if args.by_length:
        prompts.sort(key=len, reverse=True)
    print(f"{args.preset}, fp32, {torch.get_num_threads()} threads, {args.tokenizer_type}: {len(prompts)} prompts of "
          f"{sum(map(len, prompts))} tokens in all ({args.shared_prefix} shared by all, {args.questions} questions of "
          f"{args.question_length}{', longest first' if args.by_length else ''}), echo, logprobs 1, greedy, n {args.n}")
    print("| max_tokens | median s |")
    print("|---|---|")
    for max_tokens in args.max_tokens:
        body = {"prompt": prompts, "max_tokens": max_tokens, "echo": True, "logprobs": 1, "temperature": 0, "n": args.n}
        complete(service, body)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            complete(service, body)
            times.append(time.perf_counter() - start)
        print(f"| {max_tokens} | {statistics.median(times):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
