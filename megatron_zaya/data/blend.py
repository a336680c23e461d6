"""Weighted blends of GPT datasets and per-phase blends for a curriculum.

`parse_data_path(["30", "a", "70", "b"])` -> ([0.3, 0.7], ["a", "b"]) (Megatron's --data-path
syntax; a plain list of prefixes (None) is weighed by the datasets' lengths, loaders.blend_weights; a single
prefix is used directly).

`BlendedDataset` follows Megatron: sample s is taken from the dataset with the largest
`w_d * max(s, 1) - count_d` (deterministic greedy interleave, no randomness), and each component
is asked for `ceil(ceil(size * w) * 1.005)` samples.

`PhasedDataset` concatenates phases: phase p covers global samples [start_p, start_p + size_p)
with its own blend. A component used in several phases continues where the previous phase left off
(it is built once with the sum of the phases' requests), so no sample is repeated at a phase change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from megatron_zaya.errors import UserInputError

from . import index_builders as ib


def is_number(x: str) -> bool:
    try:
        float(x)
        return True
    except ValueError:
        return False


def parse_data_path(data_path: list[str] | str, flag: str = "--data-path") -> tuple[list[float] | None, list[str]]:
    """Split Megatron's `--data-path` list into (normalized weights or None, prefixes).

    Raises `UserInputError` naming `flag` for an empty list, a mix of weighted and unweighted
    entries, an odd W P list, and weights that are negative, not finite or sum to zero.
    """
    items = data_path.split() if isinstance(data_path, str) else [str(x) for x in data_path]
    if not items:
        raise UserInputError(f"{flag} is empty")
    if len(items) == 1:
        return None, items
    if not is_number(items[0]):
        if any(is_number(x) for x in items):
            raise UserInputError(f"{flag} {' '.join(items)}: mix of weights and paths; use W1 P1 W2 P2 ...")
        return None, items
    if len(items) % 2:
        raise UserInputError(f"{flag} {' '.join(items)}: expected weight/path pairs (W1 P1 W2 P2 ...)")
    weights, prefixes = [], []
    for w, p in zip(items[0::2], items[1::2]):
        if not is_number(w):
            raise UserInputError(f"{flag}: {w!r} is not a weight (expected W1 P1 W2 P2 ...)")
        if not (math.isfinite(float(w)) and float(w) >= 0):
            raise UserInputError(f"{flag}: weight {w} for {p} must be a finite number >= 0")
        weights.append(float(w))
        prefixes.append(p)
    if sum(weights) <= 0:
        raise UserInputError(f"{flag} {' '.join(items)}: the weights must have a positive sum")
    return normalize(weights), prefixes


def normalize(weights: list[float]) -> list[float]:
    w = np.asarray(weights, dtype=np.float64)
    total = float(w.sum())
    if total <= 0:
        raise UserInputError(f"blend weights {weights} must have a positive sum")
    return (w / total).tolist()


class Positions:
    """0, 1, ..., size - 1 without an array: the dataset_sample_index of a phase drawn from one dataset
    (plan_phases), where arrays would hold 10 bytes per sample (34 GB for ZAYA1's 3.4B samples) on every rank."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> int:
        if not -self.size <= idx < self.size:
            raise IndexError(f"position {idx} out of range [0, {self.size})")
        return int(idx) % self.size


COUNT_CHUNK = 1 << 24


def component_counts(dataset_index, n: int) -> np.ndarray:
    """Samples per component in `dataset_index`, counted a chunk at a time (an int64 copy of a whole
    3.42B-sample index would be 27 GB per rank); a broadcast constant, as plan_phases gives a one-dataset
    phase, is counted without reading it."""
    counts = np.zeros(n, np.int64)
    if isinstance(dataset_index, np.ndarray) and dataset_index.strides == (0,) and len(dataset_index):
        counts[int(dataset_index[0])] = len(dataset_index)
        return counts
    for start in range(0, len(dataset_index), COUNT_CHUNK):
        chunk = np.asarray(dataset_index[start:start + COUNT_CHUNK], dtype=np.int64)
        counts += np.bincount(chunk, minlength=n)[:n]
    return counts


class BlendedDataset:
    """Samples `dataset_index[i]`'s sample `offset + dataset_sample_index[i]`."""

    def __init__(self, datasets: list, dataset_index: np.ndarray, dataset_sample_index: np.ndarray,
                 offsets: list[int] | None = None, counts: np.ndarray | None = None):
        """`counts`: component_counts(dataset_index) where the caller has it (plan_phases does): reading a
        run-sized index again costs seconds per rank at every start."""
        self.datasets = datasets
        self.dataset_index = dataset_index
        self.dataset_sample_index = dataset_sample_index
        self.offsets = offsets or [0] * len(datasets)
        used = component_counts(dataset_index, len(datasets)) if counts is None else counts
        for d, (ds, off) in enumerate(zip(datasets, self.offsets)):
            if used[d] and off + int(used[d]) > len(ds):
                raise ValueError(f"blend component {d} has {len(ds)} samples, {off + int(used[d])} needed")

    def __len__(self) -> int:
        return int(len(self.dataset_index))

    def __getitem__(self, idx: int):
        d = int(self.dataset_index[idx])
        return self.datasets[d][self.offsets[d] + int(self.dataset_sample_index[idx])]


class PhasedDataset:
    """Concatenation of per-phase datasets over consecutive global sample ranges."""

    def __init__(self, phases: list):
        if not phases:
            raise ValueError("no phases")
        self.phases = phases
        self.starts = np.cumsum([0] + [len(p) for p in phases])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def phase_of(self, idx: int) -> int:
        return int(np.searchsorted(self.starts, idx, side="right")) - 1

    def __getitem__(self, idx: int):
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} out of range [0, {len(self)})")
        p = self.phase_of(idx)
        return self.phases[p][idx - int(self.starts[p])]


