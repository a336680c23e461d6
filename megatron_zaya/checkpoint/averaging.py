"""Checkpoint averaging: the mean (or a weighted mean) of the model weights of several checkpoints
of one model, written as a Hugging Face folder. The usual way to smooth the end of a run (e.g. the
last checkpoints of a decay phase) before evaluation or release.

    folders = checkpoints_to_average(["runs/x/ckpt"], last=3)
    average_to_hf(folders, "hf/x-avg3")

Every checkpoint must hold the same model config (checked from the metadata before any weight is
read); a weight saved in bf16 with an fp32 master enters as its master. The average is accumulated
and written in fp32 (the mean of bf16 weights is not a bf16 value) unless `dtype` says otherwise.
"""
from __future__ import annotations

import math
import os

import torch

from megatron_zaya.checkpoint.format import METADATA_FILE, CheckpointError, iter_dir_name, list_complete, read_json
from megatron_zaya.checkpoint.hf_format import DEFAULT_MAX_SHARD_BYTES, check_new_output_folder, save_hf_folder
from megatron_zaya.checkpoint.inspection import load_full_model_state, resolve_folder
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
    weights = normalized_weights(weights, len(folders))
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
    total, config = None, None
    for weight, folder in zip(weights, folders):
        if progress is not None:
            progress.note(f"reading {folder} (weight {weight:.4g})")
        state, config, _ = load_full_model_state(folder, progress.reading if progress else None)
        if total is None:
            total = {k: v.float() * weight if v.is_floating_point() else v for k, v in state.items()}
        else:
            for k, v in state.items():
                if v.is_floating_point():
                    total[k].add_(v.float(), alpha=weight)
        del state
    if progress is not None:
        progress.note(f"writing {output_dir}")
    card = model_card(config, metas, folders, weights, dtype or torch.float32, tokenizer is not None)
    save_hf_folder(total, config, output_dir, dtype, tokenizer, max_shard_bytes, {"README.md": card},
                   progress.wrote_file if progress else None)
    return {"folders": folders, "weights": weights, "iterations": [meta.get("iteration") for meta in metas]}
