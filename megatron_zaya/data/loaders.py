"""Build train/valid/test datasets and per-rank DataLoaders from a `DataConfig`.

    train, valid_sets, test = build_train_valid_test_loaders(
        cfg, global_batch_size=512, micro_batch_size=4, seq_length=4096,
        dp_rank=rank, dp_size=world, consumed_samples=iteration * 512,
        train_samples=train_iters * 512, valid_samples=..., test_samples=...)

Each loader yields micro-batches: dicts of torch tensors `tokens` (B, S) int64, `labels` (B, S)
int64, `loss_mask` (B, S) float32, `position_ids` (B, S) int64, plus `document_ids` (B, S) int64
(the EODs before each position: Megatron's reset attention mask in compact form, the model builds
the mask) when `reset_attention_mask` is on. The train or test loader
is None when its split gets no samples; `valid_sets` is a list of (name, loader), one per
validation set (data/validation.py), empty without validation.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from megatron_zaya.errors import UserInputError

from .blend import BlendedDataset, PhasedDataset, parse_data_path, plan_phases
from .mock import MockGPTDataset
from .config import DataConfig
from .cache import build_order, cached_arrays
from .gpt_dataset import (GPTDataset, SampleOptions, default_cache_dir, kept_request, loss_masked_pad,
                          split_indices, token_id_outside, tokens_in_split)
from . import index_builders as ib
from .index_builders import build_blending_indices
from .index_check import open_checked
from .indexed import IndexedDataset
from .sampler import PretrainingBatchSampler
from .tokenizer import build_tokenizer
from .validation import PaddedToGroups, ValidationSet, concatenated, validation_set_names


SPLIT_NAMES = ("train", "valid", "test")


def megatron_num_samples(train_iters: int, global_batch_size: int, eval_interval: int, eval_iters: int) -> list[int]:
    """[train, valid, test] sample counts the way Megatron sizes them from iteration counts."""
    evals = (train_iters // eval_interval + 1) * eval_iters if eval_interval else 0
    return [train_iters * global_batch_size, evals * global_batch_size, eval_iters * global_batch_size]


def blend_weights(data_path: list[str], prefixes: list[str], lengths=None) -> list[float]:
    """The weight of each of `prefixes` in the blend `data_path`: a weighted list's weights; an unweighted list
    of several paths weighs each by its length, `lengths(prefix)` (the samples of one epoch of its split:
    `epoch_samples`), as Megatron-LM does. Unnormalized: plan_phases normalizes them once, as Megatron-LM."""
    weights, paths = parse_data_path(data_path)
    if weights is None and len(paths) > 1:
        if lengths is None:
            raise ValueError("an unweighted blend of several paths needs its datasets' lengths to weigh them")
        weights = [float(lengths(p)) for p in paths]
    elif weights is None:
        weights = [1.0]
    w = [0.0] * len(prefixes)
    for weight, p in zip(weights, paths):
        w[prefixes.index(p)] += weight
    return w


def epoch_samples(cfg: DataConfig, indexed: IndexedDataset, prefix: str, split_id: int, seq_length: int) -> int:
    """The samples in one epoch of `prefix`'s split `split_id` (Megatron-LM's length of a dataset built without
    a sample count, and its weight in an unweighted blend): seq_length + 1 tokens each, overlapping by one."""
    ids, _ = split_documents(cfg, indexed, prefix, split_id)
    if ids is None or len(ids) == 0:
        return 0
    return max(0, (tokens_in_split(indexed, ids) - 1) // seq_length)


def blend_order(data_path: list[str], prefixes: list[str]) -> list[int]:
    """The components of `prefixes` in the order the blend `data_path` first names them: the blend's own
    dataset order, which breaks the greedy interleave's ties as in Megatron-LM (where a per-split blend or a
    phase names its datasets in another order than the run's list)."""
    return list(dict.fromkeys(prefixes.index(p) for p in parse_data_path(data_path)[1]))


