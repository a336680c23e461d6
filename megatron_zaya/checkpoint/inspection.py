"""Reading checkpoints outside training: the full (single-device) model of any layout, and a report
of what a checkpoint holds and whether every file is intact."""
from __future__ import annotations

import os
import sys

import torch

from megatron_zaya.checkpoint.format import (COMPLETE_MARKER, METADATA_FILE, CheckpointError, CheckpointFolder,
                                             checkpoint_candidates, file_crc32, metadata_problems, read_json,
                                             readable_copy, rank_stem)
from megatron_zaya.config import ModelConfig


def resolve_folder(path: str) -> str:
    """An iter_NNNNNNN folder, or a --save folder (-> the checkpoint a --load of it continues from: the one
    latest_checkpointed_iteration.txt names, or a newer one whose save was interrupted before it updated that
    file (format.named_latest), or the copy an interrupted save of the same iteration left (iter_N.replaced-*);
    past a missing or incomplete one, the newest complete one, with a warning). The tools (export, generation,
    evaluation, inspection) so take the checkpoint that training resumes from."""
    path = os.path.abspath(path)
    if os.path.isfile(os.path.join(path, METADATA_FILE)) or os.path.isfile(os.path.join(path, COMPLETE_MARKER)):
        return path
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: " + ("a file, not a checkpoint folder" if os.path.exists(path) else
                                              "no such checkpoint folder"))
    candidates = [readable_copy(folder) for folder in checkpoint_candidates(path)]
    if not candidates:
        raise CheckpointError(f"{path}: no checkpoint (no latest_checkpointed_iteration.txt, no complete iter_* "
                              f"folder){half_hf_folder(path)}")
    complete = [folder for folder in candidates if os.path.isfile(os.path.join(folder, COMPLETE_MARKER))]
    if not complete:           # only the named one, and it is not complete: its report says what it lacks
        return candidates[0]
    if complete[0] != candidates[0]:
        print(f"warning: {path}: the latest checkpoint, {os.path.basename(candidates[0])}, is "
              f"{'incomplete' if os.path.isdir(candidates[0]) else 'missing'}: using {os.path.basename(complete[0])}, "
              f"as --load would", file=sys.stderr)
    return complete[0]


BUFFER_SUFFIX = "balancing_bias"     # the one saved tensor of a ZAYA model that is not a parameter (the router's)


def half_hf_folder(path: str) -> str:
    """What a Hugging Face folder lacks, when `path` holds part of one (an interrupted download or copy): a
    clause for the "no checkpoint" error, or ""."""
    names = set(os.listdir(path))
    whole = sorted({"model.safetensors", "model.safetensors.index.json"} & names)
    shards = sorted(n for n in names if n.endswith(".safetensors"))
    if "config.json" not in names:
        weights = whole or shards
        return f"; it holds {weights[0]} but no config.json: an incomplete Hugging Face folder?" if weights else ""
    if whole:
        return ""
    if shards:
        return (f"; it holds a Hugging Face config.json and {shards[0]} but no model.safetensors.index.json (the "
                f"index of the shards): an incomplete copy?")
    return "; it holds a Hugging Face config.json but no model.safetensors (or its index): an incomplete copy?"


def model_config_of(folder: CheckpointFolder) -> ModelConfig:
    return ModelConfig(**folder.metadata["model_config"])


def master_key(key: str) -> str:
    """The key of model weight `key`'s fp32 master (saved only for weights that are not fp32)."""
    return f"optim/{key[len('model/'):]}/master"


def trained_value(folder: CheckpointFolder, key: str) -> torch.Tensor:
    """Model weight `key` ("model/NAME") of `folder`, whole: its fp32 master where it has one (a bf16 weight of
    a --bf16 ZeRO-1 run), the trained value rather than its rounding."""
    master = master_key(key)
    if folder.has(master):
        return folder.full(master).reshape(folder.global_shape(key))
    return folder.full(key)


