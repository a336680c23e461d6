"""Checks of --save and --load made before anything expensive exists.

While the flags are validated (arguments.validate), before anything else is built:

  - `check_load_path`: --load is a folder (or absent: train from scratch) and not a Megatron-LM
    checkpoint;
  - `checkpoint_args_source`: --use-checkpoint-args's checkpoint metadata, read once, from which come
    its model config (`model_config_from_checkpoint`), the saving run's tokenizer flags
    (`tokenizer_args_from_checkpoint`) and with --use-mp-args-from-checkpoint-args its tensor-parallel
    size (`tensor_parallel_from_checkpoint`).

`check_before_build(run)` runs in setup.build_and_train after the tokenizer (the padded vocabulary
is part of the model config) and before process groups, the model and the optimizer. It only reads
files every rank sees alike, so every rank raises the same error:

  - --save holding checkpoints that this run would overwrite or prune (it does not continue from
    that folder's latest checkpoint);
  - --load of a checkpoint whose model config does not fit this run (check_model_config);
  - --load of a weights-only checkpoint (offline conversions) by a run that would load its optimizer;
  - --load whose checkpoints are all unreadable (their metadata; in a dry run also a file of the manifest
    missing or of another size), named as TrainingCheckpointer.load would name them after the build.

TrainingCheckpointer.load repeats the last two checks on the folder it actually loads (it may fall
back past a damaged one), together with the optimizer-state checks that need the rank files.
"""
from __future__ import annotations

import dataclasses
import math
import os

from megatron_zaya.checkpoint.format import (COMPLETE_MARKER, ITER_RE, LATEST_FILE, METADATA_FILE, CheckpointError,
                                             checkpoint_candidates, is_iteration_folder, iter_dir_name, list_complete,
                                             list_replaced_complete, manifest_size_problems, named_latest, read_json,
                                             readable_copy)
from megatron_zaya.checkpoint.hf_format import is_hf_folder
from megatron_zaya.checkpoint.recorded_tokenizer import recorded_tokenizer
from megatron_zaya.config import ModelConfig
from megatron_zaya.errors import UserInputError, hub_name_hint
from megatron_zaya.training.data_phase import data_changed, data_signature

# Model config fields that change the shape (or the set) of the model's tensors: never loadable across.
SHAPE_FIELDS = frozenset({
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "vocab_size",
    "num_experts", "moe_ffn_hidden_size", "moe_router_topk", "router_hidden_size", "cca_depthwise_kernel",
    "cca_grouped_kernel", "untie_embeddings_and_output_weights"})
# Fields that do not change what a loaded model computes: initial values (the checkpoint's weights
# replace them), the vocabulary padding rule (vocab_size itself is compared), the position limit (a
# bound on --seq-length), and the sequence length (part of the data phase, data_phase.py).
INERT_FIELDS = frozenset({"init_method_std", "embedding_init_method_std", "key_temperature_init", "skip_class_bias_init",
                          "make_vocab_size_divisible_by", "max_position_embeddings", "seq_length"})
# Every other field (rotary_base, rotary_percent, norm_epsilon, ...) changes the function the weights
# compute: a plain resume must keep it; --finetune or a new data phase (the recipe's 32K phase raises
# rotary_base) may change it, with a warning.

WEIGHTS_ONLY_ADVICE = ("pass --finetune to start a new run from these weights, or --no-load-optim to keep its "
                       "iteration and data position with a fresh optimizer")


def loads_optimizer(train_cfg) -> bool:
    """Whether a --load by this run restores the optimizer state."""
    return not (train_cfg.no_load_optim or train_cfg.finetune)


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def held_iterations(save_dir: str) -> list[int]:
    """Iterations of the complete checkpoints in save_dir, including one left only as an interrupted
    replacement (recovered at start-up by saver.recover_replaced)."""
    return sorted(set(list_complete(save_dir)) | set(list_replaced_complete(save_dir)))


