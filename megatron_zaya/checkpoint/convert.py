"""Offline conversions (one CPU process, no torch.distributed): a sharded checkpoint of any layout
-> a Hugging Face ZAYA folder, and a full model state (e.g. from a Hugging Face folder, or a sharded
checkpoint: reshard) -> a sharded checkpoint in ANY layout. The sharded output holds model weights
only (metadata "weights_only": load it with --finetune or --no-load-optim) and goes into a folder
that holds no checkpoint yet: a conversion never replaces or re-points an existing one."""
from __future__ import annotations

import os

import torch

from megatron_zaya.checkpoint.format import LATEST_FILE, METADATA_FILE, CheckpointError, read_folder_metadata, read_json
from megatron_zaya.checkpoint.hf_format import (DEFAULT_MAX_SHARD_BYTES, check_new_output_folder, hf_folder_config,
                                                load_hf_folder, save_hf_folder)
from megatron_zaya.checkpoint.inspection import load_full_model_state, resolve_folder
from megatron_zaya.checkpoint.model_card import model_card
from megatron_zaya.checkpoint.preflight import held_iterations
from megatron_zaya.checkpoint.save_lock import SaveFolderLock
from megatron_zaya.checkpoint.saver import CheckpointWriter
from megatron_zaya.checkpoint.state import model_entries
from megatron_zaya.config import ModelConfig
from megatron_zaya.data.tokenizer import TOKENIZER_DESTS
from megatron_zaya.errors import UserInputError
from megatron_zaya.optim.schedules import schedule_flags_of
from megatron_zaya.parallel.state import LayoutError, check_layout


