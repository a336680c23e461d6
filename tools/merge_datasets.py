"""Merge several Megatron .bin/.idx datasets into one (documents in the order given).

    python tools/merge_datasets.py --input data/part0_text_document data/part1_text_document \
        --output-prefix data/merged_text_document

--input takes dataset prefixes (with or without .bin/.idx) or directories (every .idx inside,
sorted by name, as Megatron's merge_datasets.py does). All inputs must share one dtype. Memory use
is bounded; the output appears only when complete.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_zaya.data.indexed import IndexedDataset, IndexedDatasetError, IndexedDatasetWriter  # noqa: E402


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


def merge(prefixes: list[str], output_prefix: str) -> IndexedDatasetWriter:
    if not prefixes:
        raise IndexedDatasetError("--input: nothing to merge")
    datasets = [IndexedDataset(p) for p in prefixes]  # validates every input before writing
    dtypes = {d.dtype.name for d in datasets}
    if len(dtypes) > 1:
        detail = ", ".join(f"{d.path_prefix}: {d.dtype.name}" for d in datasets)
        raise IndexedDatasetError(f"inputs have different dtypes ({detail}); re-tokenize with the same tokenizer")
    out = os.path.abspath(output_prefix)
    if out in {os.path.abspath(p) for p in prefixes}:
        raise IndexedDatasetError(f"--output-prefix {output_prefix} is also an input")
    writer = IndexedDatasetWriter(output_prefix, datasets[0].dtype)
    try:
        for p in prefixes:
            writer.add_index(p)
        writer.finalize()
    except BaseException:
        writer.abort()
        raise
    return writer


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="dataset prefixes or directories")
    p.add_argument("--output-prefix", required=True)
    args = p.parse_args(argv)
    try:
        prefixes = collect_prefixes(args.input)
        w = merge(prefixes, args.output_prefix)
    except IndexedDatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"merged {len(prefixes)} datasets: {w.num_documents:,} documents, {w.num_sequences:,} sequences, "
          f"{w.num_tokens:,} tokens -> {args.output_prefix}.bin/.idx")
    return 0


if __name__ == "__main__":
    sys.exit(main())
