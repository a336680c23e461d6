"""Megatron's index-building semantics, vectorized with numpy (no compiled helpers needed).

- `parse_split("969,30,1")` -> normalized weights; `split_ranges(weights, n)` -> [(begin, end)] per
  split with Megatron's rounding (`int(round(bookend * n))`).
- `num_epochs(...)`, `separate_final_epoch(...)`: how many passes over the documents a request needs,
  and whether the last partial epoch is shuffled separately (when it is < 80% of an epoch).
- `build_document_index`: documents repeated per epoch, shuffled by a `numpy.random.RandomState`.
- `build_sample_index`: (position in document index, token offset) of every sample boundary; sample
  i covers tokens [i*S, i*S + S] of the concatenated stream (S + 1 tokens; neighbours share one).
- `build_shuffle_index`: a permutation of the samples (final partial epoch shuffled on its own).
- `build_blending_indices`: the deterministic greedy interleave of a weighted blend (the one sequential
  loop: compiled by native_blending.py where a C compiler works, in Python otherwise).
"""

from __future__ import annotations

import math
import os
import re

import numpy as np

from megatron_zaya.errors import UserInputError

SPLIT_NAMES = ("train", "valid", "test")
DOCUMENT_INDEX_CHUNK = 1 << 22    # document-index entries walked per pass (their int64 lengths and ends: 64 MiB)
SAMPLE_INDEX_CHUNK = 1 << 24      # sample boundaries found per search (3 x 8 bytes each of temporaries)


def parse_split(split: str) -> list[float]:
    """'969,30,1' (or '98/2/0', '98 2 0', '1') -> three weights summing to 1.

    Each of the up to three shares must be a finite number >= 0 and their sum positive; anything
    else (letters, a fourth share, a negative share like '-5,10,1') raises `UserInputError` naming
    --split.
    """
    words = re.split(r"\s*[,/]\s*|\s+", str(split).strip())
    try:
        values = [float(w) for w in words]
    except ValueError:
        values = []
    if not values or len(values) > 3 or not all(math.isfinite(v) and v >= 0 for v in values) or sum(values) <= 0:
        raise UserInputError(f"--split {split!r}: expected up to three numbers >= 0 with a positive sum "
                             f"(train,valid,test shares like '969,30,1')")
    values += [0.0] * (3 - len(values))
    total = sum(values)
    return [v / total for v in values]


def split_ranges(weights: list[float], num_elements: int) -> list[tuple[int, int] | None]:
    """Begin/end element index of each split (None for an empty split weight)."""
    ranges: list[tuple[int, int] | None] = []
    acc = 0.0
    for w in weights:
        lo, hi = acc, acc + w
        acc = hi
        if w == 0:
            ranges.append(None)
            continue
        ranges.append((int(round(lo * float(num_elements))), int(round(hi * float(num_elements)))))
    return ranges


