"""Memory-mapped indexed dataset in Megatron-LM's `.bin` + `.idx` format (reader and writer).

Layout (little-endian, no padding), see docs/DATA.md and the format spec:

    .idx: magic b"MMIDIDX\\x00\\x00" | uint64 version=1 | uint8 dtype code | uint64 N | uint64 D
          | int32[N] sequence lengths | int64[N] byte pointers into .bin | int64[D] document indices
          | (int8[N] sequence modes, multimodal only)
    .bin: the tokens of all sequences, concatenated, in the index's dtype.

The reader validates everything it can on open and raises `IndexedDatasetError` naming the file
and the problem. The writer writes to temporary names and renames on `finalize()`, so an
interrupted run never leaves a valid-looking half dataset.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from megatron_zaya.errors import UserInputError
from megatron_zaya.leftovers import TEMPORARY_SUFFIX_PATTERN, remove_leftovers, temporary_suffix
from megatron_zaya.publish import put_in_place

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_SIZE = 9 + 8 + 1 + 8 + 8  # 34 bytes
CHECK_CHUNK = 1 << 22   # index entries read at a time by the whole-index check
WRITE_CHUNK = 1 << 22   # index entries copied at a time when writing or merging an index

DTYPE_CODES: dict[int, type] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
CODE_OF_DTYPE = {np.dtype(v): k for k, v in DTYPE_CODES.items()}


class IndexedDatasetError(UserInputError):
    """A `.bin`/`.idx` pair is missing, truncated or corrupted."""


def optimal_dtype(vocab_size: int | None) -> type:
    """Megatron's rule: uint16 when the vocabulary is below 65,500 tokens, int32 otherwise."""
    if vocab_size is not None and vocab_size < 65500:
        return np.uint16
    return np.int32


def idx_path(prefix: str) -> str:
    return prefix + ".idx"


def bin_path(prefix: str) -> str:
    return prefix + ".bin"


def strip_suffix(path_prefix: str) -> str:
    for ext in (".idx", ".bin"):
        if path_prefix.endswith(ext):
            return path_prefix[: -len(ext)]
    return path_prefix


class IndexHeader(NamedTuple):
    """What the 34-byte header of an `.idx` says, checked against the file size."""

    prefix: str
    dtype: np.dtype
    num_sequences: int
    num_document_indices: int
    idx_size: int
    base: int          # bytes of the index without the optional sequence modes


def read_header(path_prefix: str) -> IndexHeader:
    """Read and check the `.idx` header of a `.bin`/`.idx` pair: both files exist, magic, version,
    dtype code, and an index size consistent with the counts. O(1): reads 34 bytes."""
    prefix = strip_suffix(str(path_prefix))
    ipath, bpath = idx_path(prefix), bin_path(prefix)
    for p in (ipath, bpath):
        if not os.path.isfile(p):
            raise IndexedDatasetError(f"{p}: file not found (expected a .bin/.idx pair for prefix {prefix!r})")
    idx_size = os.path.getsize(ipath)
    if idx_size < HEADER_SIZE:
        raise IndexedDatasetError(f"{ipath}: truncated index ({idx_size} bytes, the header alone is {HEADER_SIZE})")
    with open(ipath, "rb") as f:
        header = f.read(HEADER_SIZE)
    magic = header[:9]
    if magic != MAGIC:
        raise IndexedDatasetError(f"{ipath}: bad magic {magic!r}, expected {MAGIC!r} (not a Megatron MMIDIDX index)")
    (version,) = struct.unpack("<Q", header[9:17])
    if version != VERSION:
        raise IndexedDatasetError(f"{ipath}: unsupported version {version}, expected {VERSION}")
    code = header[17]
    if code not in DTYPE_CODES:
        raise IndexedDatasetError(f"{ipath}: unknown dtype code {code} (valid: {sorted(DTYPE_CODES)})")
    n, d = struct.unpack("<QQ", header[18:34])
    base = HEADER_SIZE + 12 * n + 8 * d
    if idx_size not in (base, base + n):
        raise IndexedDatasetError(
            f"{ipath}: size {idx_size} bytes is inconsistent with {n} sequences and {d} document "
            f"indices (expected {base} bytes, or {base + n} with sequence modes); truncated or corrupted"
        )
    return IndexHeader(prefix, np.dtype(DTYPE_CODES[code]), n, d, idx_size, base)


