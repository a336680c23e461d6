"""Merge several Megatron .bin/.idx datasets into one (documents in the order given).

    python tools/merge_datasets.py --input data/part0_text_document data/part1_text_document \
        --output-prefix data/merged_text_document

--input takes dataset prefixes (with or without .bin/.idx) or directories (every .idx inside,
sorted by name, as Megatron's merge_datasets.py does). All inputs must share one dtype. Memory use
is bounded; the output appears only when complete. An existing output is refused unless
--overwrite is given (also one another run writes while this one merges: one line naming it), and
the output may never be one of the inputs (compared after stripping .bin/.idx and resolving links).
Inputs preprocessed with different tokenizers (their PREFIX.tokenizer.json, megatron_zaya/data/
dataset_tokenizer.py) are refused; the output gets their record when every input has one.
Exit status: 0 merged, 2 on a bad input or output, 130 when interrupted (Ctrl-C or SIGTERM: no output is
left, temporary files removed; one that comes while the finished output replaces the old one waits, and the
merge completes).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_zaya.data.dataset_tokenizer import (  # noqa: E402
    SUFFIX, describe, differences, read_record, remove_record, write_record)
from megatron_zaya.data.indexed import (  # noqa: E402
    IndexedDataset,
    IndexedDatasetError,
    IndexedDatasetWriter,
    strip_suffix,
    bin_path,
    existing_outputs,
    idx_path,
)
from megatron_zaya.errors import UserInputError  # noqa: E402
from megatron_zaya.interrupts import interrupt_on_sigterm, signals_held  # noqa: E402
from megatron_zaya.publish import written_meanwhile  # noqa: E402


def collect_prefixes(inputs: list[str]) -> list[str]:
    prefixes: list[str] = []
    for spec in inputs:
        if os.path.isdir(spec):
            found = sorted(os.path.join(spec, f[:-4]) for f in os.listdir(spec) if f.endswith(".idx"))
            if not found:
                raise IndexedDatasetError(f"--input {spec}: directory holds no .idx files")
            prefixes.extend(found)
        else:
            prefixes.append(spec[:-4] if spec.endswith((".idx", ".bin")) else spec)
    return prefixes


def _identity(prefix: str) -> set[str]:
    """Real paths naming the dataset at `prefix`: the prefix itself and its .bin/.idx files."""
    prefix = strip_suffix(prefix)
    return {os.path.realpath(prefix), os.path.realpath(bin_path(prefix)), os.path.realpath(idx_path(prefix))}


def check_output(prefixes: list[str], output_prefix: str, overwrite: bool = False) -> None:
    """Refuse an output that is one of the inputs, or that exists (unless `overwrite`)."""
    out = _identity(output_prefix)
    for p in prefixes:
        if out & _identity(p):
            raise IndexedDatasetError(f"--output-prefix {output_prefix} is also an input ({p})")
    existing = existing_outputs(output_prefix)
    if existing and not overwrite:
        raise IndexedDatasetError(f"--output-prefix {output_prefix}: {existing[0]} already exists "
                                  f"(pass --overwrite to replace it)")


def merge(prefixes: list[str], output_prefix: str, overwrite: bool = False, log=None) -> IndexedDatasetWriter:
    """Write the documents of every input, in order, to `output_prefix`; `log` gets a line per input."""
    if not prefixes:
        raise IndexedDatasetError("--input: nothing to merge")
    check_output(prefixes, output_prefix, overwrite)
    datasets = [IndexedDataset(p) for p in prefixes]  # validates every input before writing
    dtypes = {d.dtype.name for d in datasets}
    if len(dtypes) > 1:
        detail = ", ".join(f"{d.path_prefix}: {d.dtype.name}" for d in datasets)
        raise IndexedDatasetError(f"inputs have different dtypes ({detail}); re-tokenize with the same tokenizer")
    record = merged_tokenizer_record(prefixes, log)
    writer = IndexedDatasetWriter(output_prefix, datasets[0].dtype, log)   # (removes a killed merge's leftovers)
    try:
        for i, (p, d) in enumerate(zip(prefixes, datasets), 1):
            writer.add_index(p)
            if log is not None:
                log(f"[{i}/{len(prefixes)}] merged {p}: {d.num_documents:,} documents, {len(d):,} sequences")
        writer.prepare()
    except BaseException:
        writer.abort()
        raise
    # The old dataset is replaced from here on: a signal waits until the new one, with its record, is in place
    # (cut in the middle, it left neither dataset whole and still said "no output written").
    with signals_held() as held:
        try:
            if overwrite:
                remove_record(writer.path_prefix)     # a failure from here on leaves no record, never a stale one
            writer.commit(replace=overwrite)          # without --overwrite, nothing is replaced
        except FileExistsError as err:                # another run wrote the output since check_output
            writer.abort()
            raise IndexedDatasetError(written_meanwhile(output_prefix, err)) from None
        except BaseException:
            writer.abort()
            raise
        if record is not None:
            write_record(writer.path_prefix, record)
    if held and log is not None:
        log(f"{held[0]} came while {output_prefix} was put in place: the merge is complete")
    return writer


def merged_tokenizer_record(prefixes: list[str], log=None) -> dict | None:
    """The tokenizer record (PREFIX.tokenizer.json, data/dataset_tokenizer.py) the merged dataset gets: the
    inputs' when every input has one; IndexedDatasetError when two inputs were written by different
    tokenizers; None (said to `log`) when some input has none."""
    records = {p: read_record(p) for p in prefixes}       # (an input given twice is read once)
    known = [(p, r) for p, r in records.items() if r is not None]
    for p, r in known[1:]:
        differ = differences(r, known[0][1], (f"{p}'s", f"{known[0][0]}'s"))
        if differ:
            raise IndexedDatasetError(f"--input {p} and {known[0][0]} were preprocessed with different tokenizers "
                                      f"({describe(r)}; {describe(known[0][1])}): {'; '.join(differ)}")
    if len(known) < len(records):
        if known and log is not None:
            log(f"{len(records) - len(known)} of the {len(records)} inputs have no {SUFFIX} (preprocessed "
                f"elsewhere): the merged dataset gets none, and its tokenizer is not checked by training")
        return None
    return known[0][1]


def main(argv=None) -> int:
    return interrupt_on_sigterm(_main, argv, "merge_datasets.py")   # a killed job removes its temporary files too


def _main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="dataset prefixes or directories")
    p.add_argument("--output-prefix", required=True)
    p.add_argument("--overwrite", action="store_true", help="replace an existing output dataset")
    args = p.parse_args(argv)
    try:
        prefixes = collect_prefixes(args.input)
        w = merge(prefixes, args.output_prefix, args.overwrite, log=lambda m: print(m, file=sys.stderr))
    except UserInputError as e:        # IndexedDatasetError included
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:               # a full disk, a folder not writable: the temporary files are removed
        print(f"error: {args.output_prefix}: {e}", file=sys.stderr)
        return 2
    print(f"merged {len(prefixes)} datasets: {w.num_documents:,} documents, {w.num_sequences:,} sequences, "
          f"{w.num_tokens:,} tokens -> {args.output_prefix}.bin/.idx")
    return 0


if __name__ == "__main__":
    sys.exit(main())
