"""Cheap checks of the inference tools' flags (tools/generate.py, tools/evaluate.py,
tools/run_text_generation_server.py), made before a checkpoint is loaded. Each raises
`UserInputError` with a one-line message naming the flag and value.

    check_threads(args.threads); device = check_device(args.device)
    check_writable_output("--output-json", args.output_json)
    config = peek_model_config(args.load)     # ModelConfig or None, without reading any tensor
    tokenizer = tokenizer_from_flags(args)    # the flags of add_tokenizer_arguments(parser)
    check_tokenizer_fits(tokenizer, config, args)
    ...
    write_output_json("--output-json", args.output_json, report)   # after the run: atomic, errors one line
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import torch

from megatron_zaya.config import ModelConfig
from megatron_zaya.errors import UserInputError, hub_name_hint
from megatron_zaya.paths import nearest_existing


def add_tokenizer_arguments(parser, required: bool = False) -> None:
    """Megatron's tokenizer flags: --tokenizer-type, --tokenizer-model, GPT-2's two files, TikTokenizer's."""
    from megatron_zaya.data.tokenizer import add_tiktoken_arguments
    parser.add_argument("--tokenizer-type", required=required,
                        help="Megatron tokenizer name, e.g. GPTSentencePieceTokenizer")
    parser.add_argument("--tokenizer-model", default=None,
                        help="tokenizer model file / folder (GPT2BPETokenizer: or the two files below)")
    parser.add_argument("--vocab-file", default=None, help="GPT2BPETokenizer: GPT-2's vocab.json")
    parser.add_argument("--merge-file", default=None, help="GPT2BPETokenizer: GPT-2's merges.txt")
    add_tiktoken_arguments(parser)


OWN_TOKENIZER = ("--load brings its own (a Hugging Face folder with a tokenizer.json, or a training checkpoint "
                 "whose run's tokenizer files are found)")


def tokenizer_from_flags(args):
    """The tokenizer of add_tokenizer_arguments' flags (the flags checked before any file is read).
    Without tokenizer flags, the --load checkpoint's own, said on stderr and set into args: a Hugging
    Face folder's tokenizer.json (as HuggingFaceTokenizer), or the tokenizer flags the training run that
    saved it recorded (checkpoint/recorded_tokenizer.py); else None."""
    from megatron_zaya.data.tokenizer import (build_tokenizer, null_tokenizer_size_from_vocab_size,
                                              tiktoken_options, tokenizer_flags)
    null_tokenizer_size_from_vocab_size(args)
    given = [flag for flag in tokenizer_flags(args) if flag != "--tokenizer-type"]
    if not (args.tokenizer_type or given):
        if not getattr(args, "load", None) or not tokenizer_of_checkpoint(args):
            return None
    if not args.tokenizer_type:
        raise UserInputError(f"{given[0]} needs --tokenizer-type")
    tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model, vocab_file=args.vocab_file,
                                merge_file=args.merge_file, **tiktoken_options(args))
    if tokenizer_flags(args) and getattr(args, "load", None):    # flags given: said when --load's own differs
        warning = other_than_the_checkpoints(args, tokenizer)
        if warning:
            print(f"WARNING {warning}", file=sys.stderr)
    return tokenizer


def other_than_the_checkpoints(args, tokenizer) -> str | None:
    """When --load brings its own tokenizer (a folder's tokenizer.json, or the one its training run recorded)
    and `tokenizer`, built from the given flags, encodes otherwise or has another size or EOD: what differs, in
    words (the model would read other ids than it was trained on). None when they agree or --load has none."""
    import argparse
    from megatron_zaya.data.dataset_tokenizer import differences, tokenizer_identity
    from megatron_zaya.data.tokenizer import TOKENIZER_DESTS, build_tokenizer, tiktoken_options
    own = argparse.Namespace(**{**vars(args), **dict.fromkeys(TOKENIZER_DESTS)})
    found, _ = adopt_own_tokenizer(own)
    if found is None:
        return None
    source = found if isinstance(found, str) else "the tokenizer the training run that saved --load recorded"
    try:
        theirs = build_tokenizer(own.tokenizer_type, own.tokenizer_model, vocab_file=own.vocab_file,
                                 merge_file=own.merge_file, **tiktoken_options(own))
    except (UserInputError, OSError, ValueError):      # its files unreadable now: nothing to compare with
        return None
    differ = differences(tokenizer_identity(theirs), tokenizer_identity(tokenizer), ("its", "the given one's"))
    if not differ:
        return None
    return (f"the tokenizer flags name another tokenizer than {source} ({own.tokenizer_type} "
            f"{own.tokenizer_model}): {'; '.join(differ)}; the model reads ids it was not trained on")