def check_indexed_dataset(path_prefix: str) -> IndexHeader:
    """Cheap open-time check of a `.bin`/`.idx` pair, for validating flags before any work: the
    header (`read_header`), the first and last document index, and the `.bin` size against the
    last sequence's pointer and length. Reads a few dozen bytes whatever the dataset's size;
    `IndexedDataset(prefix)` checks every pointer. Raises `IndexedDatasetError` naming the file."""
    h = read_header(path_prefix)
    ipath, bpath = idx_path(h.prefix), bin_path(h.prefix)
    n, d = h.num_sequences, h.num_document_indices
    if d < 1:
        raise IndexedDatasetError(f"{ipath}: document index is empty (it must start with 0)")
    with open(ipath, "rb") as f:
        f.seek(HEADER_SIZE + 12 * n)
        first = struct.unpack("<q", f.read(8))[0]
        f.seek(HEADER_SIZE + 12 * n + 8 * (d - 1))
        last = struct.unpack("<q", f.read(8))[0]
        expected_bin = 0
        if n:
            f.seek(HEADER_SIZE + 4 * (n - 1))
            length = struct.unpack("<i", f.read(4))[0]
            f.seek(HEADER_SIZE + 4 * n + 8 * (n - 1))
            pointer = struct.unpack("<q", f.read(8))[0]
            expected_bin = pointer + length * h.dtype.itemsize
    if first != 0 or last != n:
        raise IndexedDatasetError(f"{ipath}: document indices must run from 0 to {n} (the number of sequences), "
                                  f"got {first}..{last}")
    bin_size = os.path.getsize(bpath)
    if bin_size != expected_bin:
        raise IndexedDatasetError(f"{bpath}: size {bin_size} bytes does not match the index (its last sequence "
                                  f"ends at byte {expected_bin}); truncated or mismatched pair")
    return h


class _FileReads:
    """A .bin read with positional reads (os.pread) instead of a memory map: Megatron-LM's
    --no-mmap-bin-files, for file systems where mapping huge files is slow or refused. Each process
    opens its own descriptor (pickling keeps only the path, so loader workers reopen it)."""

    def __init__(self, path: str):
        self.path = path
        self._fd, self._pid = None, None

    def read(self, dtype: np.dtype, count: int, offset: int) -> np.ndarray:
        if self._fd is None or self._pid != os.getpid():
            self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        nbytes = count * dtype.itemsize
        data = os.pread(self._fd, nbytes, offset)
        if len(data) != nbytes:
            raise IndexedDatasetError(f"{self.path}: read {len(data)} of {nbytes} bytes at offset {offset} "
                                      f"(the file is shorter than its .idx says)")
        return np.frombuffer(data, dtype=dtype)

    def __getstate__(self):
        return {"path": self.path}

    def __setstate__(self, state):
        self.__init__(state["path"])

    def __del__(self):
        try:
            if self._fd is not None and self._pid == os.getpid():
                os.close(self._fd)
        except Exception:   # at interpreter exit os may already be torn down: nothing left to release
            pass


class _MappedReads:
    """A .bin read through a read-only memory map (the default): views, no copies."""

    def __init__(self, path: str):
        self.buffer = np.memmap(path, mode="r", dtype=np.uint8) if os.path.getsize(path) else np.zeros(0, np.uint8)

    def read(self, dtype: np.dtype, count: int, offset: int) -> np.ndarray:
        return np.frombuffer(self.buffer, dtype=dtype, count=count, offset=offset)