def split_documents(cfg: DataConfig, indexed: IndexedDataset, prefix: str, split_id: int):
    """(the document ids of `prefix` in split `split_id`, or None; how an error names that split)."""
    split_name = SPLIT_NAMES[split_id]
    if cfg.separate_splits:      # a per-split blend: every document of the dataset is in the split
        return split_indices(indexed, "1,0,0")[0], f"--{split_name}-data-path: {prefix}"
    return split_indices(indexed, cfg.split)[split_id], f"--split {cfg.split}: the {split_name} split of {prefix}"


def no_sample_error(cfg: DataConfig, blend: list[str], split_id: int, seq_length: int) -> UserInputError:
    """An unweighted list of which not one dataset holds a sample of split `split_id`."""
    split_name = SPLIT_NAMES[split_id]
    given = f"--split {cfg.split}" if not cfg.separate_splits else f"--{split_name}-data-path"
    return UserInputError(f"{given}: no dataset of {' '.join(blend)} holds a sample ({seq_length + 1} tokens) in the "
                          f"{split_name} split")


def weighted(cfg: DataConfig, blend: list[str]) -> bool:
    """Whether `blend` is read as weighted (each dataset asked for a surplus); Megatron reads a per-split blend
    of one path (`--train-data-path 1.0 P`) as the path itself."""
    given, paths = parse_data_path(blend)
    return given is not None and not (cfg.separate_splits and len(paths) == 1)


def _build_split(cfg: DataConfig, indexed: dict, prefixes: list[str], blends: list[list[str]], sizes: list[int],
                 split_id: int, opts: SampleOptions, start: list[int] | None = None, kept: list[int] | None = None):
    if sum(sizes) == 0 or not any(blends):
        return None
    if not cfg.separate_splits and ib.parse_split(cfg.split)[split_id] == 0:
        return None  # Megatron: a split with zero weight has no dataset
    lengths = functools.cache(lambda p: epoch_samples(cfg, indexed[p], p, split_id, opts.seq_length))
    weights = [blend_weights(b, prefixes, lengths) for b in blends]
    if split_id == 2 and not cfg.separate_splits:
        # A dataset whose --split test share holds no sample (seq_length + 1 tokens) has no part in the test blend
        # (its samples would be one short text repeated; an unweighted list weighs it 0 already), and without any
        # such sample there is no test evaluation, as tools/evaluate.py refuses that split.
        sampled = [lengths(p) > 0 for p in prefixes]
        if not any(sampled):
            return None
        weights = [[w if has else 0.0 for w, has in zip(ws, sampled)] for ws in weights]
    split_name = SPLIT_NAMES[split_id]
    for blend, w in zip(blends, weights):
        if sum(w) == 0:       # an unweighted list, and not one of its datasets holds a sample of this split
            raise no_sample_error(cfg, blend, split_id, opts.seq_length)
    cache_dir = None if cfg.no_index_cache else (cfg.data_cache_path or default_cache_dir(prefixes[0]))

    def blending(w, size):
        if len(w) == 1:
            return build_blending_indices(w, size)
        arrays = cached_arrays(cache_dir, "BlendedDataset", {"class": "BlendedDataset", "weights": w, "size": size},
                               ["dataset_index", "dataset_sample_index"],
                               lambda: dict(zip(("dataset_index", "dataset_sample_index"), build_blending_indices(w, size))))
        return arrays["dataset_index"], arrays["dataset_sample_index"]

    plan = plan_phases(weights, sizes, cfg.mid_level_dataset_surplus, blending, [weighted(cfg, b) for b in blends],
                       [blend_order(b, prefixes) for b in blends], start)
    ids = {}
    for d, prefix in enumerate(prefixes):
        if plan.requests[d] == 0:
            continue
        idx, where = split_documents(cfg, indexed[prefix], prefix, split_id)
        if (idx is None or len(idx) == 0) and split_id == 2 and not cfg.separate_splits:
            return None      # a --split share too small to hold a document: no test evaluation (training goes on)
        if idx is None or len(idx) == 0:
            raise UserInputError(f"{where} is empty but the blend needs {plan.requests[d]} samples from it")
        ids[d] = idx
    # Each node builds (or waits for) the datasets' indices from its own one on: a first start builds
    # several at once, one per node (a build of ZAYA1's size takes minutes and GBs).
    built = {d: GPTDataset(indexed[prefixes[d]], ids[d], kept_request(indexed[prefixes[d]], ids[d], plan.requests[d],
                                                                    kept[d] if kept else 0, opts.seq_length),
                           opts, cfg.seed, split_name, cfg.data_cache_path, use_cache=not cfg.no_index_cache)
             for d in build_order(list(ids), per_node=True)}
    components = [built.get(d) for d in range(len(prefixes))]
    phases = [BlendedDataset(components, plan.dataset_index[p], plan.dataset_sample_index[p], plan.offsets[p],
                             plan.counts[p]) for p in range(len(sizes))]
    return phases[0] if len(phases) == 1 else PhasedDataset(phases)


