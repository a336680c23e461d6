"""Before the model is built: the datasets of the train and validation blends hold what the run reads.

`_build_split` and `_one_pass` (data/loaders.py) find an empty split while the data loaders are built, which
in a training run comes after the process groups, the model and the optimizer (only a dry run builds the
loaders first). The split's documents and samples are known from the `.idx` headers read when the datasets
were opened, so `check_splits_before_build` raises the same errors at the start. `evaluation_warnings` says
when --eval-iters asks for an evaluation that no split gives (Megatron-LM then skips it silently too).
"""
from __future__ import annotations

import functools

from megatron_zaya.errors import UserInputError

from .blend import parse_data_path
from .config import DataConfig
from . import index_builders as ib
from .loaders import blend_weights, dataset_prefixes, epoch_samples, no_sample_error, split_documents


def _has_share(cfg: DataConfig, split_id: int) -> bool:
    return cfg.separate_splits or ib.parse_split(cfg.split)[split_id] > 0


def _validation_groups(cfg: DataConfig, valid_blend: list[str]) -> list[list[str]]:
    """The blends the validation sets read (data/validation.py): each dataset alone with
    --multiple-validation-sets, else the whole blend."""
    if cfg.multiple_validation_sets:
        return [[p] for p in dict.fromkeys(parse_data_path(valid_blend)[1])]
    return [valid_blend]


def check_splits_before_build(cfg: DataConfig, datasets: dict, seq_length: int, trains: bool,
                              evaluates: bool) -> None:
    """UserInputError, as the loaders would raise it after the build, when a blend the run reads (the train
    blends when it `trains`, the validation sets when it `evaluates`) has a dataset with a positive weight and
    no document in that split, or is an unweighted list without a sample in it. `datasets`: open_datasets."""
    if cfg.mock_data:
        return
    train_blend, valid_blend, _ = cfg.split_blends()
    needed = [(0, blend) for blend in ([p.data_path for p in cfg.phases] if cfg.phases else [train_blend])
              if trains and blend and _has_share(cfg, 0)]
    if evaluates and valid_blend and _has_share(cfg, 1):
        if cfg.full_validation:         # every document of each validation dataset, once
            for prefix in dict.fromkeys(parse_data_path(valid_blend)[1]):
                documents, where = split_documents(cfg, datasets[prefix], prefix, 1)
                if documents is None or len(documents) == 0:
                    raise UserInputError(f"--full-validation: {where} is empty")
        else:
            needed += [(1, group) for group in _validation_groups(cfg, valid_blend)]
    prefixes = dataset_prefixes(cfg)
    for split_id, blend in needed:
        lengths = functools.cache(lambda p, s=split_id: epoch_samples(cfg, datasets[p], p, s, seq_length))
        weights = blend_weights(blend, prefixes, lengths)
        if sum(weights) == 0:
            raise no_sample_error(cfg, blend, split_id, seq_length)
        for prefix, weight in zip(prefixes, weights):
            if weight > 0:
                documents, where = split_documents(cfg, datasets[prefix], prefix, split_id)
                if documents is None or len(documents) == 0:
                    raise UserInputError(f"{where} is empty but the run reads from it (weight {weight:g} in "
                                         f"{' '.join(blend)})")


def evaluation_warnings(cfg: DataConfig, eval_iters: int) -> list[str]:
    """A line when --eval-iters asks for validation and no split gives it."""
    if not eval_iters:
        return []
    _, valid_blend, _ = cfg.split_blends()
    if cfg.separate_splits and not valid_blend:
        return [f"--eval-iters {eval_iters}: no --valid-data-path is given, so no validation runs"]
    if not cfg.separate_splits and not _has_share(cfg, 1):
        return [f"--eval-iters {eval_iters}: --split {cfg.split} gives the validation split no share, so no "
                f"validation runs"]
    return []
