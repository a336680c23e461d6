"""Streaming readers for raw corpora: JSONL (plain, .gz, .zst), Parquet and plain text.

`iter_records(paths, text_mode, columns)` yields `Record(source, line, raw)` where `raw` is the
undecoded bytes of one JSON line or one text document; decoding and parsing happen in the workers so
that errors are counted per record instead of aborting the run. Memory is bounded by one record (one
row batch for Parquet).
A file is JSONL when its name says so (.jsonl/.json/.ndjson) or when its first non-blank line is a
JSON object (`is_jsonl`); a .parquet file (the form of most published web corpora) is read a row batch
at a time with pyarrow (the optional `parquet` extra), each row handed on as the JSON object of its
`columns`, so the workers treat it as a JSONL line. Directories give only corpus files
(`is_corpus_file`).
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import sys
import zlib
from typing import Callable, Iterator, NamedTuple

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
PARQUET_BATCH_ROWS = 1024
TEXT_SUFFIXES = (".txt",)
COMPRESSION_SUFFIXES = (".gz", ".zst", ".zstd")
TEXT_MODES = ("file", "paragraph", "line")


class InputError(ValueError):
    """Bad --input: missing file, unsupported compression, nothing to read."""


class Record(NamedTuple):
    source: str
    line: int  # 1-based line number where the record starts
    raw: bytes
    is_json: bool


def is_corpus_file(name: str) -> bool:
    """Whether a file found inside a directory --input is taken: .jsonl/.json/.ndjson/.txt, each
    optionally compressed (.gz/.zst/.zstd), and .parquet. Anything else (a tokenizer's .vocab, a
    README.md, a .bin) is left out; name such a file explicitly to read it anyway."""
    base, _ = _strip_compression(name)
    return base.endswith(JSONL_SUFFIXES + TEXT_SUFFIXES) or is_parquet(name)


def is_parquet(path: str) -> bool:
    return path.endswith(PARQUET_SUFFIXES)


def holds_json_records(path: str) -> bool:
    """Whether `path`'s records are JSON objects with keys (JSONL or Parquet), not plain text."""
    return is_parquet(path) or is_jsonl(path)


def _model_folder_kind(folder: str) -> str | None:
    """'a training checkpoint folder' or 'a Hugging Face model folder' for such a folder (by the files that
    mark one), else None. The names are checkpoint/format.py's and hf_format.is_hf_folder's, spelled out here:
    importing megatron_zaya.checkpoint loads torch, which preprocessing and its workers never import."""
    names = set(os.listdir(folder))     # (a corpus may hold a metadata.json: a checkpoint's comes with COMPLETE)
    if "latest_checkpointed_iteration.txt" in names or {"metadata.json", "COMPLETE"} <= names or \
            any(n.startswith("iter_") and len(n) == 12 and n[5:].isdigit() for n in names):
        return "a training checkpoint folder"
    if "config.json" in names and any(n.endswith(".safetensors") for n in names):
        return "a Hugging Face model folder"
    return None


def check_json_keys(paths: list[str], keys: list[str], sample: int = 100) -> None:
    """A --json-keys key that none of the first `sample` JSON objects of the JSONL inputs holds (a misspelling):
    InputError naming it and the keys the first object has, before the corpus is read (it was found after
    reading all of it, every record skipped). The objects are taken in input order, the first 1,000 lines of
    a file at most (a corpus folder's metadata.json alone decides nothing)."""
    objects, source = [], None
    for path in (p for p in paths if not is_parquet(p) and is_jsonl(p)):
        for record in iter_records([path]):
            if len(objects) == sample or record.line > 10 * sample:
                break
            try:
                obj = json.loads(record.raw)
            except (ValueError, RecursionError):   # (malformed lines are skipped and counted by the run itself)
                continue
            if isinstance(obj, dict):
                objects.append(obj)
                source = source or path
        if len(objects) == sample:
            break
    for key in keys:
        if objects and not any(key in obj for obj in objects):
            raise InputError(f"--json-keys {key}: none of the first {len(objects)} records (from {source} on) has "
                             f"that key (the first has {', '.join(map(repr, list(objects[0])[:10])) or 'none'})")


