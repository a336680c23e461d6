"""Cost of a streamed completion's text bookkeeping (inference.streaming.ChoiceStream: the text that
becomes final after each sampled token, held back at a possible stop string or an unfinished character),
without the model: the tokens of synthetic text fed one by one, as the server's stream does.

    python bench/stream_text.py --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model data/tokenizer/shakespeare_sp8k.model
    python bench/stream_text.py --tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR/tokenizer.json --tokens 1000 4000 16000

Prints the seconds spent per completion length (best of --repeats).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_zaya.data import build_tokenizer  # noqa: E402
from megatron_zaya.data.synthetic import TextGenerator  # noqa: E402
from megatron_zaya.inference.streaming import ChoiceStream  # noqa: E402


def completion_tokens(tokenizer, count: int) -> list[int]:
    generator, ids = TextGenerator(seed=0), []
    while len(ids) < count + 64:
        ids += tokenizer.encode(generator.document())
    return ids[:count + 64]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer-type", required=True)
    parser.add_argument("--tokenizer-model", required=True)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1000, 2000, 4000, 8000])
    parser.add_argument("--stop", default="\n\nQ:", help="a stop string the text never holds (so nothing stops)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model)
    print(f"{args.tokenizer_type}: stop {args.stop!r}")
    print("| completion tokens | s |")
    print("|---|---|")
    for count in args.tokens:
        ids = completion_tokens(tokenizer, count)
        prompt, completion = ids[:64], ids[64:]
        best = float("inf")
        for _ in range(args.repeats):
            choice = ChoiceStream(tokenizer, prompt, 0, (args.stop,), None)   # (it calls only .decode)
            start = time.perf_counter()
            for token in completion:
                choice.add(token, None, None, None)
            best = min(best, time.perf_counter() - start)
        print(f"| {count} | {best:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
