"""What a Megatron .bin/.idx dataset holds, and which tokenizer wrote it.

    python tools/inspect_dataset.py data/shakespeare_text_document            # counts, lengths, tokenizer, text
    python tools/inspect_dataset.py PREFIX --documents 5 --max-chars 2000     # more of the text
    python tools/inspect_dataset.py PREFIX --scan                             # read every token (progress on stderr)
    python tools/inspect_dataset.py PREFIX --json
    python tools/inspect_dataset.py PREFIX --tokenizer-type ... --tokenizer-model ...   # decode with this one

The pair is checked as training opens it (header, document index, pointers, .bin size). From the index: the
sequence, document and token counts and the spread of document lengths. The tokenizer is the one of the
flags, else the one recorded beside the dataset by tools/preprocess_data.py (PREFIX.tokenizer.json, when its
files are found); with one, the report adds the id range and how many documents end with EOD (over the first
1M tokens and 1,000 documents, or all of them with --scan), and the first --documents documents' text.
Exit status 0, 2 for a damaged dataset or a bad flag (one line naming the file or the flag).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_zaya.data.dataset_tokenizer import read_record  # noqa: E402
from megatron_zaya.data.inspection import dataset_report  # noqa: E402
from megatron_zaya.data.tokenizer import tokenizer_from_flags_dict  # noqa: E402
from megatron_zaya.errors import UserInputError  # noqa: E402
from megatron_zaya.inference.cli_checks import add_tokenizer_arguments, tokenizer_from_flags  # noqa: E402
from megatron_zaya.units import human_bytes  # noqa: E402
from megatron_zaya.interrupts import quiet_when_the_reader_leaves  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prefix", help="the dataset prefix (PREFIX.bin + PREFIX.idx; .bin or .idx accepted)")
    p.add_argument("--documents", type=int, default=2, help="documents whose text is shown (default 2)")
    p.add_argument("--max-chars", type=int, default=600, help="characters shown per document (default 600)")
    p.add_argument("--scan", action="store_true", help="read every token (id range, EOD endings of all documents)")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    add_tokenizer_arguments(p)
    return p


def report_tokenizer(args, prefix: str):
    """(tokenizer or None, where it comes from): the flags', else the dataset record's if its files exist."""
    tokenizer = tokenizer_from_flags(args)
    if tokenizer is not None:
        return tokenizer, "the tokenizer flags"
    record = read_record(prefix)
    if record is None:
        return None, "none (no tokenizer flags, no tokenizer record beside the dataset): ids are not read"
    try:
        return tokenizer_from_flags_dict(record["tokenizer_flags"]), "the dataset's tokenizer record"
    except (UserInputError, OSError) as err:
        return None, f"none: the recorded tokenizer cannot be built here ({err}); give the tokenizer flags"


def print_report(report: dict, tokenizer_source: str) -> None:
    print(f"dataset:     {report['prefix']} (.bin {human_bytes(report['bin_bytes'])}, "
          f".idx {human_bytes(report['idx_bytes'])}, {report['dtype']})")
    print(f"documents:   {report['documents']:,} ({report['sequences']:,} sequences, {report['tokens']:,} tokens)")
    spread = report["document_tokens"]
    if spread:
        empty = f"; {report['empty_documents']:,} empty" if report["empty_documents"] else ""
        median = spread["median"]      # (the middle of an even count can be a half: 238.5, not "238")
        median = f"{median:,.0f}" if float(median).is_integer() else f"{median:,.1f}"
        print(f"doc tokens:  min {spread['min']:,}, median {median}, mean {spread['mean']:,.1f}, "
              f"max {spread['max']:,}{empty}")
    record = report["tokenizer_record"]
    print(f"written by:  {record['flags'] + ' (' + record['file'] + ')' if record else '(no tokenizer record)'}")
    print(f"decoded by:  {tokenizer_source}")
    if "ids" in report:
        ids, eod = report["ids"], report["eod_endings"]
        first = "all" if ids["tokens_read"] == report["tokens"] else "the first"
        print(f"ids:         {ids['min_id']} .. {ids['max_id']} in {first} {ids['tokens_read']:,} tokens "
              f"(vocabulary {ids['vocab_size']:,}" + (f"; {ids['ids_outside_vocabulary']:,} ids outside it!)"
                                                      if ids["ids_outside_vocabulary"] else ")"))
        first = "all" if eod["documents_read"] == report["documents"] else "the first"
        print(f"EOD:         {eod['ending_with_eod']:,} of {first} {eod['documents_read']:,} documents end with "
              f"id {eod['eod']}" + ("" if eod["ending_with_eod"] else " (preprocessed without --append-eod?)"))
    for shown in report.get("documents_shown", []):
        print(f"--- document {shown['document']} ({shown['tokens']:,} tokens)")
        print(shown["text"] + (" [...]" if shown["cut"] else ""))


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, value in (("--documents", args.documents), ("--max-chars", args.max_chars)):
        if value < 0:
            parser.error(f"{flag}={value} must be >= 0")
    prefix = args.prefix[:-4] if args.prefix.endswith((".bin", ".idx")) else args.prefix
    progress = None if args.json or not args.scan else (
        lambda done, total: print(f"scanned {done:,}/{total:,} tokens", file=sys.stderr, flush=True))
    try:
        tokenizer, source = report_tokenizer(args, prefix)
        report = dataset_report(prefix, tokenizer, args.documents, args.max_chars, scan=args.scan, progress=progress)
    except UserInputError as err:       # IndexedDatasetError included: one line, as the docstring says
        print(f"inspect_dataset.py: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**report, "decoded_by": source}, indent=1, ensure_ascii=False))
    else:
        print_report(report, source)
    return 0


if __name__ == "__main__":
    sys.exit(quiet_when_the_reader_leaves(main))