def _expand_directory(spec: str, log) -> list[str]:
    """The corpus files under directory `spec`, recursively and sorted; logs what was taken and left."""
    taken, left = [], []
    for root, _, files in os.walk(spec):
        for f in files:
            if not f.startswith("."):
                (taken if is_corpus_file(f) else left).append(os.path.join(root, f))
    taken.sort()
    if log is not None:
        shown = ", ".join(os.path.relpath(p, spec) for p in taken[:5]) + (", ..." if len(taken) > 5 else "")
        msg = f"--input {spec}: taking {len(taken)} corpus file(s) ({shown})"
        if left:
            msg += (f"; ignoring {len(left)} other file(s) (e.g. {os.path.relpath(sorted(left)[0], spec)}), "
                    "only .jsonl/.json/.ndjson/.txt[.gz|.zst] and .parquet are read from directories")
        log(msg)
    return taken


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def expand_inputs(inputs: list[str], log=_stderr) -> list[str]:
    """Expand globs and directories (sorted, for a deterministic order); error on anything missing.
    Directories give only their corpus files (`is_corpus_file`), and `log` (None: silent) is told
    how many were taken; files and globs named explicitly are taken whatever their suffix."""
    paths: list[str] = []
    for spec in inputs:
        if os.path.isdir(spec):
            kind = _model_folder_kind(spec)
            if kind:
                raise InputError(f"--input {spec}: {kind}, not a corpus (its JSON and text files are no documents)")
            found = _expand_directory(spec, log)
        elif os.path.isfile(spec):         # before globbing: an existing name is taken as it is ("in [1].jsonl")
            found = [spec]
        elif any(c in spec for c in "*?["):
            found = sorted(glob.glob(spec))
        else:
            raise InputError(f"--input {spec}: no such file or directory")
        if not found:
            what = "holds no .jsonl/.json/.ndjson/.txt/.parquet files" if os.path.isdir(spec) else "matched no files"
            raise InputError(f"--input {spec}: {what}")
        paths.extend(found)
    return paths


def _strip_compression(path: str) -> tuple[str, str | None]:
    for ext, kind in ((".gz", "gzip"), (".zst", "zstd"), (".zstd", "zstd")):
        if path.endswith(ext):
            return path[: -len(ext)], kind
    return path, None


def is_jsonl(path: str) -> bool:
    """Whether `path` is read as JSONL: a .jsonl/.json/.ndjson name (optionally compressed), or any
    other file whose first non-blank line is a JSON object (as Megatron, which reads every input as
    JSONL). Other files are plain text."""
    base, _ = _strip_compression(path)
    if base.endswith(JSONL_SUFFIXES):
        return True
    return _first_line_is_json_object(path)


def _first_line_is_json_object(path: str) -> bool:
    """Sniff: does the first non-blank line parse as a JSON object? Reads one line (one record)."""
    try:
        with open_binary(path) as f:
            for _, line in _lines(f):
                if line.strip():
                    if not line.lstrip().startswith(b"{"):
                        return False
                    try:
                        return isinstance(json.loads(line), dict)
                    except ValueError:   # malformed JSON or not UTF-8: plain text
                        return False
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"--input {path}: read failed ({e})") from None
    return False


def open_binary(path: str) -> io.BufferedIOBase:
    """Open a possibly compressed file for binary reading."""
    _, kind = _strip_compression(path)
    if kind == "gzip":
        return gzip.open(path, "rb")
    if kind == "zstd":
        try:
            import zstandard
        except ImportError:
            raise InputError(f"--input {path}: reading .zst files needs the optional package 'zstandard' (pip install zstandard)") from None
        return io.BufferedReader(_ZstdFrames(path, zstandard), buffer_size=1 << 20)
    return open(path, "rb", buffering=1 << 20)