def checkpoint_to_hf(path: str, output_dir: str, dtype: torch.dtype | None = None, tokenizer=None,
                     progress=None, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> dict:
    """The model of a sharded checkpoint as a Hugging Face folder, with a README.md model card (and
    `tokenizer`'s files too, when given; its vocabulary must fit the embedding, checked from the metadata
    before any weight is read).
    `progress`: see ConversionProgress."""
    check_new_output_folder(output_dir)       # before any weight is read (minutes and GBs for a large model)
    if tokenizer is not None:
        rows = read_json(os.path.join(resolve_folder(path), METADATA_FILE))["model_config"]["vocab_size"]
        if tokenizer.vocab_size > rows:
            raise CheckpointError(f"the tokenizer's {tokenizer.vocab_size} tokens do not fit the checkpoint's {rows} "
                                  f"embedding rows: not the tokenizer this model was trained with")
    state, config, info = load_full_model_state(path, progress.reading if progress else None)
    if progress is not None:
        progress.note(f"writing {output_dir}")
    card = model_card(config, [read_json(os.path.join(info["folder"], METADATA_FILE))], [info["folder"]], None,
                      dtype or state["embedding.weight"].dtype, tokenizer is not None)
    save_hf_folder(state, config, output_dir, dtype, tokenizer, max_shard_bytes, {"README.md": card},
                   progress.wrote_file if progress else None)
    return info


def _sharded_model(state: dict, config: ModelConfig, tp: int, cp: int, ep: int, world: int, rank: int):
    from megatron_zaya.model import ZayaModel
    model = ZayaModel(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"model state does not match the config: missing {missing[:8]}, unexpected "
                              f"{unexpected[:8]}")
    if world == 1:
        return model
    from megatron_zaya.parallel.apply import parallelize_model
    from megatron_zaya.parallel.state import ParallelState
    # No process group: ParallelState only computes this rank's coordinates; the splits need no communication.
    return parallelize_model(model, ParallelState(tp, cp, ep, world_size=world, rank=rank, model_config=config))


def check_output_folder(save_dir: str) -> None:
    """A conversion writes only into a folder without checkpoints and without a latest file (a usage error
    otherwise, like any output that exists)."""
    held = held_iterations(save_dir)
    if held or os.path.exists(os.path.join(save_dir, LATEST_FILE)):
        what = f"checkpoints (iterations {held})" if held else LATEST_FILE
        raise UserInputError(f"{save_dir}: already holds {what}; refusing to write a converted checkpoint into it "
                             f"(choose a new output folder)")


def fresh_train_state(iteration: int) -> dict:
    """The train state of a checkpoint that starts at `iteration` with no data consumed."""
    return {"iteration": iteration, "consumed_samples": 0, "consumed_tokens": 0, "consumed_valid_samples": 0,
            "skipped_iterations": 0}


def check_sharded_output(save_dir: str, config: ModelConfig, tp: int = 1, cp: int = 1, ep: int = 1,
                         world_size: int | None = None, iteration: int | None = None) -> int:
    """The checks of a converted checkpoint's layout, iteration and output folder, made before any weight is
    read and again before any is written; returns the world size (default tp x cp: data parallel 1)."""
    if world_size is not None and world_size < 1:
        raise LayoutError(f"--world-size={world_size}: must be >= 1")
    world = tp * cp if world_size is None else world_size
    check_layout(world, tp, cp, ep, config)         # before anything is written (one rank splits nothing itself)
    if iteration is not None and iteration < 0:
        raise UserInputError(f"--iteration={iteration}: must be >= 0")
    check_output_folder(save_dir)
    # A folder a training run is saving into (its first checkpoint not complete yet, so not refused above):
    # the conversion's pruning would take the run's save in progress for debris, and its checkpoint would
    # hide the run's later ones.
    SaveFolderLock.check_free(save_dir, "writing a converted checkpoint")
    return world


def save_model_as_checkpoint(state: dict, config: ModelConfig, save_dir: str, tp: int = 1, cp: int = 1, ep: int = 1,
                             world_size: int | None = None, iteration: int = 0, source: str = "",
                             train_state: dict | None = None, progress=None, tokenizer: dict | None = None,
                             schedule_flags: dict | None = None) -> str:
    """Write `state` (single-device names and shapes) as a weights-only checkpoint of a layout with
    world_size ranks (default tp x cp: data parallel 1), atomically like a training save, into a
    folder without checkpoints. `train_state` (default: fresh at `iteration`) is what a
    --no-load-optim resume continues from. `tokenizer`: the tokenizer flags to record ("args", and
    "working_directory" for their relative paths), which the tools and --use-checkpoint-args take when
    given none (recorded_tokenizer.py). `schedule_flags`: the LR / weight-decay schedule flags the kept train
    state was reached with (a reshard's source's), which a resume compares with its own or takes with
    --use-checkpoint-opt_param-scheduler. Returns the folder."""
    world = check_sharded_output(save_dir, config, tp, cp, ep, world_size, iteration)
    train_state = dict(train_state or fresh_train_state(iteration), iteration=iteration)
    os.makedirs(save_dir, exist_ok=True)
    run_id = f"{int.from_bytes(os.urandom(5), 'big'):010x}"
    writers = [CheckpointWriter(save_dir, r, world, run_id) for r in range(world)]
    folder = writers[0].partial_dir(iteration)
    try:
        for rank, writer in enumerate(writers):
            model = _sharded_model(state, config, tp, cp, ep, world, rank)
            writer.write_rank(folder, iteration, model_entries(model), {"converted_from": source})
            if progress is not None:
                progress.writing(rank + 1, world)
        meta = {"train_state": train_state, "consumed_samples": train_state["consumed_samples"],
                "tokens_seen": train_state.get("consumed_tokens", 0), "model_config": config.to_dict(),
                "optimizer_config": None, "args": dict((tokenizer or {}).get("args", {})),
                "converted_from": source, "weights_only": True,
                "layout": {"world_size": world, "tensor_model_parallel_size": tp, "context_parallel_size": cp,
                           "expert_model_parallel_size": ep, "data_parallel_size": world // (tp * cp),
                           "use_distributed_optimizer": False, "sequence_parallel": False},
                "torch_version": torch.__version__}
        if schedule_flags:
            meta["schedule_flags"] = schedule_flags
        if (tokenizer or {}).get("working_directory"):
            meta["working_directory"] = tokenizer["working_directory"]
        writers[0].finalize(folder, iteration, meta, timeout=10)
    except BaseException:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return writers[0].final_dir(iteration)


def reshard_checkpoint(source: str, save_dir: str, iteration: int | None = None, progress=None, **layout) -> str:
    """The model of checkpoint `source` (any layout) as a weights-only checkpoint in another layout.
    It keeps the source's train state (iteration, consumed samples and tokens, data phase), so a
    --no-load-optim resume continues where the source stopped; another `iteration` relabels it as
    a fresh start at that iteration (no data consumed). The layout and output are checked first."""
    check_sharded_output(save_dir, ModelConfig(**read_folder_metadata(resolve_folder(source))["model_config"]),
                         iteration=iteration, **_sizes(layout))
    state, config, info = load_full_model_state(source, progress.reading if progress else None)
    if iteration is None:
        iteration = info["iteration"]
    kept = info["train_state"] if iteration == info["iteration"] else None
    meta = read_json(os.path.join(info["folder"], METADATA_FILE))
    tokenizer = {"args": {dest: value for dest, value in (meta.get("args") or {}).items()
                          if dest in TOKENIZER_DESTS and value is not None},
                 "working_directory": meta.get("working_directory")}       # the source's recorded tokenizer
    return save_model_as_checkpoint(state, config, save_dir, iteration=iteration, source=info["folder"],
                                    train_state=kept, progress=progress, tokenizer=tokenizer,
                                    schedule_flags=schedule_flags_of(meta) if kept else None, **layout)


def _sizes(layout: dict) -> dict:
    return {k: layout[k] for k in ("tp", "cp", "ep", "world_size") if k in layout}


def hf_to_checkpoint(hf_dir: str, save_dir: str, progress=None, **layout) -> str:
    """A Hugging Face folder as a weights-only checkpoint of the layout; the layout and output are checked
    against its config.json before any weight is read."""
    check_sharded_output(save_dir, hf_folder_config(hf_dir), iteration=layout.get("iteration"), **_sizes(layout))
    if progress is not None:
        progress.note(f"reading {hf_dir}")
    state, config = load_hf_folder(hf_dir)
    tokenizer = None
    if os.path.isfile(os.path.join(hf_dir, "tokenizer.json")):     # the folder's own tokenizer, by its path
        tokenizer = {"args": {"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": os.path.abspath(hf_dir)}}
    return save_model_as_checkpoint(state, config, save_dir, source=os.path.abspath(hf_dir), progress=progress,
                                    tokenizer=tokenizer, **layout)


class ConversionProgress:
    """Progress lines of a conversion on stderr: the weights read (at every tenth of them), the
    ranks written, and each other phase as it starts, with the time since the start."""

    def __init__(self, stream=None):
        import sys
        import time
        self.stream, self.clock = stream or sys.stderr, time.time
        self.start, self.reported = self.clock(), -1
        self.noted = self.start          # the last note's time

    def note(self, what: str) -> None:
        self.noted = self.clock()
        print(f"[convert {self.noted - self.start:6.1f} s] {what}", file=self.stream, flush=True)

    def wrote_file(self, done: int, total: int, name: str) -> None:
        """A Hugging Face weight file written, and the time left at the pace of the last one."""
        left = (self.clock() - self.noted) * (total - done) / done
        self.note(f"wrote {name} ({done}/{total} files, ~{left:.0f} s left)")

    def reading(self, done: int, total: int, nbytes: int) -> None:
        tenth = done * 10 // max(total, 1)
        if tenth > self.reported:
            self.reported = tenth
            self.note(f"read {done}/{total} weights ({nbytes / 2 ** 30:.2f} GiB)")

    def writing(self, done: int, total: int) -> None:
        self.note(f"wrote rank {done}/{total}")