def _why_not_continuing(save: str, load: str | None, finetune: bool, held: list[int],
                        ckpt_step: int | None = None) -> str | None:
    """None when --load continues the run whose checkpoints --save holds (`held`, the iterations, oldest first);
    else the reason it does not. `ckpt_step`: --ckpt-step as given, which made `load` that iteration's folder in
    --save."""
    newest = held[-1]
    if not load:
        return "there is no --load, so it starts at iteration 0"
    # what the user gave: --ckpt-step put its iteration's folder in `load`
    picked = None if ckpt_step is None else f"--ckpt-step {ckpt_step} loads iteration {ckpt_step} of --load " \
                                            f"{os.path.dirname(load)}"
    if finetune:
        return f"--finetune restarts the iteration count at 0 ({picked or f'--load {load}'})"
    if _same_path(load, save):
        named = named_latest(save)
        if named is not None and named < newest:     # the file edited to go back: newest would be overwritten
            return (f"its {LATEST_FILE} names iteration {named}, so --load {load} starts there, but the complete "
                    f"iteration {newest} is newer (to go back to {named}, move the later iter_ folders out of "
                    f"{save} first; to continue from {newest}, write {newest} into {LATEST_FILE})")
        return None
    # one of --save's iter_ folders, however the path reaches it (a link to it, or it a link to other storage):
    # compared where the system takes both, so that SAVE/lnk/../iter_N is where lnk leads, not SAVE
    loaded = {os.path.realpath(os.path.join(save, iter_dir_name(it))): it for it in held}.get(os.path.realpath(load))
    if loaded == newest:
        return None
    if loaded is not None:
        return f"{picked or f'--load {load} is iteration {loaded}'}, older than the latest one"
    return f"{picked}, another folder" if picked else f"--load {load} is another folder"


def check_save_folder(save: str | None, load: str | None, finetune: bool, ckpt_step: int | None = None) -> None:
    """Refuse a --save folder that holds checkpoints this run would overwrite, prune or supersede:
    only a run continuing from that folder's latest checkpoint may save into it. `ckpt_step`: --ckpt-step,
    named in the error where it chose `load`."""
    if not save:
        return
    held = held_iterations(save)
    if not held:
        return
    reason = _why_not_continuing(save, load, finetune, held, ckpt_step)
    if reason is None:
        return
    without = "--finetune" if ckpt_step is None else "--finetune or --ckpt-step"
    raise CheckpointError(
        f"--save {save} already holds checkpoints (latest iteration {held[-1]}) and this run does not continue "
        f"from it: {reason}. Its saves would overwrite or prune those checkpoints. To resume that run, pass "
        f"--load {save} (without {without}); otherwise choose another --save folder, or move {save}'s "
        f"checkpoints away first")


def first_candidate_metadata(load: str, damaged: list | None = None,
                             check_sizes: bool = False) -> tuple[str, dict] | None:
    """(folder, metadata.json) of the checkpoint --load would try first that has readable metadata (and with
    `check_sizes`, every file of its manifest there at its size: a dry run's look, where one process stats
    them); None when there is none (TrainingCheckpointer.load reports what it finds). `damaged` collects the
    errors naming what is wrong with the candidates passed over."""
    for folder in map(readable_copy, checkpoint_candidates(load)):
        try:
            if not os.path.isfile(os.path.join(folder, COMPLETE_MARKER)):     # (the load passes over it)
                raise CheckpointError(f"{os.path.join(folder, COMPLETE_MARKER)}: missing - the save of {folder} did "
                                      f"not complete")
            meta = read_json(os.path.join(folder, METADATA_FILE))
            files = meta.get("files") if isinstance(meta, dict) else None
            problems = manifest_size_problems(folder, files) if check_sizes and isinstance(files, dict) else []
            if problems:
                raise CheckpointError("; ".join(problems))
            return folder, meta
        except CheckpointError as err:
            if damaged is not None:
                damaged.append(err)
    return None