def _one_pass(cfg: DataConfig, indexed: IndexedDataset, prefix: str, opts: SampleOptions):
    """Every sample of `prefix`'s validation documents once (--full-validation)."""
    idx, where = split_documents(cfg, indexed, prefix, 1)
    if idx is None or len(idx) == 0:
        raise UserInputError(f"--full-validation: {where} is empty")
    return GPTDataset(indexed, idx, None, opts, cfg.seed, "valid", cfg.data_cache_path,
                      use_cache=not cfg.no_index_cache)


def _build_validation_sets(cfg: DataConfig, indexed: dict, prefixes: list[str], blend: list[str], num_samples: int,
                           opts: SampleOptions) -> list[ValidationSet]:
    """The run's validation sets (data/validation.py); none when the split has no blend, no share or no samples."""
    if not blend or num_samples == 0 or (not cfg.separate_splits and ib.parse_split(cfg.split)[1] == 0):
        return []
    members = list(dict.fromkeys(parse_data_path(blend)[1]))
    if cfg.multiple_validation_sets:
        groups, names = [[p] for p in members], validation_set_names(members)
    else:
        groups, names = [blend], [""]
    sets = []
    for name, group in zip(names, groups):
        if cfg.full_validation:
            dataset = concatenated([_one_pass(cfg, indexed[p], p, opts) for p in dict.fromkeys(parse_data_path(group)[1])])
        else:
            dataset = _build_split(cfg, indexed, prefixes, [group], [num_samples], 1, opts)
        if dataset is not None:
            sets.append(ValidationSet(name, dataset))
    return sets


@dataclass
class SplitDatasets:
    train: object | None        # None: no training samples
    valid: list[ValidationSet]  # empty: no validation
    test: object | None


def build_split_datasets(cfg: DataConfig, seq_length: int, train_valid_test_num_samples: list[int],
                         tokenizer=None, datasets: dict | None = None, train_start: dict[str, int] | None = None,
                         train_kept: dict[str, int] | None = None) -> SplitDatasets:
    """The train and test datasets and the validation sets (several with --multiple-validation-sets);
    the validation size is per set (ignored by --full-validation). `datasets`: open_datasets(cfg), if at
    hand (opening checks each whole index, and it is also hashed once per opened dataset). `train_start`: per
    dataset prefix, the train samples of it that a resumed run's earlier data phases read (training/data_phase.py):
    the train split reads on after them; `train_kept`: the samples its index was built for then (kept_request)."""
    if tokenizer is None:
        if not cfg.tokenizer_type:
            raise ValueError("DataConfig.tokenizer_type (--tokenizer-type) is required to know the EOD id, "
                             "or pass tokenizer=")
        tokenizer = build_tokenizer(cfg.tokenizer_type, cfg.tokenizer_model, **cfg.tokenizer_kwargs())
    opts = SampleOptions(seq_length, tokenizer.eod, loss_masked_pad(tokenizer), cfg.reset_position_ids,
                         cfg.reset_attention_mask, cfg.eod_mask_loss, tokenizer.vocab_size)
    train_n, valid_n, test_n = (int(x) for x in train_valid_test_num_samples)
    if cfg.mock_data:     # a split of no --split share has no set, as Megatron-LM's mock data and real data here
        shares = ib.parse_split(cfg.split)
        train, valid, test = (MockGPTDataset(n, opts, tokenizer.vocab_size, cfg.seed, split_id)
                              if n > 0 and shares[split_id] > 0 else None
                              for split_id, n in enumerate((train_n, valid_n, test_n)))
        return SplitDatasets(train, [ValidationSet("", valid)] if valid is not None else [], test)
    train_blend, valid_blend, test_blend = cfg.split_blends()
    blends = [p.data_path for p in cfg.phases] if cfg.phases else [train_blend]
    prefixes = dataset_prefixes(cfg)
    indexed = datasets if datasets is not None else open_datasets(cfg)
    if cfg.phases:
        sizes, used = [], 0
        for ph in cfg.phases:
            n = ph.train_samples if ph.train_samples is not None else max(0, train_n - used)
            n = min(n, train_n - used)
            sizes.append(n)
            used += n
        if used < train_n:
            raise ValueError(f"phases cover {used} train samples but {train_n} are needed; leave the last phase's train_samples empty")
    else:
        sizes = [train_n]
    start, kept = ([(given or {}).get(p, 0) for p in prefixes] for given in (train_start, train_kept))
    return SplitDatasets(train=_build_split(cfg, indexed, prefixes, blends, sizes, 0, opts, start, kept),
                         valid=_build_validation_sets(cfg, indexed, prefixes, valid_blend, valid_n, opts),
                         test=_build_split(cfg, indexed, prefixes, [test_blend], [test_n], 2, opts))


