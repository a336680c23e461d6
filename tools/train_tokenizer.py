"""Train a SentencePiece tokenizer (BPE or unigram, byte fallback) on JSONL or text corpora.

    python tools/train_tokenizer.py --input data/shakespeare.jsonl --vocab-size 32000 \
        --output-prefix data/tokenizer/sp32k [--model-type bpe|unigram] [--json-keys text]

Writes P.model and P.vocab. Ids: <unk>=0, <s>=1 (BOS), </s>=2 (EOS, used as EOD by
GPTSentencePieceTokenizer), <pad>=3. Use the model with
`--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model P.model`.
Documents are fed line by line; at most --input-sentence-size lines are sampled (bounded memory).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_zaya.data.sources import InputError, expand_inputs, iter_records  # noqa: E402


def iter_lines(paths, json_keys, text_mode, counts):
    for rec in iter_records(paths, text_mode):
        try:
            text = rec.raw.decode("utf-8")
        except UnicodeDecodeError:
            counts["not UTF-8"] = counts.get("not UTF-8", 0) + 1
            continue
        if rec.is_json:
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError:
                counts["malformed JSON"] = counts.get("malformed JSON", 0) + 1
                continue
            texts = [obj.get(k) for k in json_keys] if isinstance(obj, dict) else []
            texts = [t for t in texts if isinstance(t, str)]
            if not texts:
                counts["missing key"] = counts.get("missing key", 0) + 1
                continue
        else:
            texts = [text]
        counts["documents"] = counts.get("documents", 0) + 1
        for t in texts:
            for line in t.splitlines():
                if line.strip():
                    yield line


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="files, directories or globs (.jsonl[.gz|.zst] or text)")
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--output-prefix", required=True)
    p.add_argument("--model-type", choices=("bpe", "unigram"), default="bpe")
    p.add_argument("--json-keys", nargs="+", default=["text"])
    p.add_argument("--text-mode", choices=("file", "paragraph", "line"), default="file")
    p.add_argument("--character-coverage", type=float, default=0.9995)
    p.add_argument("--input-sentence-size", type=int, default=2_000_000, help="lines sampled for training")
    p.add_argument("--max-sentence-length", type=int, default=16384, help="longer lines (bytes) are skipped")
    p.add_argument("--no-byte-fallback", action="store_true")
    p.add_argument("--user-defined-symbols", nargs="*", default=[], help="e.g. <think> </think>")
    p.add_argument("--num-threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)

    import sentencepiece as spm

    if args.vocab_size < 8:
        print(f"error: --vocab-size {args.vocab_size} is too small", file=sys.stderr)
        return 2
    try:
        paths = expand_inputs(args.input)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(args.output_prefix)), exist_ok=True)
    counts: dict[str, int] = {}
    t0 = time.time()
    if hasattr(spm, "set_random_generator_seed"):
        spm.set_random_generator_seed(args.seed)  # deterministic sentence sampling
    try:
        spm.SentencePieceTrainer.Train(
            sentence_iterator=iter_lines(paths, args.json_keys, args.text_mode, counts),
            model_prefix=args.output_prefix,
            vocab_size=args.vocab_size,
            model_type=args.model_type,
            byte_fallback=not args.no_byte_fallback,
            character_coverage=args.character_coverage,
            input_sentence_size=args.input_sentence_size,
            shuffle_input_sentence=True,
            max_sentence_length=args.max_sentence_length,
            unk_id=0, bos_id=1, eos_id=2, pad_id=3,
            user_defined_symbols=args.user_defined_symbols or [],
            num_threads=max(1, args.num_threads),
            minloglevel=2,
        )
    except (RuntimeError, InputError) as e:
        msg = str(e)
        if "Vocabulary size" in msg or "vocab_size" in msg:
            msg += " (the corpus is too small for this --vocab-size; lower it or add text)"
        print(f"error: SentencePiece training failed: {msg}", file=sys.stderr)
        return 1
    skipped = {k: v for k, v in counts.items() if k != "documents"}
    print(
        f"trained {args.model_type} vocab {args.vocab_size} on {counts.get('documents', 0)} documents "
        f"in {time.time() - t0:.1f}s -> {args.output_prefix}.model"
        + (f"; skipped {skipped}" if skipped else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