def check_loadable(path: str) -> None:
    """UserInputError naming --load's problem, when it is neither a Hugging Face folder nor a complete checkpoint
    whose metadata reads (no tensor is read)."""
    from megatron_zaya.checkpoint.format import CheckpointError, read_folder_metadata
    from megatron_zaya.checkpoint.hf_format import is_hf_folder
    from megatron_zaya.checkpoint.inspection import resolve_folder
    if not os.path.exists(path):
        raise UserInputError(f"--load {path}: no such checkpoint (file or folder)" + hub_name_hint(path))
    if not is_hf_folder(path):
        try:
            read_folder_metadata(resolve_folder(path))
        except CheckpointError as err:
            raise UserInputError(f"--load: {err}") from None


def tokenizer_of_checkpoint(args) -> bool:
    """Sets the tokenizer flags in args to --load's own tokenizer (saying so on stderr); False when it has
    none (a note on stderr when its training run's tokenizer files are not found)."""
    check_loadable(str(args.load))      # its own problem first, not "--tokenizer-type is required"
    own, why = adopt_own_tokenizer(args)
    if own is None:
        if why:
            print(f"tokenizer: none from --load {args.load}: {why}; give the tokenizer flags", file=sys.stderr)
        return False
    if isinstance(own, str):
        print(f"tokenizer: {own} of --load (as --tokenizer-type HuggingFaceTokenizer; the tokenizer flags "
              f"override it)", file=sys.stderr)
    else:
        print(f"tokenizer: {own.command_line()}, as the training run that saved --load (the tokenizer flags "
              f"override it)", file=sys.stderr)
    return True


def adopt_own_tokenizer(args):
    """Set args' tokenizer flags to --load's own tokenizer: (its tokenizer.json, None) for a Hugging Face folder
    that has one, else (the RecordedTokenizer of the training run that saved it, None); (None, why) when that
    run's tokenizer files are not found from here; (None, None) when it has none."""
    from megatron_zaya.checkpoint.recorded_tokenizer import adopt_recorded_tokenizer
    beside = os.path.join(str(args.load), "tokenizer.json")
    if os.path.isfile(beside):
        args.tokenizer_type, args.tokenizer_model = "HuggingFaceTokenizer", beside
        return beside, None
    return adopt_recorded_tokenizer(args, str(args.load))


def check_tokenizer_fits(tokenizer, config: ModelConfig, args) -> None:
    """The tokenizer's vocabulary fits in the checkpoint's embedding rows."""
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        raise UserInputError(f"--tokenizer-type {args.tokenizer_type} "
                             f"({getattr(tokenizer, 'model_path', args.tokenizer_model)}): vocabulary "
                             f"{tokenizer.vocab_size} is larger than the checkpoint's {config.vocab_size} embedding rows")


def check_threads(threads: int | None) -> None:
    """--threads: None or 0 keep torch's default; a negative count is refused."""
    if threads is not None and threads < 0:
        raise UserInputError(f"--threads={threads} must be >= 1 (or 0 for torch's default)")


def check_device(name: str) -> torch.device:
    """--device parsed by torch.device; a CUDA device must exist on this machine."""
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise UserInputError(f"--device {name!r} is not a device torch knows (e.g. cpu, cuda, cuda:1): "
                             f"{str(err).splitlines()[0]}") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserInputError(f"--device {name}: CUDA is not available on this machine (try --device cpu)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserInputError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return device


def check_writable_output(flag: str, path: str | None, is_dir: bool = False, load: str | None = None) -> None:
    """An output file whose folder exists and is writable, and which, when it exists, is writable itself
    (a folder, `is_dir`, may be created: its closest existing ancestor must be a writable folder), and which is
    not inside the `load` folder (--output-json ckpt/iter_N/metadata.json replaced a file of the checkpoint)."""
    if path is None:
        return
    target = Path(path)
    if load is not None and os.path.isdir(load) and not _is_stream(path):
        folder = os.path.realpath(load)
        # where the name sits and where it leads: a Hugging Face cache's config.json links to ../../blobs/...
        place = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))
        if any(os.path.commonpath([where, folder]) == folder for where in (place, os.path.realpath(path))):
            raise UserInputError(f"{flag} {path}: inside the --load folder {load}: writing there would change the "
                                 f"checkpoint; give a path outside it")
    if not is_dir and (_is_stream(path) or _own_descriptor(path) is not None):
        if not os.access(target, os.W_OK):       # a stream (/dev/stdout, a pipe): written in place, not in /dev
            raise UserInputError(f"{flag} {path}: cannot be written")
        return
    if is_dir:
        if target.exists() and not target.is_dir():
            raise UserInputError(f"{flag} {path}: exists and is not a folder")
        base = Path(nearest_existing(target, f"{flag} {path}"))
    else:
        if target.is_dir():
            raise UserInputError(f"{flag} {path}: is a folder, expected a file name")
        base = target.absolute().parent
        if not base.is_dir():
            raise UserInputError(f"{flag} {path}: folder {base} does not exist")
    if not base.is_dir():
        raise UserInputError(f"{flag} {path}: {base} is not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise UserInputError(f"{flag} {path}: cannot write in {base}")
    if not is_dir and target.exists() and not os.access(target, os.W_OK):
        raise UserInputError(f"{flag} {path}: exists and cannot be written (read-only, or another user's file)")


def _is_stream(path: str) -> bool:
    """Whether `path` exists and is neither a regular file nor a folder (a pipe, a terminal, /dev/null)."""
    return os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path)