@dataclass
class PhasePlan:
    """Which component samples each phase uses (computed before any component is built)."""

    weights: list[list[float]]          # per phase, per global component
    sizes: list[int]                    # samples per phase
    dataset_index: list[np.ndarray]     # per phase, in global component numbering
    dataset_sample_index: list[np.ndarray]
    offsets: list[list[int]]            # per phase, per component: samples used by earlier phases
    requests: list[int]                 # per component: samples to build
    counts: list[np.ndarray]            # per phase, per component: samples its dataset_index takes


def phase_shares(weights: list[float], order: list[int]) -> tuple[list[int], list[float], float]:
    """(the components of a phase's blend with a positive weight, in `order`; their shares, as its interleave uses
    them; the weights' sum as given). Raises ValueError when no component has a positive weight."""
    active = [d for d in order if weights[d] > 0]
    if not active:
        raise ValueError("a phase has no dataset with a positive weight")
    shares = [weights[d] for d in active]
    given_total = sum(shares)     # (an unweighted blend's: the sum of its datasets' lengths, a whole number)
    if abs(given_total - 1.0) > 1e-9:    # normalised once, as Megatron does: again would move ties by an ulp
        shares = normalize(shares)
    return active, shares, given_total


def no_blending_index(weights: list[float], size: int):
    """A `blending` for plan_phases when only its requests are wanted (no interleave computed)."""
    return np.zeros(0, np.int16), None


def plan_phases(phase_weights: list[list[float]], sizes: list[int], surplus: float = 0.005,
                blending=ib.build_blending_indices, weighted: list[bool] | None = None,
                orders: list[list[int]] | None = None, start: list[int] | None = None) -> PhasePlan:
    """Greedy blending indices per phase and the number of samples each component must provide.

    A phase whose blend has no weights (`weighted` False) asks for no surplus: a single path takes its samples
    directly, as Megatron does for an unblended dataset (the caller also marks a per-split
    `--train-data-path 1.0 path` so), and a list of paths gives each dataset's one-epoch length as its weight
    (blend_weights) and asks it for exactly ceil(size * length / total lengths) samples, the most the interleave
    takes: a run shorter than one epoch of each reads one epoch of each, as in Megatron-LM. Otherwise (including
    `--data-path 1.0 path`) each component is requested ceil(ceil(size * w) * (1+surplus)). Weights that
    already sum to 1 are used as they are. `orders` gives,
    per phase, its components in the order its blend names them (default: their numbering): the interleave
    numbers them so, and its ties go to the one named first. `start`: per component, samples of it read before the
    first phase (by the earlier data phases of a resumed run, training/data_phase.py), which it continues after.
    """
    if weighted is None:
        weighted = [True] * len(phase_weights)
    n = len(phase_weights[0])
    if orders is None:
        orders = [list(range(n))] * len(phase_weights)
    used_before = list(start) if start else [0] * n
    requests = [0] * n
    dis, dsis, offsets, phase_counts = [], [], [], []
    for w, size, has_weights, order in zip(phase_weights, sizes, weighted, orders):
        active, local_w, given_total = phase_shares(w, order)
        if len(active) == 1:      # every sample from one dataset, in order: no index arrays
            di, dsi = np.broadcast_to(np.int16(active[0]), (size,)), Positions(size)
        else:
            di_local, dsi = blending(local_w, size)
            if active == list(range(n)):      # numbered as the components already: keep the (memory-mapped) array
                di = di_local
            else:
                di = np.asarray(active, dtype=np.int16)[di_local] if size else np.zeros(0, np.int16)
        offsets.append(list(used_before))
        counts = component_counts(di, n)
        for k, d in enumerate(active):
            if not has_weights and len(active) == 1:
                need = used_before[d] + size
            elif not has_weights:      # w: the datasets' lengths, exactly
                need = used_before[d] + -(-size * int(w[d]) // int(given_total))
            else:
                need = used_before[d] + ib.surplus_size(size, local_w[k], surplus)
            requests[d] = max(requests[d], need)
            used_before[d] += int(counts[d])
        dis.append(di)
        dsis.append(dsi)
        phase_counts.append(counts)
    return PhasePlan(phase_weights, sizes, dis, dsis, offsets, requests, phase_counts)
