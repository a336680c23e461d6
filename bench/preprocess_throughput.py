"""Preprocessing throughput and peak memory on a generated corpus (tools/preprocess_data.py).

    python bench/preprocess_throughput.py --size-mb 200 --workers 1 2
    python bench/preprocess_throughput.py --size-mb 100 --workers 2 --formats jsonl parquet

Generates ~SIZE MB of pseudo-English JSONL (megatron_zaya/data/synthetic.py), trains a 32K BPE
SentencePiece tokenizer on a 10 MB sample, then runs preprocess_data.py (GPTSentencePieceTokenizer,
--append-eod) with each worker count, measuring wall time, tokens/s and the peak resident memory of
the whole process tree (main + workers, sampled from /proc every 20 ms) and the CPU time of all
its processes (tokens per CPU-second does not depend on other load on the machine; the load
average at the start of each run is printed too). A run on a quarter of the corpus shows whether
peak memory grows with the input. `--formats parquet` also writes the same documents as Parquet (a
`text` column, snappy, row groups of 10,000 rows; needs pyarrow) and preprocesses that. Prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from megatron_zaya.data.synthetic import TextGenerator  # noqa: E402


def generate(path: str, size_mb: float, seed: int = 0) -> int:
    gen = TextGenerator(seed, lexicon_size=60000)
    target = int(size_mb * 1e6)
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            line = json.dumps({"text": gen.document()}) + "\n"
            f.write(line)
            written += len(line)
    return written


def head(src: str, dst: str, size: int) -> None:
    n = 0
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        for line in fi:
            fo.write(line)
            n += len(line)
            if n >= size:
                break


def to_parquet(src: str, dst: str, rows_per_group: int = 10_000) -> None:
    """The documents of JSONL `src` as Parquet `dst` with one `text` column, written a row group at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("text", pa.string())])
    with open(src, encoding="utf-8") as fi, pq.ParquetWriter(dst, schema) as writer:
        texts = []
        for line in fi:
            texts.append(json.loads(line)["text"])
            if len(texts) == rows_per_group:
                writer.write_table(pa.table({"text": texts}, schema=schema))
                texts = []
        if texts:
            writer.write_table(pa.table({"text": texts}, schema=schema))


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and all its descendants."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def run_preprocess(inp: str, out: str, model: str, workers: int) -> dict:
    cmd = [sys.executable, os.path.join(ROOT, "tools", "preprocess_data.py"), "--input", inp, "--output-prefix", out,
           "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", model, "--append-eod",
           "--workers", str(workers), "--no-progress", "--overwrite"]
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss_bytes(proc.pid))
        time.sleep(0.02)
    wall = time.time() - t0
    stdout, stderr = proc.communicate()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"preprocess_data.py failed ({proc.returncode}):\n{stderr}")
    tokens = int(re.search(r"tokens:\s+([\d,]+)", stdout).group(1).replace(",", ""))
    docs = int(re.search(r"documents:\s+([\d,]+)", stdout).group(1).replace(",", ""))
    return {"wall_s": wall, "cpu_s": cpu, "load": load, "tokens": tokens, "documents": docs, "peak_rss_mb": peak / 2**20,
            "tokens_per_s": tokens / wall, "input_mb": os.path.getsize(inp) / 1e6}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mb", type=float, default=200)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--workdir", default=None, help="keep files here (default: a temporary directory)")
    p.add_argument("--formats", nargs="+", default=["jsonl"], choices=["jsonl", "parquet"])
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or tmp
        os.makedirs(work, exist_ok=True)
        corpus = os.path.join(work, "corpus.jsonl")
        t0 = time.time()
        size = generate(corpus, args.size_mb)
        print(f"generated {size / 1e6:.0f} MB in {time.time() - t0:.0f}s", file=sys.stderr)
        sample = os.path.join(work, "sample.jsonl")
        head(corpus, sample, 10_000_000)
        model_prefix = os.path.join(work, "sp")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train_tokenizer.py"), "--input", sample,
                        "--vocab-size", str(args.vocab_size), "--output-prefix", model_prefix, "--overwrite"], check=True,
                       stdout=subprocess.DEVNULL)
        quarter = os.path.join(work, "quarter.jsonl")
        head(corpus, quarter, size // 4)
        inputs = {"jsonl": (quarter, corpus)}
        if "parquet" in args.formats:
            inputs["parquet"] = tuple(path[:-len(".jsonl")] + ".parquet" for path in (quarter, corpus))
            for jsonl, parquet in zip(inputs["jsonl"], inputs["parquet"]):
                to_parquet(jsonl, parquet)
        rows = []
        for w in args.workers:
            for fmt in args.formats:
                for inp in inputs[fmt]:
                    r = run_preprocess(inp, os.path.join(work, f"out_w{w}"), model_prefix + ".model", w)
                    r["workers"], r["format"] = w, fmt
                    rows.append(r)
                    print(f"workers={w} {fmt} input={r['input_mb']:.0f}MB: {r['tokens_per_s'] / 1e6:.2f}M tokens/s, "
                          f"peak {r['peak_rss_mb']:.0f} MB", file=sys.stderr)
    cpu = os.cpu_count()
    print(f"\nCorpus: generated pseudo-English JSONL; tokenizer: SentencePiece BPE, vocab {args.vocab_size}, "
          f"GPTSentencePieceTokenizer, --append-eod; machine: {cpu} CPU cores.\n")
    print("| workers | format | input MB (on disk) | documents | tokens | wall s | tokens/s (wall) | CPU s (all processes) | "
          "tokens per CPU-s | load avg at start | peak RSS (all processes) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workers']} | {r['format']} | {r['input_mb']:.0f} | {r['documents']:,} | {r['tokens']:,} | {r['wall_s']:.1f} | "
              f"{r['tokens_per_s'] / 1e6:.2f}M | {r['cpu_s']:.1f} | {r['tokens'] / max(r['cpu_s'], 1e-9) / 1e6:.2f}M | "
              f"{r['load']:.1f} | {r['peak_rss_mb']:.0f} MB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