def starts_new_data_phase(meta: dict, run) -> bool:
    """Whether loading the checkpoint described by `meta` starts a new data phase (data_phase.py):
    another blend or sequence length than the one it was saved with."""
    saved = meta.get("train_state", {}).get("data_signature", "")
    current = data_signature(run)
    if saved and current:
        return data_changed(saved, current)
    return meta.get("model_config", {}).get("seq_length") != run.model.seq_length


def _describe(diffs: dict) -> str:
    return "; ".join(f"{key}: {old!r} in the checkpoint, {new!r} in this run"
                     for key, (old, new) in sorted(diffs.items()))


def _vocab_padding_hint(meta: dict, run) -> str:
    """Where the two vocabularies can be paddings of one tokenizer's size (each within its padding multiple of the
    other): the flag that loads the checkpoint. A run pads to a multiple of lcm(--make-vocab-size-divisible-by,
    TP); with the checkpoint's own multiple as --make-vocab-size-divisible-by (and a TP dividing it) it lands on
    the checkpoint's size."""
    saved = meta["model_config"]
    old_vocab, new_vocab = saved["vocab_size"], run.model.vocab_size
    divisible_by, tp = run.model.make_vocab_size_divisible_by, run.parallel.tensor_model_parallel_size
    saved_divisible_by = saved.get("make_vocab_size_divisible_by") or 1
    saved_tp = (meta.get("layout") or {}).get("tensor_model_parallel_size") or 1
    old_multiple, new_multiple = math.lcm(saved_divisible_by, saved_tp), math.lcm(divisible_by, tp)
    if old_vocab % old_multiple or max(new_vocab - new_multiple, old_vocab - old_multiple) >= min(new_vocab, old_vocab):
        return ""           # no size pads to both: another tokenizer or --vocab-size
    return (f". If the tokenizer is the same, the vocabularies differ only in their padding: the checkpoint's "
            f"{old_vocab} is a multiple of {old_multiple} (--make-vocab-size-divisible-by={saved_divisible_by} at TP "
            f"{saved_tp}), this run pads to a multiple of {new_multiple} (--make-vocab-size-divisible-by="
            f"{divisible_by} at --tensor-model-parallel-size={tp}); --make-vocab-size-divisible-by={old_multiple} with "
            f"a TP that divides {old_multiple} loads it")


def check_model_config(meta: dict, run, finetune: bool, where: str) -> list[str]:
    """Compare the checkpoint's model config with this run's. Shape fields must match; other
    differences are errors on a plain resume and warnings (returned) under --finetune or when a new
    data phase starts. `where` names the checkpoint folder in the messages."""
    saved, current = meta.get("model_config") or {}, run.model.to_dict()
    diffs = {k: (saved[k], current[k]) for k in saved.keys() & current.keys()
             if k not in INERT_FIELDS and saved[k] != current[k]}
    if not diffs:
        return []
    shapes = {k: v for k, v in diffs.items() if k in SHAPE_FIELDS}
    if shapes:
        raise CheckpointError(f"{where}: the model config differs in fields that set tensor shapes "
                              f"({_describe(shapes)}); the checkpoint cannot be loaded into this model, not even "
                              f"with --finetune{_vocab_padding_hint(meta, run) if 'vocab_size' in shapes else ''}")
    if finetune:
        return [f"model config differs from the checkpoint's (--finetune): {_describe(diffs)}"]
    if starts_new_data_phase(meta, run):
        return [f"model config differs from the checkpoint's (a new data phase starts): {_describe(diffs)}"]
    raise CheckpointError(
        f"{where}: resuming with a different model config ({_describe(diffs)}); pass the checkpoint's values, or "
        f"--finetune to start a new run from these weights (a new data phase - another blend or --seq-length - "
        f"may change them too)")