class _ZstdFrames(io.RawIOBase):
    """The decompressed bytes of every frame of a .zst file. An input that ends inside a frame (a download cut
    short) is a zstandard.ZstdError, as a truncated .gz is an EOFError: zstandard's stream_reader just stops
    there, and a truncated corpus became a smaller dataset without a word."""

    READ_BYTES = 1 << 18      # compressed bytes a read takes: the steps in which the progress on disk moves

    def __init__(self, path: str, zstandard):
        self._file, self._zstd = open(path, "rb"), zstandard
        self._frame = zstandard.ZstdDecompressor().decompressobj()
        self._in_frame = False
        self._out, self._at = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._at == len(self._out):
            chunk = self._file.read(self.READ_BYTES)
            if not chunk:
                if self._in_frame:
                    raise self._zstd.ZstdError("the file ends inside a zstd frame (truncated)")
                return 0
            out = []
            while chunk:
                self._in_frame = True
                out.append(self._frame.decompress(chunk))
                chunk = b""
                if self._frame.eof:       # the frame ended: what follows it starts the next one
                    chunk, self._in_frame = self._frame.unused_data, False
                    self._frame = self._zstd.ZstdDecompressor().decompressobj()
            self._out, self._at = b"".join(out), 0
        n = min(len(buffer), len(self._out) - self._at)
        buffer[:n] = self._out[self._at:self._at + n]
        self._at += n
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


class ReadPosition:
    """How far the reading of the inputs has come on disk, in bytes: the sizes of the files read to their end,
    plus the current file's offset (a compressed file's compressed bytes, a Parquet file's share of its
    rows). Progress counts it, as the bytes of the records are not the bytes on disk of a compressed input."""

    def __init__(self):
        self.finished, self._offset = 0, lambda: 0

    @property
    def bytes(self) -> int:
        return self.finished + self._offset()

    def follow(self, offset: Callable[[], int]) -> None:
        """The current file's offset on disk, asked whenever `bytes` is."""
        self._offset = offset

    def finish(self, path: str) -> None:
        self.finished += os.path.getsize(path)
        self._offset = lambda: 0


def _disk_offset(f) -> Callable[[], int]:
    """The offset in the file on disk under open_binary's `f` (its compressed bytes for .gz and .zst)."""
    under = getattr(f, "fileobj", None)           # gzip.GzipFile
    if isinstance(getattr(f, "raw", None), _ZstdFrames):
        under = f.raw._file
    return (under or f).tell


UTF8_BOM = b"\xef\xbb\xbf"


def _lines(f) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a binary file, with a UTF-8 byte-order mark at the file's start dropped (editors
    on Windows write one; json.loads refuses it)."""
    for lineno, line in enumerate(f, 1):
        yield lineno, line[len(UTF8_BOM):] if lineno == 1 and line.startswith(UTF8_BOM) else line


def _iter_jsonl(path: str, position: ReadPosition) -> Iterator[Record]:
    with open_binary(path) as f:
        position.follow(_disk_offset(f))
        for lineno, line in _lines(f):
            yield Record(path, lineno, line, True)


def _parquet_module(path: str):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(f"--input {path}: reading Parquet files needs the optional package 'pyarrow' "
                         "(pip install pyarrow, or scripts/install.sh parquet)") from None
    return pq


def _parquet_error(path: str, e: Exception):
    """InputError for pyarrow's errors (not a Parquet file, a corrupt one); None for any other."""
    if type(e).__module__.startswith("pyarrow"):
        return InputError(f"--input {path}: not a readable Parquet file ({e})")
    return None