def load_full_model_state(path: str, progress=None) -> tuple[dict, ModelConfig, dict]:
    """(single-device state dict on CPU, ModelConfig, info) from a checkpoint of any layout.
    A weight saved in bf16 with an fp32 master (a --bf16 ZeRO-1 run) comes as its master: the
    trained value, not its rounding. Every file read is checked against its checksum. info:
    iteration, consumed_samples, tokens_seen, layout, folder, saved_at, train_state, masters (how
    many weights came from their masters). `progress(done, total, nbytes)`, when given, is called
    after each weight is read (nbytes: the bytes read so far)."""
    folder = CheckpointFolder(resolve_folder(path))
    state, masters, nbytes = {}, 0, 0
    keys = folder.keys("model/")
    for done, key in enumerate(keys, 1):   # each weight read once: its master where it has one
        name = key[len("model/"):]
        state[name] = trained_value(folder, key)
        masters += folder.has(master_key(key))
        if progress is not None:
            nbytes += state[name].numel() * state[name].element_size()
            progress(done, len(keys), nbytes)
    meta = folder.metadata
    info = {"folder": folder.folder, "iteration": meta["iteration"],
            "consumed_samples": meta["train_state"]["consumed_samples"], "tokens_seen": meta.get("tokens_seen"),
            "layout": meta["layout"], "saved_at": meta.get("saved_at"), "train_state": dict(meta["train_state"]),
            "masters": masters}
    return state, model_config_of(folder), info


def _check(path: str, want: dict | None) -> str:
    if not os.path.isfile(path):
        return "missing"
    if want is None:
        return "not in the manifest"
    crc, size = file_crc32(path)
    if size != want["bytes"]:
        return f"corrupt: {size} bytes, expected {want['bytes']}"
    if crc != want["crc32"]:
        return f"corrupt: crc32 {crc:08x}, expected {want['crc32']:08x}"
    return "ok"


def _recorded_tokenizer_line(meta: dict) -> str | None:
    from megatron_zaya.checkpoint.recorded_tokenizer import recorded_tokenizer   # it reads folders through us
    recorded = recorded_tokenizer(meta)
    if recorded is None:
        return None
    return recorded.command_line() + (f" ({recorded.missing_message()})" if recorded.missing else "")


def inspect_checkpoint(path: str) -> dict:
    """Iteration, tokens seen, layout, model config, bytes per rank, and the integrity of every file
    ("ok", "missing", "corrupt: ..."); never raises for a damaged checkpoint (`ok` says it all)."""
    folder_path = resolve_folder(path)
    report = {"folder": folder_path, "complete": os.path.isfile(os.path.join(folder_path, COMPLETE_MARKER)),
              "files": {}, "problems": []}
    try:
        meta = read_json(os.path.join(folder_path, METADATA_FILE))
    except CheckpointError as err:
        report["problems"].append(str(err))
        report["ok"] = False
        return report
    bad = metadata_problems(meta, os.path.join(folder_path, METADATA_FILE))
    if bad:
        report["problems"] += bad
        report["ok"] = False
        return report
    layout = meta.get("layout", {})
    report.update(iteration=meta.get("iteration"), consumed_samples=meta.get("train_state", {}).get("consumed_samples"),
                  tokens_seen=meta.get("tokens_seen"), layout=layout, model_config=meta.get("model_config"),
                  saved_at=meta.get("saved_at"), format_version=meta.get("format_version"),
                  tokenizer=_recorded_tokenizer_line(meta))
    manifest = meta.get("files", {})
    per_rank = []
    for rank in range(layout.get("world_size", 0)):
        sizes = {}
        for ext in (".json", ".safetensors"):
            name = rank_stem(rank) + ext
            status = _check(os.path.join(folder_path, name), manifest.get(name))
            report["files"][name] = status
            if status != "ok":
                report["problems"].append(f"{os.path.join(folder_path, name)}: {status}")
            sizes[ext[1:]] = manifest.get(name, {}).get("bytes")
        per_rank.append({"rank": rank, "bytes": sum(v or 0 for v in sizes.values())})
    report["ranks"] = per_rank
    report["total_bytes"] = sum(r["bytes"] for r in per_rank)
    if not report["complete"]:
        report["problems"].append(f"{os.path.join(folder_path, COMPLETE_MARKER)}: missing (incomplete save)")
    if not report["problems"]:
        try:
            folder = CheckpointFolder(folder_path)
            report["tensors"] = {k: folder.global_shape(k) for k in sorted(folder.keys("model/"))}
            report["parameters"] = int(sum(torch.Size(s).numel() for k, s in report["tensors"].items()
                                           if not k.endswith(BUFFER_SUFFIX)))     # (the model's, as model_stats)
            # what a resume finds in it (--no-save-optim / --no-save-rng, or written by a conversion)
            report["holds"] = {"optimizer": bool(folder.keys("optim/")), "rng": bool(folder.keys("rng/")),
                               "weights_only": bool(meta.get("weights_only")),
                               "converted_from": meta.get("converted_from")}
        except CheckpointError as err:
            report["problems"].append(str(err))
    report["ok"] = not report["problems"]
    return report