def dataset_prefixes(cfg: DataConfig) -> list[str]:
    """Every dataset prefix the run reads (training phases, validation and test blends), each once."""
    train_blend, valid_blend, test_blend = cfg.split_blends()
    blends = [p.data_path for p in cfg.phases] if cfg.phases else [train_blend]
    named = [p for blend in blends + [valid_blend, test_blend] if blend for p in parse_data_path(blend)[1]]
    return list(dict.fromkeys(named))     # (a prefix named twice in one blend: once too)


def last_token(data: IndexedDataset, doc: int) -> int | None:
    """The last token of document `doc` (None for an empty one), read alone."""
    for seq in range(int(data.document_indices[doc + 1]) - 1, int(data.document_indices[doc]) - 1, -1):
        length = int(data.sequence_lengths[seq])
        if length:
            return int(data.get(seq, length - 1, 1)[0])
    return None


def open_datasets(cfg: DataConfig) -> dict[str, IndexedDataset]:
    """Every dataset the run reads, opened once for the checks made before the model is built; each whole
    index checked once per version of its files (index_check.open_checked)."""
    if cfg.mock_data:
        return {}
    cache_dir_of = None if cfg.no_index_cache else lambda prefix: cfg.data_cache_path or default_cache_dir(prefix)
    return open_checked(dataset_prefixes(cfg), cfg.mmap_bin_files, cache_dir_of)


def missing_eod_warnings(cfg: DataConfig, eod: int, sample: int = 64, datasets=None) -> list[str]:
    """--reset-attention-mask, --reset-position-ids and --eod-mask-loss act at EOD tokens: a warning for
    each dataset none of whose first `sample` documents ends with one (preprocessed without
    --append-eod), where those flags would do nothing. `datasets`: open_datasets(cfg), if at hand."""
    flags = [f"--{name.replace('_', '-')}" for name in ("reset_attention_mask", "reset_position_ids", "eod_mask_loss")
             if getattr(cfg, name)]
    if not flags or cfg.mock_data:
        return []
    out = []
    for prefix, data in (open_datasets(cfg) if datasets is None else datasets).items():
        ends = [last_token(data, d) for d in range(min(sample, data.num_documents))]
        if eod not in ends:
            out.append(f"{' '.join(flags)}: none of the first {len(ends)} documents of {prefix} ends with the EOD "
                       f"token (id {eod}), so these flags find no document boundary there (preprocess with "
                       f"--append-eod)")
    return out