class IndexedDataset:
    """Read-only view of a Megatron indexed dataset.

    `ds[i]` is sequence i as a read-only numpy array (a view into the memory map of the .bin, or, with
    mmap_bin=False, the bytes of one positional read); `ds.get(i, offset, length)` reads part of it.
    `sequence_lengths` (int32[N]), `sequence_pointers` (int64[N]) and `document_indices` (int64[D])
    are memory-mapped arrays of the .idx.
    """

    def __init__(self, path_prefix: str, mmap_bin: bool = True, validate: bool = True):
        """`validate=False` skips the checks that read the whole index (the pointers against the lengths,
        the .bin size against their sum): a loader worker reopening a pair its parent process checked."""
        header = read_header(path_prefix)
        self.path_prefix, self.dtype = header.prefix, header.dtype
        ipath, bpath = idx_path(self.path_prefix), bin_path(self.path_prefix)
        n, d, idx_size, base = header.num_sequences, header.num_document_indices, header.idx_size, header.base
        self.multimodal = idx_size == base + n and n > 0
        self._idx_mmap = np.memmap(ipath, mode="r", dtype=np.uint8) if idx_size else None
        buf = self._idx_mmap
        self.sequence_lengths = np.frombuffer(buf, dtype=np.int32, count=n, offset=HEADER_SIZE)
        self.sequence_pointers = np.frombuffer(buf, dtype=np.int64, count=n, offset=HEADER_SIZE + 4 * n)
        self.document_indices = np.frombuffer(buf, dtype=np.int64, count=d, offset=HEADER_SIZE + 12 * n)
        self.sequence_modes = (
            np.frombuffer(buf, dtype=np.int8, count=n, offset=base) if self.multimodal else None
        )
        self.mmap_bin = mmap_bin
        if validate:
            self._validate(ipath, bpath, n, d)
        else:
            self.num_tokens = (int(self.sequence_pointers[-1]) // self.dtype.itemsize + int(self.sequence_lengths[-1])
                               if n else 0)
        self._bin = _MappedReads(bpath) if mmap_bin else _FileReads(bpath)

    def _validate(self, ipath: str, bpath: str, n: int, d: int) -> None:
        """Every document index, length and pointer, read CHECK_CHUNK entries at a time: memory stays small
        whatever the index's size (a whole-array temporary of a corpus of billions of sequences would not
        fit)."""
        if d < 1:
            raise IndexedDatasetError(f"{ipath}: document index is empty (it must start with 0)")
        step, docs = CHECK_CHUNK, self.document_indices
        if docs[0] != 0 or docs[-1] != n:
            raise IndexedDatasetError(
                f"{ipath}: document indices must run from 0 to {n} (the number of sequences), got {int(docs[0])}..{int(docs[-1])}"
            )
        for a in range(0, d - 1, step):
            chunk = docs[a:a + step + 1]
            if np.any(chunk[1:] < chunk[:-1]):
                raise IndexedDatasetError(f"{ipath}: document indices are not non-decreasing; corrupted index")
        itemsize = self.dtype.itemsize
        ptr, lens = self.sequence_pointers, self.sequence_lengths
        carry = 0           # bytes of the sequences before the chunk
        for a in range(0, n, step):
            chunk = lens[a:a + step]
            if np.any(chunk < 0):
                raise IndexedDatasetError(f"{ipath}: negative sequence length; corrupted index")
            ends = carry + np.cumsum(chunk, dtype=np.int64) * itemsize
            expected, got = ends - chunk * itemsize, ptr[a:a + step]
            if not np.array_equal(got, expected):
                bad = a + int(np.argmax(got != expected))
                raise IndexedDatasetError(
                    f"{ipath}: sequence pointer {bad} is {int(ptr[bad])}, expected "
                    f"{int(expected[bad - a])} from the sequence lengths; corrupted index"
                )
            carry = int(ends[-1])
        total_tokens = carry // itemsize
        bin_size = os.path.getsize(bpath)
        if bin_size != carry:
            raise IndexedDatasetError(
                f"{bpath}: size {bin_size} bytes does not match the index ({total_tokens} tokens x "
                f"{itemsize} bytes of {self.dtype.name} = {carry}); truncated or mismatched pair"
            )
        self.num_tokens = total_tokens

    def __len__(self) -> int:
        return int(self.sequence_lengths.shape[0])

    # Loader workers get the path and reopen the maps instead of a pickled copy of the data; the parent
    # checked the pair, so a worker does not read the whole index again (ZAYA1-sized data: minutes).
    def __getstate__(self):
        return {"path_prefix": self.path_prefix, "mmap_bin": self.mmap_bin}

    def __setstate__(self, state):
        self.__init__(state["path_prefix"], state.get("mmap_bin", True), validate=False)

    @property
    def num_documents(self) -> int:
        return int(self.document_indices.shape[0]) - 1

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens [offset, offset+length) of sequence `idx` (to its end if length is None)."""
        seq_len = int(self.sequence_lengths[idx])
        if length is None:
            length = seq_len - offset
        if offset < 0 or length < 0 or offset + length > seq_len:
            raise IndexError(f"{self.path_prefix}: slice [{offset}, {offset + length}) outside sequence {idx} of length {seq_len}")
        start = int(self.sequence_pointers[idx]) + offset * self.dtype.itemsize
        return self._bin.read(self.dtype, length, start) if length else np.zeros(0, self.dtype)

    def __getitem__(self, idx):
        if isinstance(idx, (int, np.integer)):
            n = len(self)
            if idx < 0:
                idx += n
            if not 0 <= idx < n:
                raise IndexError(f"{self.path_prefix}: sequence index {idx} out of range [0, {n})")
            return self.get(int(idx))
        if isinstance(idx, slice):
            return [self.get(i) for i in range(*idx.indices(len(self)))]
        raise TypeError(f"unsupported index type {type(idx).__name__}")

    def tokens_in(self, first: int, stop: int) -> int:
        """How many tokens sequences [first, stop) hold, from two pointers (the index is checked)."""
        if not 0 <= first <= stop <= len(self):
            raise IndexError(f"{self.path_prefix}: sequences [{first}, {stop}) outside [0, {len(self)})")
        if first == stop:
            return 0
        end = int(self.sequence_pointers[stop - 1]) + int(self.sequence_lengths[stop - 1]) * self.dtype.itemsize
        return (end - int(self.sequence_pointers[first])) // self.dtype.itemsize

    def tokens(self, start: int, count: int) -> np.ndarray:
        """`count` tokens from token `start` of the .bin, where the sequences lie back to back in order."""
        if start < 0 or count < 0 or start + count > self.num_tokens:
            raise IndexError(f"{self.path_prefix}: tokens [{start}, {start + count}) outside [0, {self.num_tokens})")
        return self._bin.read(self.dtype, count, start * self.dtype.itemsize) if count else np.zeros(0, self.dtype)

    def document(self, doc: int) -> np.ndarray:
        """All tokens of document `doc` (its sequences concatenated)."""
        a, b = int(self.document_indices[doc]), int(self.document_indices[doc + 1])
        if a == b:
            return np.zeros(0, self.dtype)
        start = int(self.sequence_pointers[a])
        count = int(self.sequence_lengths[a:b].sum(dtype=np.int64))
        return self._bin.read(self.dtype, count, start)


class IndexedDatasetWriter:
    """Streams sequences into `prefix.bin`/`prefix.idx` with bounded memory.

    Tokens go straight to a temporary `.bin`; sequence lengths and document boundaries are spilled
    to temporary side files, and `finalize()` assembles the `.idx` from them in chunks, so memory
    does not grow with the dataset. `finalize()` renames into place; `abort()` (or an exception
    inside a `with` block) deletes everything. Starting, it removes what a writer of the same prefix
    killed by SIGKILL left (`remove_leftover_temporaries`; `log` gets the line saying so, else stderr).
    """

    _SPILL = 1 << 20  # entries buffered before spilling to the side files

    def __init__(self, path_prefix: str, dtype=np.int32, log=None):
        self.path_prefix = strip_suffix(str(path_prefix))
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODE_OF_DTYPE:
            raise ValueError(f"unsupported dtype {self.dtype} for an indexed dataset (use one of {sorted(str(np.dtype(t)) for t in DTYPE_CODES.values())})")
        parent = os.path.dirname(os.path.abspath(self.path_prefix))
        os.makedirs(parent, exist_ok=True)
        remove_leftover_temporaries(self.path_prefix, log)   # a killed earlier writer's (as large as it wrote)
        self._bin_tmp, self._len_tmp, self._doc_tmp, self._idx_tmp = temporary_paths(self.path_prefix)
        opened = []
        try:   # an interrupt between the opens must not leave a temporary file behind
            for path in (self._bin_tmp, self._len_tmp, self._doc_tmp):
                opened.append(open(path, "wb"))
        except BaseException:
            for f in opened:
                f.close()
            remove_temporaries(self.path_prefix)  # by name: the interrupt may land after open() returned
            raise
        self._bin, self._len_f, self._doc_f = opened
        self._lengths: list[np.ndarray] = []
        self._doc_ends: list[np.ndarray] = []
        self._buffered = 0
        self._num_sequences = 0
        self._num_documents = 0
        self._num_tokens = 0
        self._closed = False
        self._prepared = False
        self.multimodal: bool | None = None     # decided by the first content: add_index of a multimodal dataset
        self._mode_sources: list[str] = []      # the datasets whose sequence modes the index ends with
        self._max_value = np.iinfo(self.dtype).max if self.dtype.kind in "iu" else None
        self._min_value = np.iinfo(self.dtype).min if self.dtype.kind in "iu" else None

    @property
    def num_sequences(self) -> int:
        return self._num_sequences

    @property
    def num_documents(self) -> int:
        return self._num_documents

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    def _write_tokens(self, tokens: np.ndarray) -> None:
        arr = np.asarray(tokens)
        if arr.size and self._max_value is not None and arr.dtype != self.dtype:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < self._min_value or hi > self._max_value:
                raise ValueError(
                    f"{self.path_prefix}: token id range [{lo}, {hi}] does not fit {self.dtype.name}; "
                    f"use a wider dtype (int32 for vocabularies of 65,500 or more)"
                )
        self._bin.write(np.ascontiguousarray(arr, dtype=self.dtype).tobytes())

    def _record(self, lengths: np.ndarray, doc_ends: np.ndarray) -> None:
        self._lengths.append(lengths.astype("<i4"))
        self._doc_ends.append(doc_ends.astype("<i8"))
        self._buffered += len(lengths) + len(doc_ends)
        self._num_sequences += len(lengths)
        self._num_documents += len(doc_ends)
        self._num_tokens += int(lengths.sum(dtype=np.int64))
        if self._buffered >= self._SPILL:
            self._spill()

    def _spill(self) -> None:
        for chunk in self._lengths:
            self._len_f.write(chunk.tobytes())
        for chunk in self._doc_ends:
            self._doc_f.write(chunk.tobytes())
        self._lengths, self._doc_ends, self._buffered = [], [], 0

    def add_document(self, tokens: Sequence[int] | np.ndarray, lengths: Sequence[int] | None = None) -> None:
        """Append one document; `lengths` splits it into sequences (default: one sequence)."""
        arr = np.asarray(tokens)
        if lengths is None:
            lengths = [arr.size]
        lens = np.asarray(lengths, dtype=np.int64)
        if int(lens.sum()) != arr.size:
            raise ValueError(f"sequence lengths {list(lens)} do not sum to the document length {arr.size}")
        self.add_documents(arr, lens, np.array([len(lens)], np.int64))

    def add_documents(self, tokens: np.ndarray, sequence_lengths: np.ndarray, sequences_per_document: np.ndarray | None = None) -> None:
        """Append many documents at once: concatenated `tokens`, their sequence lengths and, optionally,
        how many sequences each document has (default one per document)."""
        lens = np.asarray(sequence_lengths, dtype=np.int64)
        spd = np.ones(len(lens), np.int64) if sequences_per_document is None else np.asarray(sequences_per_document, np.int64)
        if int(spd.sum()) != len(lens):
            raise ValueError("sequences_per_document does not sum to the number of sequences")
        if int(lens.sum()) != np.asarray(tokens).size:
            raise ValueError("sequence lengths do not sum to the number of tokens")
        self._content(multimodal=False, what="documents without sequence modes")
        self._write_tokens(tokens)
        self._record(lens, self._num_sequences + np.cumsum(spd))

    def _content(self, multimodal: bool, what: str) -> None:
        """Multimodal datasets (with sequence modes) merge only with each other: Megatron's index holds a mode
        for every sequence or for none."""
        if self.multimodal is None:
            self.multimodal = multimodal
        elif self.multimodal != multimodal:
            kind = "multimodal (with sequence modes)" if self.multimodal else "without sequence modes"
            raise IndexedDatasetError(f"{self.path_prefix}: cannot add {what} to an output {kind}")

    def add_index(self, other_prefix: str) -> None:
        """Append all documents of another indexed dataset (same dtype), copying its files in chunks."""
        other = IndexedDataset(other_prefix)
        if other.dtype != self.dtype:
            raise ValueError(f"{other.path_prefix}: dtype {other.dtype.name} differs from the output's {self.dtype.name}")
        self._content(other.multimodal, f"{other.path_prefix} ({'multimodal' if other.multimodal else 'no modes'})")
        if other.multimodal:
            self._mode_sources.append(other.path_prefix)     # copied into the index by prepare()
        with open(bin_path(other.path_prefix), "rb") as f:
            while True:
                chunk = f.read(1 << 24)
                if not chunk:
                    break
                self._bin.write(chunk)
        step = WRITE_CHUNK
        base = self._num_sequences
        for a in range(0, max(len(other), 1), step):
            lens = np.array(other.sequence_lengths[a:a + step], dtype=np.int64)
            self._lengths.append(lens.astype("<i4"))
            self._buffered += len(lens)
            self._num_tokens += int(lens.sum())
            self._spill()
        self._num_sequences += len(other)
        for a in range(1, other.num_documents + 1, step):
            ends = base + np.array(other.document_indices[a:a + step], dtype=np.int64)
            self._doc_ends.append(ends.astype("<i8"))
            self._num_documents += len(ends)
            self._spill()

    def finalize(self) -> None:
        """Write the index (`prepare`) and move both files into place (`commit`)."""
        self.prepare()
        self.commit()

    def prepare(self) -> None:
        """Close the temporary `.bin` and write the complete temporary `.idx` (streaming from the side
        files); nothing visible changes until `commit()`. Writers of several outputs prepare them all
        first, so that a failure in any of them leaves every existing dataset untouched."""
        if self._closed:
            raise RuntimeError(f"{self.path_prefix}: writer already closed")
        self._spill()
        for f in (self._bin, self._len_f, self._doc_f):
            f.close()
        self._closed = True
        n, d = self._num_sequences, self._num_documents + 1
        itemsize = self.dtype.itemsize
        idx_tmp = self._idx_tmp
        step = WRITE_CHUNK
        with open(idx_tmp, "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<Q", VERSION))
            f.write(struct.pack("<B", CODE_OF_DTYPE[self.dtype]))
            f.write(struct.pack("<Q", n))
            f.write(struct.pack("<Q", d))
            with open(self._len_tmp, "rb") as lf:  # lengths
                while chunk := lf.read(4 * step):
                    f.write(chunk)
            carry = 0
            with open(self._len_tmp, "rb") as lf:  # byte pointers = exclusive cumsum of lengths
                while chunk := lf.read(4 * step):
                    lens = np.frombuffer(chunk, "<i4").astype(np.int64) * itemsize
                    ptr = np.cumsum(lens) - lens + carry
                    carry = int(ptr[-1] + lens[-1])
                    f.write(ptr.astype("<i8").tobytes())
            f.write(np.zeros(1, "<i8").tobytes())  # document indices start at 0
            with open(self._doc_tmp, "rb") as df:
                while chunk := df.read(8 * step):
                    f.write(chunk)
            for source in self._mode_sources:     # int8 per sequence, as the inputs hold them
                modes = IndexedDataset(source, validate=False).sequence_modes
                for a in range(0, len(modes), step):
                    f.write(np.asarray(modes[a:a + step], dtype=np.int8).tobytes())
        for p in (self._len_tmp, self._doc_tmp):
            os.remove(p)
        self._prepared = True

    def commit(self, replace: bool = True) -> None:
        """Rename the prepared files into place: remove any old `.idx`, then the `.bin`, the `.idx`
        last. A reader therefore sees the old pair, no `.idx` at all, or the new pair, never a
        mismatched pair; the residual window is these three renames (a crash inside it leaves the
        prefix without an `.idx`: the old dataset, which the caller chose to replace, is gone and the
        run must be repeated). Not `replace` (no --overwrite): no existing file is replaced; one that
        another run wrote since the caller's check is a FileExistsError naming it (publish.put_in_place)."""
        if not self._prepared:
            raise RuntimeError(f"{self.path_prefix}: commit() before prepare()")
        if replace:
            with contextlib.suppress(FileNotFoundError):
                os.remove(idx_path(self.path_prefix))
        put_in_place([(self._bin_tmp, bin_path(self.path_prefix)), (self._idx_tmp, idx_path(self.path_prefix))],
                     replace)
        self._prepared = False

    def abort(self) -> None:
        """Close and delete the temporary files (a close whose flush fails, e.g. on a full disk, does not
        keep them: they are what filled it)."""
        try:
            if not self._closed:
                for f in (self._bin, self._len_f, self._doc_f):
                    with contextlib.suppress(OSError):
                        f.close()
                self._closed = True
        finally:
            remove_temporaries(self.path_prefix)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            if not self._closed:
                self.finalize()
        else:
            self.abort()
        return False


