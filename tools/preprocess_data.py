"""Tokenize JSONL, Parquet or text corpora into Megatron-LM compatible .bin/.idx files (streaming, parallel).

    python tools/preprocess_data.py --input data/shakespeare.jsonl --json-keys text --append-eod \
        --output-prefix data/shakespeare --tokenizer-type GPTSentencePieceTokenizer \
        --tokenizer-model data/tokenizer/sp32k.model --workers 2

Writes data/shakespeare_text_document.{bin,idx} (uint16 tokens when the vocabulary is below 65,500,
int32 otherwise). --input takes files, directories or globs: .jsonl/.json/.ndjson (optionally .gz,
or .zst with the zstandard package) hold one JSON document per line, and so does any other file
whose first non-blank line is a JSON object (as in Megatron, which reads every input as JSONL);
.parquet files (FineWeb, DCLM and most published corpora; with the pyarrow package) give one document
per row, --json-keys naming columns, read a row batch at a time; other files are plain text, one
document per file (--text-mode file, as written), per blank-line-separated block (paragraph, its lines
joined by LF) or per line (CR LF ends a line as LF does). A directory gives only its .jsonl/.json/.ndjson/.txt
files (optionally compressed) and .parquet files, recursively; the count taken is logged.
Token ids must lie in [0, vocab size): an id outside (NullTokenizer input) stops the run, naming
the file and line. Existing outputs are refused unless --overwrite is given, also one that another run of
the same output (a job submitted twice) writes meanwhile (one line naming it, exit 2, its own files removed);
a replaced dataset is swapped in only once every output is complete.
Reasoning trimming: --trim-max-length 4096 --reasoning-markers '<think>' '</think>'.
Exit status: 0 on success, 1 when nothing could be written, 2 on bad flags or inputs, 3 when a
worker process failed or died, 130 when interrupted (SIGTERM or Ctrl-C stops the run after the chunk in
progress, a second one at once); no output is left on failure (after a SIGKILL, the next run of the same
output removes the killed run's temporary files).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_zaya.data.preprocess import (  # noqa: E402
    EmptyInputError,
    PreprocessConfig,
    format_summary,
    run,
)
from megatron_zaya.data.sources import InputError  # noqa: E402
from megatron_zaya.data.workers import WorkerError  # noqa: E402
from megatron_zaya.data.tokenizer import (  # noqa: E402
    TOKENIZER_TYPES, add_tiktoken_arguments, null_tokenizer_size_from_vocab_size, tiktoken_options)
from megatron_zaya.interrupts import StopOnSignal  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("input")
    g.add_argument("--input", nargs="+", required=True, help="files, directories or globs")
    g.add_argument("--json-keys", nargs="+", default=["text"], help="JSON keys to tokenize (one output each, no duplicates)")
    g.add_argument("--text-mode", choices=("file", "paragraph", "line"), default="file",
                   help="documents in plain-text inputs: per file, blank-line-separated block, or line")
    g.add_argument("--strict", action="store_true", help="stop at the first bad record instead of skipping it")
    g = p.add_argument_group("tokenizer")
    g.add_argument("--tokenizer-type", required=True, choices=sorted(TOKENIZER_TYPES))
    g.add_argument("--tokenizer-model", default=None,
                   help="SentencePiece .model, tokenizer.json (or its folder), a vocab size for NullTokenizer, or a "
                        "folder holding vocab.json + merges.txt for GPT2BPETokenizer")
    g.add_argument("--vocab-file", default=None, help="GPT2BPETokenizer: GPT-2's vocab.json")
    g.add_argument("--merge-file", default=None, help="GPT2BPETokenizer: GPT-2's merges.txt")
    g.add_argument("--vocab-extra-ids", type=int, default=0, help="SentencePieceTokenizer: <extra_id_N> tokens (>= 0)")
    add_tiktoken_arguments(g)
    g.add_argument("--append-eod", action="store_true", help="append the EOD token to every document")
    g = p.add_argument_group("trimming of reasoning samples")
    g.add_argument("--trim-max-length", type=int, default=None, help="max tokens per sample (EOD included, >= 1); omit for no trimming")
    g.add_argument("--reasoning-markers", nargs=2, default=["<think>", "</think>"], metavar=("OPEN", "CLOSE"))
    g = p.add_argument_group("output and runtime")
    g.add_argument("--output-prefix", required=True)
    g.add_argument("--overwrite", action="store_true", help="replace existing {prefix}_{key}_document.bin/.idx")
    g.add_argument("--workers", type=int, default=1)
    g.add_argument("--log-interval", type=int, default=100000,
                   help="documents between log lines (without a terminal; also a line at least every minute)")
    g.add_argument("--chunk-bytes", type=int, default=1 << 20, help="raw bytes per work unit")
    g.add_argument("--no-progress", action="store_true", help="log lines instead of a progress bar")
    g.add_argument("--dataset-impl", default="mmap", choices=["mmap"], help="accepted for Megatron compatibility")
    g = p.add_argument_group("Megatron-LM flags accepted for compatibility")
    g.add_argument("--partitions", type=int, default=1,
                   help="accepted: the input is read by --workers processes in one ordered pass and written as "
                        "one dataset (no partition files to merge)")
    g.add_argument("--keep-sequential-samples", action="store_true",
                   help="accepted: documents always keep the input order")
    g.add_argument("--split-sentences", action="store_true",
                   help="refused: sentence splitting (nltk punkt, for BERT-style sentence pairs) is not done; GPT "
                        "pretraining reads whole documents")
    g.add_argument("--keep-newlines", action="store_true",
                   help="accepted: the text is tokenized as it is, newlines included")
    g.add_argument("--lang", default=None, help="accepted: only used by --split-sentences")
    args = p.parse_args(argv)
    null_tokenizer_size_from_vocab_size(args)
    if args.split_sentences:
        p.error("--split-sentences is not supported: documents are tokenized whole (sentence splitting with nltk "
                "punkt serves BERT-style sentence pairs; GPT pretraining does not use it); drop the flag")
    if args.partitions < 1:
        p.error(f"--partitions={args.partitions} must be >= 1")
    return args


def _interrupted(stop: StopOnSignal) -> int:
    print(f"interrupted{f' ({stop.received})' if stop.received else ''}: no output written", file=sys.stderr)
    return 130


def main(argv=None) -> int:
    args = parse_args(argv)
    stop = StopOnSignal()   # a killed run (SIGTERM) cleans its temporary files too
    try:
        return _main(args, stop)
    finally:
        stop.restore()  # callers that import main() (tests) keep their own signal handling


def _main(args, stop: StopOnSignal) -> int:
    cfg = PreprocessConfig(
        input=args.input,
        output_prefix=args.output_prefix,
        tokenizer_type=args.tokenizer_type,
        tokenizer_model=args.tokenizer_model,
        vocab_file=args.vocab_file,
        merge_file=args.merge_file,
        json_keys=args.json_keys,
        append_eod=args.append_eod,
        workers=args.workers,
        text_mode=args.text_mode,
        vocab_extra_ids=args.vocab_extra_ids,
        tiktoken=tiktoken_options(args),
        trim_max_length=args.trim_max_length,
        reasoning_markers=tuple(args.reasoning_markers),
        chunk_bytes=args.chunk_bytes,
        log_interval=args.log_interval,
        progress=False if args.no_progress else None,
        strict=args.strict,
        overwrite=args.overwrite,
    )
    try:
        summary = run(cfg, should_stop=stop.pending)
    except EmptyInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (InputError, ValueError, FileNotFoundError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except WorkerError as e:
        if stop.received:   # the workers got the signal too (scancel, kill of the process group) and ended
            return _interrupted(stop)
        print(f"error: {e}\nno output written", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return _interrupted(stop)
    print(format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