def check_weights_only(meta: dict, train_cfg, where: str) -> None:
    """A checkpoint marked weights-only (offline conversions) cannot restore an optimizer."""
    if meta.get("weights_only") and loads_optimizer(train_cfg):
        source = f", converted from {meta['converted_from']}" if meta.get("converted_from") else ""
        raise CheckpointError(f"{where}: holds model weights only (no optimizer state{source}); {WEIGHTS_ONLY_ADVICE}")


@dataclasses.dataclass
class Start:
    """The checkpoint a run starts from, as TrainingCheckpointer.load will pick it."""

    folder: str
    meta: dict                  # its metadata.json
    train_cfg: object           # the train config its load follows (--pretrained-checkpoint's: a fine-tune)
    passed_over: list           # the errors of the newer candidates the load passes over


def find_start(cfg) -> tuple[Start | None, str | None]:
    """(the checkpoint the run with train config `cfg` starts from, or None; when checkpoints are there but none
    is loadable, the error naming them). A dry run also checks that each file is there at its size."""
    for path, source_cfg in start_sources(cfg):      # what TrainingCheckpointer.load will start from
        damaged = []
        found = first_candidate_metadata(path, damaged, check_sizes=cfg.dry_run)
        if found is not None:
            return Start(found[0], found[1], source_cfg, damaged), None
        if damaged:      # checkpoints are there, none loadable: TrainingCheckpointer.load stops at this source too
            flag = "--load" if source_cfg is cfg else "--pretrained-checkpoint"
            return None, f"{flag} {path}: no loadable checkpoint; " + "; ".join(map(str, damaged))
    return None, None


def check_before_build(run, found: tuple[Start | None, str | None] | None = None) -> bool:
    """Every check of --save and --load that needs no model (see the module docstring). True when the
    run will start from a checkpoint's weights (--load or --pretrained-checkpoint holds one). `found`:
    find_start(run.train), if at hand."""
    start, unloadable = found or find_start(run.train)
    cfg = start.train_cfg if start is not None else run.train
    check_save_folder(cfg.save, cfg.load, cfg.finetune, cfg.ckpt_step)
    if start is None:
        if unloadable:
            raise CheckpointError(unloadable)
        if cfg.pretrained_checkpoint:
            raise CheckpointError(no_pretrained_checkpoint_message(cfg))
        if cfg.load and requires_checkpoint(cfg):
            raise CheckpointError(missing_checkpoint_message(cfg))
        return False
    check_model_config(start.meta, run, cfg.finetune, start.folder)
    check_weights_only(start.meta, cfg, start.folder)
    return True


def start_sources(train_cfg) -> list:
    """Where a run with --load / --pretrained-checkpoint starts, in order of preference, each with the
    train config its load follows: --load as the flags say, then --pretrained-checkpoint as a
    fine-tune (Megatron-LM: only while --load holds no checkpoint)."""
    sources = [(train_cfg.load, train_cfg)] if train_cfg.load else []
    if train_cfg.pretrained_checkpoint:
        sources.append((train_cfg.pretrained_checkpoint, dataclasses.replace(train_cfg, finetune=True)))
    return sources


def no_pretrained_checkpoint_message(train_cfg) -> str:
    return (f"--pretrained-checkpoint {train_cfg.pretrained_checkpoint}: no checkpoint found"
            + (f" (nor in --load {train_cfg.load})" if train_cfg.load else ""))


def latest_iteration_folder(path: str) -> str | None:
    """The folder --load PATH would read: PATH itself if it is one iteration's folder, else the one
    the tracker file names (Megatron-LM's "release" too), else the highest iter_NNNNNNN."""
    if is_iteration_folder(path):
        return path
    try:
        with open(os.path.join(path, LATEST_FILE)) as f:
            text = f.read().strip()
        name = "release" if text == "release" else iter_dir_name(int(text))
        if os.path.isdir(os.path.join(path, name)):
            return os.path.join(path, name)
    except (OSError, ValueError):
        pass
    iterations = [name for name in os.listdir(path) if ITER_RE.match(name)]
    return os.path.join(path, max(iterations)) if iterations else None