def check_parquet_columns(paths: list[str], columns: list[str]) -> None:
    """Before any work: every Parquet input has each of `columns` (--json-keys); reads only the footers.
    A column missing from a file would skip every row of it, which is a wrong --json-keys."""
    for path in paths:
        if not is_parquet(path):
            continue
        try:
            names = _parquet_module(path).ParquetFile(path).schema_arrow.names
        except OSError as e:
            raise InputError(f"--input {path}: read failed ({e})") from None
        except Exception as e:
            raise (_parquet_error(path, e) or e) from None
        missing = [c for c in columns if c not in names]
        if missing:
            raise InputError(f"--json-keys {' '.join(missing)}: no such column in {path} (its columns: {', '.join(names)})")


def _iter_parquet(path: str, columns: list[str] | None, position: ReadPosition) -> Iterator[Record]:
    """One Record per row: the JSON object of `columns` (those the file has; None: every column),
    line = the row's 1-based number in the file."""
    pq = _parquet_module(path)
    try:
        # pre_buffer off: with it, pyarrow kept every row group it had read until the file closed
        # (pyarrow 26: +23 MB per 10,000 rows of web text); without it memory holds one row group.
        parquet = pq.ParquetFile(path, pre_buffer=False)
        names = parquet.schema_arrow.names
        wanted = names if columns is None else [c for c in columns if c in names]
        row, rows, size = 0, max(1, parquet.metadata.num_rows), os.path.getsize(path)
        position.follow(lambda: size * row // rows)
        # No requested column in the file: empty rows, which the workers count as missing keys.
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=wanted):
            for values in batch.to_pylist():
                row += 1
                yield Record(path, row, json.dumps(values, ensure_ascii=False, default=str).encode("utf-8"), True)
    except OSError:
        raise
    except Exception as e:   # pyarrow.ArrowInvalid etc.: not a Parquet file, or a corrupt one
        raise (_parquet_error(path, e) or e) from None


def _iter_text(path: str, mode: str, position: ReadPosition) -> Iterator[Record]:
    with open_binary(path) as f:
        position.follow(_disk_offset(f))
        if mode == "file":
            text = f.read()
            yield Record(path, 1, text[len(UTF8_BOM):] if text.startswith(UTF8_BOM) else text, False)
            return
        if mode == "line":
            for lineno, line in _lines(f):
                yield Record(path, lineno, line.rstrip(b"\r\n"), False)
            return
        # A paragraph's lines joined by LF, whatever break the file uses (CR LF), as line mode drops either.
        block: list[bytes] = []
        start = 1
        for lineno, line in _lines(f):
            if line.strip():
                if not block:
                    start = lineno
                block.append(line.rstrip(b"\r\n"))
            elif block:
                yield Record(path, start, b"\n".join(block), False)
                block = []
        if block:
            yield Record(path, start, b"\n".join(block), False)


def iter_records(paths: list[str], text_mode: str = "file", columns: list[str] | None = None,
                 position: ReadPosition | None = None) -> Iterator[Record]:
    """Yield raw records from every input: one per JSONL line or Parquet row (`columns`: the keys a
    Parquet row keeps; None: all), or per text document (`text_mode`: 'file' = a whole file,
    'paragraph' = a blank-line-separated block, 'line' = a line). `position` follows the reading on disk."""
    if text_mode not in TEXT_MODES:
        raise InputError(f"--text-mode {text_mode!r}: choose one of {TEXT_MODES}")
    position = position or ReadPosition()
    for path in paths:
        try:
            if is_parquet(path):
                yield from _iter_parquet(path, columns, position)
            elif is_jsonl(path):
                yield from _iter_jsonl(path, position)
            else:
                yield from _iter_text(path, text_mode, position)
            position.finish(path)
        except (OSError, EOFError, zlib.error) as e:
            raise InputError(f"--input {path}: read failed ({e})") from None
        except Exception as e:
            if type(e).__module__.startswith("zstandard") or type(e).__name__ == "ZstdError":
                raise InputError(f"--input {path}: read failed (corrupt zstd data: {e})") from None
            raise


def input_size(paths: list[str]) -> int:
    """Total size on disk (compressed size for compressed inputs and Parquet), for progress reporting."""
    return sum(os.path.getsize(p) for p in paths)