def unread_dataset_warnings(cfg: DataConfig, seq_length: int, datasets: dict) -> list[str]:
    """A warning for each dataset of an unweighted blend of several paths whose split holds no sample
    (seq_length + 1 tokens): its weight, its length, is 0, so the blend never reads it. (Megatron-LM stops at
    such a dataset; a blend none of whose datasets holds a sample is the build's error.) `datasets`:
    open_datasets(cfg)."""
    if cfg.mock_data:
        return []
    train, valid, test = cfg.split_blends()
    per_split = [[p.data_path for p in cfg.phases] if cfg.phases else [train], [valid], [test]]
    if cfg.multiple_validation_sets or cfg.full_validation:
        per_split[1] = []       # each validation dataset on its own
    shares = [1, 1, 1] if cfg.separate_splits else ib.parse_split(cfg.split)
    out = []
    for split_id, blends in enumerate(per_split):
        for blend in blends if shares[split_id] else []:
            weights, paths = parse_data_path(blend) if blend else (None, [])
            if weights is not None or len(paths) < 2:
                continue
            lengths = {p: epoch_samples(cfg, datasets[p], p, split_id, seq_length) for p in dict.fromkeys(paths)}
            if any(lengths.values()):
                out += [f"{p}: its {SPLIT_NAMES[split_id]} split holds no sample of {seq_length + 1} tokens, so the "
                        f"blend {' '.join(blend)} (no weights: shares by length) never reads it"
                        for p, n in lengths.items() if n == 0]
    return list(dict.fromkeys(out))


def check_token_ids(cfg: DataConfig, vocab_size: int, sample_tokens: int = 1 << 20, datasets=None) -> None:
    """UserInputError naming the dataset when one of the first `sample_tokens` tokens of any dataset the
    run reads is not a token id of the tokenizer (the dataset preprocessed with another tokenizer): a
    cheap look before the model is built. Every sample is checked again when it is read (GPTDataset).
    `datasets`: open_datasets(cfg), if at hand."""
    for prefix, data in (open_datasets(cfg) if datasets is None else datasets).items():
        tokens = data.tokens(0, min(sample_tokens, data.num_tokens))     # one read: short sequences are many
        bad = token_id_outside(tokens, vocab_size)
        if bad is not None:
            position = int(np.flatnonzero(tokens == bad)[0]) * data.dtype.itemsize
            seq = int(np.searchsorted(data.sequence_pointers, position, side="right")) - 1
            raise UserInputError(f"--data-path {prefix}: sequence {seq} holds token id {bad}, outside the "
                                 f"vocabulary of --tokenizer-type {cfg.tokenizer_type} ({vocab_size} ids): was the "
                                 f"dataset preprocessed with another tokenizer?")


def build_train_valid_test_datasets(cfg: DataConfig, seq_length: int, train_valid_test_num_samples: list[int],
                                    tokenizer=None):
    """(train, valid, test) datasets (None for a split with no samples); one validation set only
    (build_split_datasets gives several)."""
    splits = build_split_datasets(cfg, seq_length, train_valid_test_num_samples, tokenizer)
    if len(splits.valid) > 1:
        raise ValueError("several validation sets (--multiple-validation-sets): use build_split_datasets")
    return splits.train, splits.valid[0].dataset if splits.valid else None, splits.test


def collate(samples: list[dict]) -> dict:
    import torch

    out = {}
    for k in samples[0]:
        arr = np.stack([s[k] for s in samples])
        out[k] = torch.from_numpy(arr)
    return out


def leave_stop_signals_to_the_trainer(_worker_id: int) -> None:
    """A loader worker ignores SIGTERM, SIGUSR1 and SIGINT: Slurm (scancel, a time limit, preemption) signals
    every process of a step, and torch's worker handler exits on a SIGTERM its parent did not send, which
    the training process then reports as a crashed worker instead of saving its checkpoint. The training
    process handles the signal and stops its workers itself (training/signals.py); a process that leaves
    without stopping them (an unhandled error) kills them at exit (`kill_abandoned_loader_workers`)."""
    import signal
    for name in ("SIGTERM", "SIGUSR1", "SIGINT"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)


def kill_abandoned_loader_workers() -> None:
    """At interpreter exit, before multiprocessing's own exit function (atexit runs the later registration
    first): SIGKILL every daemonic child still alive, which in a process that built a loader with workers
    are its workers (multiprocessing would terminate them too, with a SIGTERM). A process leaving on an
    unhandled error keeps its loader iterator in the traceback, so nothing stopped the workers; they ignore
    SIGTERM (leave_stop_signals_to_the_trainer), and multiprocessing would wait for them for ever."""
    import multiprocessing
    import signal
    import threading

    children = [child for child in multiprocessing.active_children() if child.daemon]
    if children and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)   # torch's handler would report each kill as a crash
    for child in children:
        child.kill()
        child.join()


