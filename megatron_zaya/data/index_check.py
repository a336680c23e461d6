"""The whole-index check of a dataset, made once per version of its files instead of on every rank at
every start.

Opening a `.bin/.idx` pair for training checks its whole index (IndexedDataset: every document index,
length and pointer, the .bin size against the lengths' sum), and the index caches are keyed by a hash of
its lengths and document boundaries. Both read the whole `.idx`, 20 bytes per sequence: a corpus of
trillions of tokens has billions of sequences, hundreds of GB of index and minutes of reading for every
rank at every start and restart. `open_checked` makes the check and the hash once, in one process, and
keeps the result (the token count and the hash) in the data cache folder, as a `cache.cached_arrays` entry
keyed by the files' path, sizes, modification and change times and inode; every other rank waits for it
(taking the datasets in a rotated order, so that a first start checks several datasets at once), and later
opens of the same files memory-map the index without reading it. A file rewritten in any way gets a new
change time, so a new check.
"""
from __future__ import annotations

import os
import weakref
from typing import Callable

import numpy as np

from .cache import array_digest, build_order, cached_arrays
from .indexed import IndexedDataset, bin_path, idx_path, read_header

_LENGTHS_DIGESTS: "weakref.WeakKeyDictionary[IndexedDataset, str]" = weakref.WeakKeyDictionary()


def lengths_digest(data: IndexedDataset) -> str:
    """blake2b of the sequence lengths and document boundaries (about 1.3 s per 100M sequences), once per
    opened dataset; open_checked supplies it from the check's record."""
    if data not in _LENGTHS_DIGESTS:
        _LENGTHS_DIGESTS[data] = array_digest(data.sequence_lengths, data.document_indices)
    return _LENGTHS_DIGESTS[data]


def file_version(prefix: str) -> dict:
    """What changes whenever the pair is written again: size, modification and change times, inode."""
    out = {"prefix": os.path.realpath(prefix)}
    for kind, path in (("idx", idx_path(prefix)), ("bin", bin_path(prefix))):
        st = os.stat(path)
        out[kind] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    return out


def _check(prefix: str) -> dict[str, np.ndarray]:
    data = IndexedDataset(prefix, mmap_bin=False)        # the whole-index check: raises naming the file
    return {"num_tokens": np.array([data.num_tokens], np.int64),
            "lengths_digest": np.frombuffer(bytes.fromhex(lengths_digest(data)), np.uint8)}


def open_checked(prefixes: list[str], mmap_bin: bool, cache_dir_of: Callable[[str], str] | None,
                 start: int | None = None) -> dict[str, IndexedDataset]:
    """Every dataset of `prefixes`, opened, its whole index checked once per version of its files (the
    record under `cache_dir_of(prefix)`; None: checked here, every time). Each rank starts at its own
    dataset of the list (cache.build_order; `start`: a given position), so that a first start checks
    several at once."""
    if cache_dir_of is None:
        return {p: IndexedDataset(p, mmap_bin=mmap_bin) for p in prefixes}
    opened = {}
    for prefix in build_order(list(prefixes), start=start):
        prefix_seen = read_header(prefix).prefix       # a missing or foreign file: named before any record
        record = cached_arrays(cache_dir_of(prefix), "IndexCheck", {"class": "IndexCheck", **file_version(prefix_seen)},
                               ["num_tokens", "lengths_digest"], lambda: _check(prefix_seen))
        data = IndexedDataset(prefix, mmap_bin=mmap_bin, validate=False)
        if data.num_tokens != int(record["num_tokens"][0]):      # cannot happen while the version matches
            data = IndexedDataset(prefix, mmap_bin=mmap_bin)
        else:
            _LENGTHS_DIGESTS[data] = bytes(record["lengths_digest"]).hex()
        opened[prefix] = data
    return {p: opened[p] for p in prefixes}