def num_epochs(tokens_per_epoch: int, seq_length: int, num_samples: int | None, add_extra_token: int = 1) -> int:
    if num_samples is None:
        return 1
    if tokens_per_epoch <= 0:
        raise UserInputError("the dataset split holds no tokens")
    needed = num_samples * seq_length + add_extra_token
    return max(1, -(-needed // tokens_per_epoch))  # smallest e with e * tokens_per_epoch >= needed


def separate_final_epoch(epochs: int, tokens_per_epoch: int, seq_length: int, num_samples: int | None,
                         add_extra_token: int = 1, threshold: float = 0.80) -> tuple[bool, int]:
    """(separate?, samples before the final epoch)."""
    if epochs == 1 or num_samples is None:
        return False, 0
    before = ((epochs - 1) * tokens_per_epoch - add_extra_token) // seq_length
    from_final = num_samples - before
    per_epoch = (tokens_per_epoch - add_extra_token) // seq_length
    return from_final < int(threshold * per_epoch), before


BUILD_BYTES_PER_DOCUMENT_PASS = 12   # the document index and its copy (build_sample_index walks it in chunks)
BUILD_BYTES_PER_SAMPLE = 16          # the sample index and the shuffle index
BLEND_BYTES_PER_SAMPLE = 10          # a blend's dataset index (int16) and sample index (int64)


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_build_memory(documents: int, epochs: int, tokens_per_epoch: int, num_samples: int | None,
                       seq_length: int, limit: int | None = None) -> None:
    """UserInputError, before anything is allocated, when building a dataset's indices would need more
    memory than the machine has (`limit`, default its physical memory): a small dataset asked for far
    more samples than it holds (e.g. 20K tokens for 14T) repeats its documents millions of times."""
    limit = physical_memory_bytes() if limit is None else limit
    samples = num_samples or epochs * tokens_per_epoch // seq_length
    need = BUILD_BYTES_PER_DOCUMENT_PASS * documents * epochs + BUILD_BYTES_PER_SAMPLE * samples
    if limit is not None and need > limit:
        raise UserInputError(
            f"{samples:,} samples of {seq_length} tokens take {epochs:,} passes over its {tokens_per_epoch:,} tokens: "
            f"building their order needs about {need / 2**30:,.0f} GiB, more than this machine's "
            f"{limit / 2**30:,.0f} GiB (add data, give this dataset a smaller weight, or train on fewer samples)")


def sequence_id_dtype(num_sequences: int) -> type:
    """int32 for sequence ids, as Megatron-LM's document index; int64 for a dataset of 2^31 sequences or more
    (an int32 id would wrap around and read other documents)."""
    return np.int32 if num_sequences <= 2**31 else np.int64


def build_document_index(documents: np.ndarray, epochs: int, rng: np.random.RandomState, separate_final: bool) -> np.ndarray:
    documents = np.asarray(documents)
    dtype = sequence_id_dtype(int(documents.max()) + 1 if documents.size else 0)
    if not separate_final or epochs == 1:
        index = np.tile(documents.astype(dtype, copy=False), epochs)
        rng.shuffle(index)
        return index
    first = build_document_index(documents, epochs - 1, rng, False)
    last = build_document_index(documents, 1, rng, False)
    return np.concatenate((first, last))


def build_sample_index(sizes: np.ndarray, document_index: np.ndarray, seq_length: int, epochs: int,
                       tokens_per_epoch: int, add_extra_token: int = 1) -> np.ndarray:
    """[num_samples + 1, 2] array of (document-index position, offset) sample boundaries.

    Boundary i is the token at stream position i * seq_length (found by a binary search over the
    cumulative document lengths); boundary 0 is (0, 0). Partial last samples are dropped. The document
    index is walked DOCUMENT_INDEX_CHUNK entries at a time, each chunk's cumulative lengths carried on
    from the last and searched for the boundaries that fall in it: int64 lengths and ends of the whole
    index took 16 bytes per entry more than the index itself (4.9x what the build returns).
    """
    if seq_length <= 0:
        raise ValueError(f"--seq-length must be positive, got {seq_length}")
    num_samples = (epochs * tokens_per_epoch - add_extra_token) // seq_length
    if num_samples <= 0:
        raise UserInputError(
            f"the dataset split holds {tokens_per_epoch} tokens per epoch, too few for one sample of "
            f"{seq_length}+{add_extra_token} tokens"
        )
    sizes = np.asarray(sizes)
    longest = int(sizes.max()) if len(sizes) else 0
    small = len(document_index) < 2**31 and longest < 2**31
    out = np.empty((num_samples + 1, 2), dtype=np.int32 if small else np.int64)
    before = 0          # tokens of the document index before the chunk
    for first in range(0, len(document_index), DOCUMENT_INDEX_CHUNK):
        lengths = sizes[document_index[first:first + DOCUMENT_INDEX_CHUNK]].astype(np.int64)
        ends = before + np.cumsum(lengths)
        after = int(ends[-1])
        # the boundaries at stream positions in [before, after): their document lies in this chunk
        lo, hi = -(-before // seq_length), min(num_samples, (after - 1) // seq_length)
        for start in range(lo, hi + 1, SAMPLE_INDEX_CHUNK):       # (long documents: many boundaries per chunk)
            stop = min(hi + 1, start + SAMPLE_INDEX_CHUNK)
            positions = np.arange(start, stop, dtype=np.int64) * seq_length
            where = np.searchsorted(ends, positions, side="right")
            out[start:stop, 0] = first + where
            out[start:stop, 1] = positions - (ends[where] - lengths[where])
        before = after
    out[0] = (0, 0)
    if num_samples * seq_length == before:    # (add_extra_token 0) a last boundary at the stream's end lies in no
        out[num_samples] = (len(document_index) - 1, sizes[document_index[-1]])      # chunk: the last document's end
    return out


def build_shuffle_index(num_samples: int, total_size: int, rng: np.random.RandomState) -> np.ndarray:
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


def build_blending_indices(weights: list[float], size: int, native: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Greedy interleave: sample s goes to the dataset with the largest w_d * max(s, 1) - count_d
    (first one on ties). Returns (dataset_index int16, dataset_sample_index int64). The loop runs compiled
    (native_blending.py) where a C compiler works, else (or with native=False) in Python: the same indices."""
    w = [float(x) for x in weights]
    n = len(w)
    if n == 0 or n > 32767:
        raise ValueError(f"a blend needs 1 to 32767 datasets, got {n}")
    limit = physical_memory_bytes()
    if limit is not None and BLEND_BYTES_PER_SAMPLE * size > limit:     # a numpy MemoryError otherwise
        raise UserInputError(
            f"the blend's order of {size:,} samples (an int16 and an int64 per sample) needs about "
            f"{BLEND_BYTES_PER_SAMPLE * size / 2**30:,.1f} GiB, more than this machine's {limit / 2**30:,.1f} GiB: "
            f"build it where a training rank runs (a compute node; --data-cache-path keeps it for the run's "
            f"later jobs), or train on fewer samples (--train-iters / --train-samples)")
    if n == 1:
        return np.zeros(size, dtype=np.int16), np.arange(size, dtype=np.int64)
    if native:
        from megatron_zaya.data.native_blending import blend_natively
        built = blend_natively(w, size)
        if built is not None:
            return built
    dataset_index = np.zeros(size, dtype=np.int16)
    sample_index = np.zeros(size, dtype=np.int64)
    counts = [0] * n
    di = dataset_index  # filled through Python lists in blocks for speed
    block = 1 << 16
    for start in range(0, size, block):
        stop = min(size, start + block)
        picks = []
        sidx = []
        for s in range(start, stop):
            x = float(s) if s > 1 else 1.0
            best, best_err = 0, w[0] * x - counts[0]
            for d in range(1, n):
                err = w[d] * x - counts[d]
                if err > best_err:
                    best, best_err = d, err
            picks.append(best)
            sidx.append(counts[best])
            counts[best] += 1
        di[start:stop] = picks
        sample_index[start:stop] = sidx
    return dataset_index, sample_index


def blending_counts(weights: list[float], size: int, native: bool = True) -> np.ndarray:
    """How many of build_blending_indices(weights, size)'s samples each dataset gives, without the index: its
    greedy is prefix-stable, so these are also the counts of the first `size` samples of a longer one."""
    w = [float(x) for x in weights]
    if native:
        from megatron_zaya.data.native_blending import count_natively
        counts = count_natively(w, size)
        if counts is not None:
            return counts
    counts = [0] * len(w)
    for s in range(size):
        x = float(s) if s > 1 else 1.0
        best, best_err = 0, w[0] * x - counts[0]
        for d in range(1, len(w)):
            err = w[d] * x - counts[d]
            if err > best_err:
                best, best_err = d, err
        counts[best] += 1
    return np.asarray(counts, dtype=np.int64)


def surplus_size(target: int, weight: float, surplus: float = 0.005) -> int:
    """Samples requested from a blend component: ceil(ceil(target * weight) * (1 + surplus))."""
    return int(math.ceil(math.ceil(target * weight) * (1 + surplus)))