def _megatron_lm_files(folder: str) -> list[str]:
    """Megatron-LM checkpoint entries (mp_rank_* folders, *.pt, *.distcp) in a folder that has no
    megatron-zaya files (COMPLETE marker, rank_*.safetensors); [] otherwise."""
    names = sorted(os.listdir(folder))
    if COMPLETE_MARKER in names or any(n.startswith("rank_") and n.endswith(".safetensors") for n in names):
        return []
    return [n for n in names if (n.startswith("mp_rank_") and os.path.isdir(os.path.join(folder, n)))
            or n.endswith((".pt", ".distcp"))]


def check_load_path(path: str, flag: str = "--load") -> None:
    """--load: a missing folder means "train from scratch" (Megatron-LM's behaviour, with a
    warning later); a file, or a Megatron-LM checkpoint, is an error before the model is built."""
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise UserInputError(f"{flag} {path}: not a directory")
    if is_hf_folder(path):
        raise UserInputError(
            f"{flag} {path}: a Hugging Face model folder, not a training checkpoint; convert it first: "
            f"python tools/convert_checkpoint.py from-hf {path} DIR, then {flag} DIR"
            + (" --finetune (a new run from its weights)" if flag == "--load" else ""))
    folder = latest_iteration_folder(path)
    foreign = _megatron_lm_files(folder) if folder else []
    if foreign:
        raise UserInputError(
            f"{flag} {path}: {folder} is not a megatron-zaya checkpoint (looks like Megatron-LM: "
            f"{', '.join(foreign[:3])}); convert its weights to a Hugging Face ZAYA folder, then run tools/convert_checkpoint.py from-hf HF DIR "
            f"and use --load DIR --finetune")


def model_config_from_checkpoint(args, source: tuple[str, dict]) -> ModelConfig:
    """--use-checkpoint-args: the model config saved with the checkpoint `source` (checkpoint_args_source).
    Its vocabulary size counts as given, so the tokenizer's padded size does not replace it (a
    different tokenizer is then an error)."""
    folder, meta = source
    try:
        model = ModelConfig(**meta["model_config"])
    except TypeError as err:
        raise UserInputError(f"--use-checkpoint-args: {os.path.join(folder, METADATA_FILE)}: not a model config "
                             f"of this version ({err})") from None
    if args.vocab_size is None:
        args.vocab_size = model.vocab_size
    return model


def checkpoint_args_source(args) -> tuple[str, dict]:
    """(folder, metadata) of the checkpoint --use-checkpoint-args reads, once for the model config, the
    tokenizer and the TP size: --load's first candidate with readable metadata (as the load itself will
    try), else --pretrained-checkpoint's; UserInputError naming the flag."""
    if args.preset:
        raise UserInputError(f"--use-checkpoint-args and --preset {args.preset} exclude each other: the model "
                             f"config comes from --load's checkpoint")
    pretrained = getattr(args, "pretrained_checkpoint", None)
    if not (args.load or pretrained):
        raise UserInputError("--use-checkpoint-args needs --load (the checkpoint to take the model config from)")
    found, source = None, f"--load {args.load}"
    if args.load:
        check_load_path(args.load)
        found = first_candidate_metadata(args.load)
    if found is None and pretrained:
        check_load_path(pretrained, "--pretrained-checkpoint")
        found, source = first_candidate_metadata(pretrained), f"--pretrained-checkpoint {pretrained}"
    if found is None or not found[1].get("model_config"):
        raise UserInputError(f"--use-checkpoint-args: {source} holds no checkpoint with a model config in its "
                             f"{METADATA_FILE}")
    return found


