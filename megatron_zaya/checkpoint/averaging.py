"""Checkpoint averaging: the mean (or a weighted mean) of the model weights of several checkpoints
of one model, written as a Hugging Face folder. The usual way to smooth the end of a run (e.g. the
last checkpoints of a decay phase) before evaluation or release.

    folders = checkpoints_to_average(["runs/x/ckpt"], last=3)
    average_to_hf(folders, "hf/x-avg3")

Every checkpoint must hold the same model config (checked from the metadata before any weight is
read); a weight saved in bf16 with an fp32 master enters as its master. Each weight is read from every
checkpoint in turn and its weighted mean accumulated in float64, then rounded once to fp32, the dtype
it is written in (the mean of bf16 weights is not a bf16 value) unless `dtype` says otherwise. Memory
holds the averaged model and one weight at a time, not a whole checkpoint.
"""
from __future__ import annotations

import math
import os

import torch

from megatron_zaya.checkpoint.format import (METADATA_FILE, CheckpointError, CheckpointFolder, iter_dir_name,
                                             list_complete, read_json)
from megatron_zaya.checkpoint.hf_format import DEFAULT_MAX_SHARD_BYTES, check_new_output_folder, save_hf_folder
from megatron_zaya.checkpoint.inspection import model_config_of, resolve_folder, trained_value
from megatron_zaya.checkpoint.model_card import model_card
from megatron_zaya.errors import UserInputError


def checkpoints_to_average(sources: list[str], last: int | None = None) -> list[str]:
    """The checkpoint folders: each source resolved (an iter_NNNNNNN folder, or a --save folder: the
    checkpoint its tracker names); with `last`, the newest `last` complete checkpoints of the one
    --save folder given."""
    if last is None:
        return [resolve_folder(source) for source in sources]
    if len(sources) != 1:
        raise UserInputError(f"--last {last} takes one --save folder, got {len(sources)} paths")
    done = list_complete(sources[0])
    if last < 1 or len(done) < last:
        raise UserInputError(f"{sources[0]}: {len(done)} complete checkpoints, --last {last} asks for "
                             f"{'at least one' if last < 1 else 'more'}")
    return [os.path.join(os.path.abspath(sources[0]), iter_dir_name(i)) for i in done[-last:]]


def normalized_weights(weights: list[float] | None, count: int) -> list[float]:
    if weights is None:
        return [1.0 / count] * count
    if len(weights) != count:
        raise UserInputError(f"--weights: {len(weights)} weights for {count} checkpoints")
    if not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
        raise UserInputError(f"--weights {' '.join(map(str, weights))}: finite numbers >= 0 with a positive sum")
    return [w / sum(weights) for w in weights]


def average_to_hf(folders: list[str], output_dir: str, weights: list[float] | None = None,
                  dtype: torch.dtype | None = None, tokenizer=None, progress=None,
                  max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> dict:
    """Write the weighted mean of `folders`' model weights to the Hugging Face folder `output_dir`
    (new or empty; written atomically). Returns {"folders", "weights", "iterations"}."""
    normalized = normalized_weights(weights, len(folders))
    check_new_output_folder(output_dir)
    metas = [read_json(os.path.join(folder, METADATA_FILE)) for folder in folders]
    first = metas[0]["model_config"]
    for folder, meta in zip(folders[1:], metas[1:]):
        differ = sorted(k for k in set(first) | set(meta["model_config"]) if meta["model_config"].get(k) != first.get(k))
        if differ:
            raise CheckpointError(f"{folder}: its model differs from {folders[0]}'s ({', '.join(differ)}): "
                                  f"checkpoints of one model only")
    if tokenizer is not None and tokenizer.vocab_size > first["vocab_size"]:
        raise CheckpointError(f"the tokenizer's {tokenizer.vocab_size} tokens do not fit the checkpoints' "
                              f"{first['vocab_size']} embedding rows: not the tokenizer this model was trained with")
    if progress is not None:
        progress.note(f"reading {len(folders)} checkpoints (weights {', '.join(f'{w:.4g}' for w in normalized)})")
    opened = [CheckpointFolder(folder) for folder in folders]
    averaged = weighted_mean(opened, [1.0] * len(folders) if weights is None else weights,
                             progress.reading if progress else None)
    if progress is not None:
        progress.note(f"writing {output_dir}")
    config = model_config_of(opened[0])
    card = model_card(config, metas, folders, normalized, dtype or torch.float32, tokenizer is not None)
    save_hf_folder(averaged, config, output_dir, dtype, tokenizer, max_shard_bytes, {"README.md": card},
                   progress.wrote_file if progress else None)
    return {"folders": folders, "weights": normalized, "iterations": [meta.get("iteration") for meta in metas]}


def weighted_mean(folders: list[CheckpointFolder], weights: list[float], progress=None) -> dict[str, torch.Tensor]:
    """{name: sum(weight * value) / sum(weights)} of every model weight of `folders`, computed in float64 (a
    product, then a sum, checkpoint by checkpoint) and rounded once to fp32. A weight that is not floating
    point (none in ZAYA) is the first checkpoint's. `progress(done, total, nbytes)` after each weight."""
    total_weight = sum(weights)
    averaged, nbytes = {}, 0
    keys = folders[0].keys("model/")
    for done, key in enumerate(keys, 1):
        name, accumulated = key[len("model/"):], None
        for weight, folder in zip(weights, folders):
            value = trained_value(folder, key)
            nbytes += value.numel() * value.element_size()
            if not value.is_floating_point():
                accumulated = value
                break
            product = value.double() * weight
            accumulated = product if accumulated is None else accumulated.add_(product)
        if accumulated.is_floating_point():
            accumulated = (accumulated / total_weight).float()
        averaged[name] = accumulated
        if progress is not None:
            progress(done, len(keys), nbytes)
    return averaged
