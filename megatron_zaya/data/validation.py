"""The validation sets of a run, as Megatron-LM's --multiple-validation-sets and --full-validation
shape them.

By default there is one set: the validation split of the blend (--valid-data-path, or each
--data-path dataset's --split share), of --eval-iters global batches. --multiple-validation-sets
makes one set per dataset of that split, each evaluated and logged on its own (named by its file
name). --full-validation sizes every set to one pass over its documents, every sample once, instead
of --eval-iters global batches (weights of a blend do not apply: each dataset's samples are all read).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .blend import BlendedDataset


@dataclass
class ValidationSet:
    name: str          # "" for a run's single validation set, else the dataset's file name
    dataset: object


def validation_set_names(prefixes: list[str]) -> list[str]:
    """Each dataset's file name; the whole prefix where two datasets share a file name."""
    names = [os.path.basename(p.rstrip("/")) for p in prefixes]
    return [p if names.count(n) > 1 else n for p, n in zip(prefixes, names)]


def concatenated(datasets: list):
    """The samples of `datasets` one after the other (a one-pass validation set over several files)."""
    if len(datasets) == 1:
        return datasets[0]
    dataset_index = np.concatenate([np.full(len(d), i, dtype=np.int16) for i, d in enumerate(datasets)])
    sample_index = np.concatenate([np.arange(len(d), dtype=np.int64) for d in datasets])
    return BlendedDataset(datasets, dataset_index, sample_index)


class PaddedToGroups:
    """`dataset` lengthened to a multiple of `group` samples (micro-batch size x data-parallel size)
    with copies of sample 0 whose loss mask is all zero: every data-parallel rank then runs the same
    number of micro-batches (so the collectives of tensor, expert and context parallelism stay
    matched), and the padding adds nothing to the loss or to the token count."""

    def __init__(self, dataset, group: int):
        self.dataset = dataset
        self.real_samples = len(dataset)
        self.length = -(-self.real_samples // group) * group

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, idx: int):
        if idx < self.real_samples:
            return self.dataset[idx]
        if not 0 <= idx < self.length:
            raise IndexError(f"sample {idx} of {self.length}")
        sample = dict(self.dataset[0])
        sample["loss_mask"] = np.zeros_like(sample["loss_mask"])
        return sample
