"""The blend's greedy interleave (index_builders.build_blending_indices) as a few lines of C, compiled on
first use with the system C compiler and loaded through ctypes.

The greedy is sequential (each sample's dataset depends on every earlier choice), so numpy cannot run it,
and in Python it costs about 0.4 us per sample with 3 datasets, 1.2 us with 20 (bench/blending_indices.py):
ZAYA1's run of 834,465 steps x 4,096 sequences is 3.4B samples, 20 minutes to over an hour on the rank
that builds the cache while every other rank waits. In C the same loop takes seconds to a minute or two.
The arithmetic is the Python loop's, in IEEE doubles, compiled with -ffp-contract=off (no fused
multiply-add, which would round w * x - count differently): the indices are identical (tested).

`native_blending()` returns the loaded function, or None where no compiler works (the caller keeps the
Python loop); `count_natively` runs the same loop for the counts alone (where a resumed run's new data
phase continues each dataset, training/data_phase.py: 1.0 s per 1e8 samples with 4 datasets, 3.3 s with
20, on the CI machine). The shared library is cached under $XDG_CACHE_HOME/megatron_zaya (else ~/.cache,
else the temporary folder's megatron_zaya-UID), named by the hash of its source and the machine type (a home
shared by x86 and Arm nodes), and written under a temporary name, then renamed, so that processes starting
together never load a half-written file. It is loaded only from a folder and a file of this user's that no other
user can write (a library another user placed in a shared folder would run in this process); a file in that
folder that others could write, or a link, is built anew.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile

import numpy as np

SOURCE = r"""
#include <stdint.h>
static inline int32_t pick(const double *w, int32_t n, int64_t s, const int64_t *counts) {
    double x = s > 1 ? (double)s : 1.0;
    int32_t best = 0;
    double best_err = w[0] * x - (double)counts[0];
    for (int32_t d = 1; d < n; ++d) {
        double err = w[d] * x - (double)counts[d];
        if (err > best_err) { best = d; best_err = err; }
    }
    return best;
}

void build_blending(const double *w, int32_t n, int64_t size, int16_t *dataset_index, int64_t *sample_index,
                    int64_t *counts) {
    for (int64_t s = 0; s < size; ++s) {
        int32_t best = pick(w, n, s, counts);
        dataset_index[s] = (int16_t)best;
        sample_index[s] = counts[best];
        counts[best] += 1;
    }
}

void count_blending(const double *w, int32_t n, int64_t size, int64_t *counts) {
    for (int64_t s = 0; s < size; ++s)
        counts[pick(w, n, s, counts)] += 1;
}
"""


def _cache_dirs() -> list[str]:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [os.path.join(base, "megatron_zaya"), os.path.join(tempfile.gettempdir(), f"megatron_zaya-{os.getuid()}")]


def _ours(path: str) -> bool:
    """Whether `path` (not followed if a link) belongs to this user and no other user can write it: a library
    loaded from a folder or file that another user can replace would run their code in this process (the
    temporary folder is shared by every user of a node)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return info.st_uid == os.getuid() and not info.st_mode & 0o022 and not stat.S_ISLNK(info.st_mode)


def _private_folder(folder: str) -> bool:
    """Make `folder` (readable by this user only where it is new) and say whether it is ours (`_ours`)."""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        info = os.lstat(folder)
        if info.st_uid == os.getuid() and stat.S_ISDIR(info.st_mode) and info.st_mode & 0o022:
            os.chmod(folder, stat.S_IMODE(info.st_mode) & ~0o022)   # made under a umask of 002: ours to close
    except OSError:
        return False
    return _ours(folder)


FLAGS = ["-O2", "-ffp-contract=off", "-shared", "-fPIC"]    # no contraction: the same sums as the Python order


def _compile(folder: str, compiler: str) -> str | None:
    # named by the source and the flags it is built with: a library built another way is never reused
    digest = hashlib.sha256((SOURCE + " ".join(FLAGS)).encode()).hexdigest()[:16]
    name = f"blending-{digest}-{platform.machine()}.so"
    library = os.path.join(folder, name)
    if not _private_folder(folder):
        return None
    if os.path.lexists(library):
        if _ours(library):
            return library
        try:      # a link, or a file others could have written (an earlier version's under a umask of 002):
            os.remove(library)      # the folder is this user's, so it is rebuilt rather than trusted
        except FileNotFoundError:   # (another process starting beside this one removed it first)
            pass
        except OSError:
            return None
    try:
        work = tempfile.mkdtemp(dir=folder)
    except OSError:
        return None
    try:
        source = os.path.join(work, "blending.c")
        with open(source, "w") as f:
            f.write(SOURCE)
        built = os.path.join(work, name)
        subprocess.run([compiler, *FLAGS, source, "-o", built],
                       check=True, capture_output=True, timeout=120)
        os.chmod(built, 0o755)                 # whatever the umask: no other user may write it (_ours)
        os.replace(built, library)
        return library
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def native_library():
    """The compiled library (build_blending and count_blending), or None."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return None
    for folder in _cache_dirs():
        library = _compile(folder, compiler)
        if library is None:
            continue
        try:
            loaded = ctypes.CDLL(library)
        except OSError:
            continue
        pointer = np.ctypeslib.ndpointer
        loaded.build_blending.argtypes = [pointer(np.float64, flags="C"), ctypes.c_int32, ctypes.c_int64,
                                          pointer(np.int16, flags="C"), pointer(np.int64, flags="C"),
                                          pointer(np.int64, flags="C")]
        loaded.count_blending.argtypes = [pointer(np.float64, flags="C"), ctypes.c_int32, ctypes.c_int64,
                                          pointer(np.int64, flags="C")]
        loaded.build_blending.restype = loaded.count_blending.restype = None
        return loaded
    return None


def native_blending():
    """The compiled build_blending(w, n, size, dataset_index, sample_index, counts), or None."""
    library = native_library()
    return None if library is None else library.build_blending


def blend_natively(weights: list[float], size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(dataset_index int16, dataset_sample_index int64) by the compiled loop, or None without one."""
    function = native_blending()
    if function is None:
        return None
    w = np.ascontiguousarray(weights, dtype=np.float64)
    dataset_index = np.empty(size, dtype=np.int16)
    sample_index = np.empty(size, dtype=np.int64)
    function(w, len(w), size, dataset_index, sample_index, np.zeros(len(w), dtype=np.int64))
    return dataset_index, sample_index


def count_natively(weights: list[float], size: int) -> np.ndarray | None:
    """How many of the interleave's first `size` samples each dataset gives (int64), by the compiled loop without
    its index (10 bytes a sample), or None without one."""
    library = native_library()
    if library is None:
        return None
    w = np.ascontiguousarray(weights, dtype=np.float64)
    counts = np.zeros(len(w), dtype=np.int64)
    library.count_blending(w, len(w), size, counts)
    return counts