def _own_descriptor(path: str) -> int | None:
    """The descriptor of this process that `path` names (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N,
    or any other name of the file stdout or stderr writes to, a symlink to /dev/stdout among them); None for any
    other path. Opening such a path anew would write at offset 0 of a redirected log, and renaming over it would
    replace the log."""
    named = {"/dev/stdout": 1, "/dev/stderr": 2}.get(os.path.abspath(path))
    match = re.fullmatch(r"/(?:dev/fd|proc/self/fd)/(\d+)", os.path.abspath(path))
    if named is not None or match:
        return named if named is not None else int(match.group(1))
    try:
        target = os.stat(path)
    except OSError:
        return None
    for descriptor in (1, 2):
        try:
            if os.path.samestat(target, os.fstat(descriptor)):
                return descriptor
        except OSError:          # (closed)
            continue
    return None


def write_output_json(flag: str, path: str, obj) -> None:
    """`obj` as indented JSON in `path`. A new or regular file is written atomically (a temporary file in its
    folder renamed over it: an existing file is kept whole until the new one is complete); through a symlink,
    the file it names. A stream is written through this process's own descriptor where `path` names one
    (`/dev/stdout`, `/dev/fd/N` of `>(jq .)`), else appended to (a named pipe): the stdout of a job may be
    its log file, which a rename or a write at offset 0 would lose. An OSError (a file made
    read-only or a folder removed since check_writable_output) becomes a one-line UserInputError naming
    `flag`."""
    from megatron_zaya.checkpoint.format import atomic_write_bytes
    data = (json.dumps(obj, indent=2, default=str) + "\n").encode("utf-8")
    try:
        descriptor = _own_descriptor(path)
        if descriptor is not None:        # written through it: at its offset, between what is printed before and after
            sys.stdout.flush()
            sys.stderr.flush()
            view = memoryview(data)
            while view:
                view = view[os.write(descriptor, view):]
        elif _is_stream(path):          # (a regular file under /dev/shm is a file: replaced atomically)
            with open(path, "ab") as f:
                f.write(data)
        else:                                     # (os.path.realpath: through a symlink, the file it names)
            atomic_write_bytes(os.path.realpath(path), data)
    except OSError as err:
        raise UserInputError(f"{flag} {path}: cannot write ({err.strerror or err})") from err


def peek_model_config(path) -> ModelConfig | None:
    """The checkpoint's ModelConfig from its config.json (HF folder) or metadata.json (ours), without
    reading any tensor; None when it cannot be read cheaply (the loader then reports the problem)."""
    from megatron_zaya.checkpoint.format import METADATA_FILE, CheckpointError
    from megatron_zaya.checkpoint.hf_format import config_from_hf_file
    from megatron_zaya.checkpoint.inspection import resolve_folder
    from megatron_zaya.config import ConfigError

    path = Path(path)
    try:
        if (path / "config.json").is_file():
            return config_from_hf_file(path / "config.json")
        meta = json.loads((Path(resolve_folder(str(path))) / METADATA_FILE).read_text(encoding="utf-8"))
        return ModelConfig(**meta["model_config"])
    except (OSError, ValueError, KeyError, TypeError, CheckpointError, ConfigError):
        return None


def check_prompts_fit(config: ModelConfig, prompts: list[list[int]], max_new_tokens: int,
                      eod_id: int | None, tokenizer_vocab: int | None = None) -> None:
    """Every prompt has a token; its ids and --eod-id are inside the checkpoint's vocabulary (and the
    tokenizer's, when there is one: its padded rows are no tokens); prompt + --max-new-tokens within
    its max_position_embeddings."""
    vocab = config.vocab_size
    limit, whose = (vocab, "the checkpoint's vocabulary")
    if tokenizer_vocab is not None and tokenizer_vocab < vocab:
        limit, whose = tokenizer_vocab, "the tokenizer's vocabulary"
    if eod_id is not None and not 0 <= eod_id < limit:      # (generation picks only the tokenizer's ids)
        raise UserInputError(f"--eod-id={eod_id} is outside {whose} [0, {limit}): generation could never stop there")
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise UserInputError(f"prompt {i} is empty: give at least one token (e.g. --add-bos)")
        bad = [t for t in prompt if not 0 <= t < limit]
        if bad:
            raise UserInputError(f"prompt {i}: token ids {bad[:5]} outside {whose} [0, {limit})")
        if len(prompt) + max_new_tokens > config.max_position_embeddings:
            raise UserInputError(f"prompt {i}: {len(prompt)} tokens + --max-new-tokens={max_new_tokens} exceeds the "
                                 f"checkpoint's max_position_embeddings {config.max_position_embeddings}")