def tokenizer_args_from_checkpoint(args, source: tuple[str, dict]) -> dict:
    """--use-checkpoint-args without --tokenizer-model: the tokenizer flags of the run that saved the
    checkpoint (as Megatron-LM takes its tokenizer model; --no-use-tokenizer-model-from-checkpoint-args
    turns it off), relative paths found from that run's directory or from here (recorded_tokenizer.py); {} when
    this run names its own tokenizer model or the checkpoint holds no run's flags (an offline conversion)."""
    if args.tokenizer_model is not None or not args.use_tokenizer_model_from_checkpoint_args:
        return {}
    recorded = recorded_tokenizer(source[1], os.path.join(source[0], METADATA_FILE))
    if recorded is None or "tokenizer_model" not in recorded.flags:
        return {}
    return recorded.flags


def tensor_parallel_from_checkpoint(source: tuple[str, dict] | None) -> int:
    """--use-mp-args-from-checkpoint-args (with --use-checkpoint-args, as in Megatron-LM, whose checkpoint
    `source` it reads): the tensor-parallel size of the run that saved the checkpoint (there is no pipeline
    parallelism here)."""
    if source is None:
        raise UserInputError("--use-mp-args-from-checkpoint-args needs --use-checkpoint-args (as in Megatron-LM)")
    folder, meta = source
    layout = meta.get("layout") or {}
    size = layout.get("tensor_model_parallel_size")
    if not isinstance(size, int) or size < 1:
        raise UserInputError(f"--use-mp-args-from-checkpoint-args: {os.path.join(folder, METADATA_FILE)} holds no "
                             f"tensor-parallel size (layout: {layout})")
    return size


def requires_checkpoint(train_cfg) -> bool:
    """Whether a --load without a checkpoint must stop the run (instead of training from scratch): also
    under --finetune, whose whole point is --load's weights (a fine-tune that is resumed names its base
    by --pretrained-checkpoint, read only while --load holds no checkpoint)."""
    return bool(train_cfg.exit_on_missing_checkpoint or train_cfg.skip_train or train_cfg.finetune)


HUB_LOAD_STEPS = "convert it (tools/convert_checkpoint.py from-hf DIR CKPT), then give --load CKPT --finetune"


def missing_checkpoint_message(train_cfg) -> str:
    return _missing_checkpoint_message(train_cfg) + hub_name_hint(train_cfg.load, then=HUB_LOAD_STEPS)


def _missing_checkpoint_message(train_cfg) -> str:
    if train_cfg.skip_train:
        return (f"--skip-train: --load {train_cfg.load} holds no checkpoint, so no model to evaluate (a typo in the "
                f"path, or no save has completed yet)")
    if train_cfg.finetune and not train_cfg.exit_on_missing_checkpoint:
        return (f"--finetune: --load {train_cfg.load} holds no checkpoint to start from (a typo in the path, or a "
                f"Hugging Face folder not converted yet?); drop --finetune to train from scratch, and to resume a "
                f"fine-tune give --load SAVE --pretrained-checkpoint BASE")
    return (f"--exit-on-missing-checkpoint: --load {train_cfg.load} holds no checkpoint to start from (a typo in the "
            f"path, or no save has completed yet); drop the flag to train from scratch")


def checkpoint_at_step(load: str, step: int) -> str:
    """--ckpt-step: the folder of iteration `step`'s complete checkpoint in --load (its save finished),
    else UserInputError naming the iterations --load does hold."""
    if step < 0:
        raise UserInputError(f"--ckpt-step={step}: an iteration, >= 0")
    if is_iteration_folder(load):
        raise UserInputError(f"--ckpt-step {step} picks an iteration inside --load's folder, but --load {load} is "
                             f"already one iteration's checkpoint: give its parent folder")
    folder = os.path.join(load, iter_dir_name(step))
    if not os.path.isfile(os.path.join(folder, COMPLETE_MARKER)):
        held = list_complete(load)
        what = f"complete ones: {', '.join(map(str, held[-8:]))}" if held else "it holds no complete checkpoint"
        raise UserInputError(f"--ckpt-step {step}: --load {load} has no complete checkpoint of iteration {step} "
                             f"({what})")
    return folder