@functools.cache
def _kill_abandoned_workers_at_exit() -> None:
    """Registers kill_abandoned_loader_workers once per process (the first loader with workers)."""
    import atexit
    atexit.register(kill_abandoned_loader_workers)


def make_loader(dataset, consumed_samples: int, micro_batch_size: int, dp_rank: int, dp_size: int,
                cfg: DataConfig, drop_last: bool = True):
    import torch
    from torch.utils.data import DataLoader

    sampler = PretrainingBatchSampler(len(dataset), consumed_samples, micro_batch_size, dp_rank, dp_size, drop_last)
    workers = cfg.num_workers
    if workers > 0:
        _kill_abandoned_workers_at_exit()
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=bool(cfg.pin_memory and torch.cuda.is_available()),
        prefetch_factor=cfg.prefetch_factor if workers > 0 else None,
        persistent_workers=workers > 0,
        worker_init_fn=leave_stop_signals_to_the_trainer if workers > 0 else None,
        # Each iter() draws its workers' base seed from this generator: from torch's global one, a resumed
        # job (which makes its train iterator after the checkpoint restored the RNG) would save a random
        # state one draw apart from the uninterrupted run's.
        generator=torch.Generator().manual_seed(cfg.seed),
    )


def build_train_valid_test_loaders(cfg: DataConfig, global_batch_size: int, micro_batch_size: int, seq_length: int,
                                   dp_rank: int, dp_size: int, consumed_samples: int = 0, *,
                                   train_samples: int | list[int], valid_samples: int = 0, test_samples: int = 0,
                                   tokenizer=None, datasets: dict | None = None,
                                   train_start: list[dict[str, int]] | None = None,
                                   train_kept: list[dict[str, int]] | None = None):
    """(train_loader, validation loaders, test_loader) for this data-parallel rank; see the module
    docstring. The validation loaders are a list of (name, loader), one per validation set (empty:
    no validation); each reads its set from the start at every evaluation. Under --full-validation
    a set is padded with masked samples to whole micro-batch groups (data/validation.py). `datasets`: see
    build_split_datasets. `train_samples` as a list: the sizes of a data phase's blocks (train_blocks.py),
    one after the other, block k shuffled with --seed + k; `train_start` and `train_kept`: each block's
    (build_split_datasets)."""
    if global_batch_size % (micro_batch_size * dp_size):
        raise ValueError(f"--global-batch-size {global_batch_size} is not a multiple of --micro-batch-size "
                         f"{micro_batch_size} x data-parallel size {dp_size}")
    blocks = [train_samples] if isinstance(train_samples, int) else list(train_samples)
    starts, kept = ([*(given or []), *[{}] * len(blocks)] for given in (train_start, train_kept))
    splits = build_split_datasets(cfg, seq_length, [blocks[0], valid_samples, test_samples], tokenizer, datasets,
                                  starts[0], kept[0])
    train = splits.train
    if train is not None and len(blocks) > 1:
        more = [build_split_datasets(dataclasses.replace(cfg, seed=cfg.seed + k), seq_length, [n, 0, 0], tokenizer,
                                     datasets, starts[k], kept[k]).train for k, n in enumerate(blocks[1:], 1)]
        train = PhasedDataset([train, *more])          # (by start offsets: no per-sample index)
    train_loader = make_loader(train, consumed_samples, micro_batch_size, dp_rank, dp_size, cfg) \
        if train else None
    valid_loaders = []
    for valid in splits.valid:
        dataset = PaddedToGroups(valid.dataset, micro_batch_size * dp_size) if cfg.full_validation else valid.dataset
        valid_loaders.append((valid.name, make_loader(dataset, 0, micro_batch_size, dp_rank, dp_size, cfg)))
    test_loader = make_loader(splits.test, 0, micro_batch_size, dp_rank, dp_size, cfg) if splits.test else None
    return train_loader, valid_loaders, test_loader