def _temporary_bases(prefix: str) -> list[str]:
    """The files a writer of `prefix` works in, before the `.tmpPID-TOKEN` that makes them its own."""
    return [bin_path(prefix), prefix + ".lengths", prefix + ".docs", idx_path(prefix)]


def temporary_paths(path_prefix: str) -> list[str]:
    """The temporary files an `IndexedDatasetWriter` of this process uses for `path_prefix` (temporary_suffix)."""
    return [p + temporary_suffix() for p in _temporary_bases(strip_suffix(str(path_prefix)))]


def remove_leftover_temporaries(path_prefix: str, log=None) -> int:
    """Remove the temporary files a writer of `path_prefix` killed by SIGKILL left (megatron_zaya.leftovers:
    only those of a process gone from this machine, unchanged for 10 minutes); returns the bytes freed.
    Every `IndexedDatasetWriter` does this as it starts."""
    prefix = strip_suffix(str(path_prefix))
    names = "|".join(re.escape(os.path.basename(p)) for p in _temporary_bases(prefix))
    pattern = re.compile(f"(?:{names}){TEMPORARY_SUFFIX_PATTERN}")
    return remove_leftovers(os.path.dirname(prefix) or ".", pattern, prefix, log)


def existing_outputs(path_prefix: str) -> list[str]:
    """The files of the `.bin`/`.idx` pair at `path_prefix` that already exist."""
    prefix = strip_suffix(str(path_prefix))
    return [p for p in (bin_path(prefix), idx_path(prefix)) if os.path.lexists(p)]


def remove_temporaries(path_prefix: str) -> None:
    """Delete this process's temporary writer files for `path_prefix`, whichever exist. Callers
    interrupted while a writer was being built (it may exist on disk but not yet in their hands)
    call this with the prefix alone."""
    for p in temporary_paths(path_prefix):
        try:
            os.remove(p)
        except FileNotFoundError:
            pass


def write_dataset(path_prefix: str, documents: Iterable[Sequence[int]], dtype=np.int32) -> None:
    """Convenience: write a list of token lists, one document (and one sequence) each."""
    with IndexedDatasetWriter(path_prefix, dtype) as w:
        for doc in documents:
            w.add_document(np.asarray(doc, dtype=np.int64))
