"""Where a run's training data starts, across the phases of a multi-phase recipe.

A phase of a recipe (examples/zaya1_base/) resumes the previous phase's checkpoint with another data
blend or sequence length. Megatron-LM keeps reading the new data at the checkpoint's
consumed_samples (its dataset is sized for the whole run from sample 0); after a long phase that
position lies far beyond the new phase's dataset, and a new blend would start deep inside.

Here the train state carries a data signature (blend, phases, split, sequence length). When a
loaded checkpoint's signature differs from this run's, a new data phase starts: its data position
is 0 of its own dataset, which is sized for the iterations left. The phase start (iteration and
consumed samples) is saved in later checkpoints, so resuming mid-phase is exact. Same signature, or
a checkpoint without one: Megatron's behaviour (one position for the whole run).

A dataset the new phase shares with earlier ones continues after the samples they read of it (the train
state's data_offsets, per dataset and block of the phase's train dataset: the greedy interleave of each
earlier phase's blend counted over the samples it consumed, `phase_draws`), as the phases of one run do
(data/blend.py), so that a recipe's phase 2 does not train again on the web text phase 1 read; its index is
built for the size the earlier phase's was (data_index_sizes, gpt_dataset.kept_request), so that the order
is the same. That needs the samples to be the same: a change of --seq-length or --split starts every dataset
anew, and a phase whose shares its signature cannot tell starts its own datasets anew (with a warning where
the new blend reads one that was read before).

The global batch size is not part of the signature: the samples are the same whatever their
grouping, so a run that only changes --global-batch-size keeps reading where it stopped (its
dataset is sized for the samples already consumed plus those of the iterations left at the new
batch size). Checkpoints written when the signature held it are compared without it.
Megatron-LM has no flag for this, so there is none here either.
"""
from __future__ import annotations

import json
import os

from megatron_zaya.data.blend import is_number, no_blending_index, parse_data_path, phase_shares, plan_phases
from megatron_zaya.data.index_builders import blending_counts, parse_split
from megatron_zaya.data.indexed import strip_suffix

PATH_FIELDS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")


def resolved_paths(items) -> list[str]:
    """A --data-path list with each dataset prefix as its real path (weights as given): the same files
    spelled another way (relative, ./, through a symlinked folder, with a .bin/.idx suffix) are the same
    data, and a resume from another working directory keeps its position."""
    items = [str(x) for x in items]
    weighted = len(items) > 1 and is_number(items[0])
    return [x if weighted and i % 2 == 0 else os.path.realpath(strip_suffix(x)) for i, x in enumerate(items)]


def data_signature(run) -> str:
    """The run's data signature; "" for a run without a data pipeline (synthetic batches)."""
    data = run.data
    if data is None:
        return ""
    separate = {name: list(getattr(data, name)) for name in PATH_FIELDS[1:] if getattr(data, name)}
    if data.mock_data:
        separate["mock_data"] = True
    return json.dumps(_resolved({"data_path": list(data.data_path), **separate,
                                 "phases": [[list(p.data_path), p.train_samples] for p in data.phases],
                                 "split": data.split, "seq_length": run.model.seq_length}), sort_keys=True)


def _resolved(fields: dict, blend=resolved_paths) -> dict:
    """`fields` with each --data-path list (those of the splits and of the phases) as `blend` gives it."""
    resolved = {k: blend(v) if k in PATH_FIELDS else v for k, v in fields.items()}
    if "phases" in fields:
        resolved["phases"] = [[blend(paths), samples] for paths, samples in fields["phases"]]
    return resolved


def _comparable_blend(items) -> list:
    """A --data-path list as compared: paths resolved, and a weighted blend's weights normalized as the
    blend uses them (to 12 digits), so that '30 A 70 B' and '0.3 A 0.7 B' are one blend. An unweighted
    list stays as it is: its datasets are asked for no surplus, unlike '0.5 A 0.5 B'."""
    items = resolved_paths(items)
    if len(items) > 1 and is_number(items[0]):
        weights, paths = parse_data_path(items)
        return [[float(f"{w:.12g}"), p] for w, p in zip(weights, paths)]
    return items


def _signature_fields(signature: str) -> dict:
    """The compared fields of a signature: paths resolved (checkpoints written before paths were stored
    resolved hold them as typed; they resolve against this run's working directory), weights and the
    --split as normalized shares ('98,2' and '98,2,0' split alike). Older checkpoints also stored the global
    batch size, which is not compared."""
    fields = json.loads(signature)
    fields.pop("global_batch_size", None)
    compared = _resolved(fields, _comparable_blend)
    if fields.get("split") is not None:
        compared["split"] = [float(f"{share:.12g}") for share in parse_split(fields["split"])]
    return compared


def data_changed(previous: str, current: str) -> bool:
    """Whether two non-empty data signatures describe different data (a new data phase)."""
    return _signature_fields(previous) != _signature_fields(current)


def enter_data_phase(state, signature: str, surplus: float = 0.005) -> str | None:
    """Start a new data phase on `state` when the loaded signature differs; the log line, or None. `surplus`:
    --mid-level-dataset-surplus (what a checkpoint saved before the index sizes were kept built its indices for)."""
    if not signature:            # no data pipeline: no data position to keep
        return None
    previous, state.data_signature = state.data_signature, signature
    if not previous or not data_changed(previous, signature):
        return None
    old, new = _signature_fields(previous), _signature_fields(signature)
    same_samples = old.get("seq_length") == new.get("seq_length") and old.get("split") == new.get("split")
    draws = phase_draws(_resolved(json.loads(previous)), state.data_blocks,
                        state.consumed_samples - state.data_start_samples) if same_samples else None
    read_before = set(state.data_offsets) | set(train_prefixes(old))
    if not same_samples:           # other samples: every dataset starts anew
        state.data_offsets, state.data_index_sizes = {}, {}
    elif draws is None:            # how much of each of its datasets the phase read is not known: those start anew
        for prefix in train_prefixes(old):
            state.data_offsets.pop(prefix, None)
            state.data_index_sizes.pop(prefix, None)
    else:                          # block k of every phase is shuffled with --seed + k: each goes on in its own
        if not state.data_offsets and not state.data_index_sizes:     # saved before either was kept: as planned
            state.data_index_sizes = planned_index_sizes(_resolved(json.loads(previous)), state.data_blocks, surplus)
        for prefix, per_block in draws.items():
            held = state.data_offsets.setdefault(prefix, [])
            held += [0] * (len(per_block) - len(held))
            for k, samples in enumerate(per_block):
                held[k] += samples
    state.data_start_iteration, state.data_start_samples = state.iteration, state.consumed_samples
    state.data_blocks = []
    changed = sorted(k for k, v in new.items() if old.get(k) != v)
    line = (f"data changed since the checkpoint ({', '.join(changed)}): a new data phase starts at iteration "
            f"{state.iteration} (consumed samples {state.consumed_samples})")
    reads = train_prefixes(new)
    going_on = {p: sum(state.data_offsets[p]) for p in reads if sum(state.data_offsets.get(p, []))}
    again = [p for p in reads if p in read_before and not sum(state.data_offsets.get(p, []))] if draws is None else []
    if going_on:
        return line + "; datasets read before continue after the samples the earlier phases read of them (" + \
            ", ".join(f"{p}: {n:,}" for p, n in going_on.items()) + ")"
    if again:
        why = ("the checkpoint's blend does not tell how much of each dataset it read (in-run phases, or an "
               "unweighted list of several datasets)") if same_samples else \
            "--seq-length or --split changed, so the samples differ"
        return f"WARNING: {line}; the datasets read before are read again from their start ({why}): {', '.join(again)}"
    return line + " from sample 0 of its own dataset"


def enter_run_data_phase(state, run) -> str | None:
    """enter_data_phase for `run`: its data signature and --mid-level-dataset-surplus."""
    return enter_data_phase(state, data_signature(run), getattr(run.data, "mid_level_dataset_surplus", 0.005))


def train_prefixes(fields: dict) -> list[str]:
    """The dataset prefixes a signature's train blend (its phases' too) reads: those of a positive weight."""
    blends = [paths for paths, _ in fields.get("phases") or []] or \
        [fields.get("train_data_path") or fields.get("data_path") or []]
    read = []
    for blend in filter(None, blends):
        weights, paths = parse_data_path(_as_items(blend))
        read += [p for w, p in zip(weights or [1.0] * len(paths), paths) if w > 0]
    return list(dict.fromkeys(read))


def _as_items(blend: list) -> list[str]:
    """A compared blend ([[weight, path], ...] or paths) as a --data-path list."""
    return [str(x) for item in blend for x in (item if isinstance(item, list) else [item])]


def phase_draws(fields: dict, blocks: list[int], consumed: int) -> dict[str, list[int]] | None:
    """The train samples of each dataset (by its prefix) that a data phase read in its first `consumed` samples,
    per block of its train dataset (data/train_blocks.py; read one after the other): its blend's greedy interleave
    (data/blend.py plan_phases: prefix-stable, so counted without the index); none under --mock-data. None when
    the signature's `fields` cannot tell: in-run phases, a dataset named twice, or an unweighted list of several
    datasets (Megatron-LM weighs those by their lengths)."""
    if fields.get("mock_data"):             # (random samples: none of a dataset)
        return {}
    blend = None if fields.get("phases") else _train_blend(fields)
    if blend is None:
        return None
    weights, paths, _ = blend
    active, shares, _ = phase_shares(weights, list(range(len(paths))))
    sizes = list(blocks or []) or [consumed]
    sizes[-1] += max(0, consumed - sum(sizes))          # (read past the recorded blocks: none, as they are saved)
    draws, left = {paths[d]: [] for d in active}, consumed
    for size in sizes:
        take = min(size, left)
        for d, n in zip(active, blending_counts(shares, take)):
            draws[paths[d]].append(int(n))
        left -= take
    return {p: n for p, n in draws.items() if any(n)}


def planned_index_sizes(fields: dict, blocks: list[int], surplus: float) -> dict[str, list[int]]:
    """The samples each dataset's index was built for, per block, by a phase that read every dataset from its start
    (data/blend.py plan_phases' requests)."""
    blend = None if fields.get("mock_data") or fields.get("phases") else _train_blend(fields)
    if blend is None:
        return {}
    weights, paths, weighted = blend
    sizes = {p: [] for p, w in zip(paths, weights) if w > 0}
    for size in blocks:
        requests = plan_phases([weights], [size], surplus, no_blending_index, [weighted]).requests
        for p, request in zip(paths, requests):
            if p in sizes:
                sizes[p].append(request)
    return sizes


def _train_blend(fields: dict) -> tuple[list[float], list[str], bool] | None:
    """(weights, prefixes, whether it is read as weighted) of a signature's train blend, as plan_phases takes it;
    None for a dataset named twice or an unweighted list of several datasets (Megatron-LM weighs those by their
    lengths, which the signature does not hold)."""
    weights, paths = parse_data_path(_as_items(fields.get("train_data_path") or fields["data_path"]))
    if weights is None and len(paths) > 1 or len(set(paths)) < len(paths):
        return None
    separate_one = bool(fields.get("train_data_path")) and len(paths) == 1     # (read as the path itself)
    return weights or [1.0], paths, weights is not None and not separate_one


def block_positions(data, state) -> tuple[list[dict], list[dict]]:
    """Per block of the phase's train dataset, the train state's data_offsets and data_index_sizes by this run's
    dataset prefixes as its flags spell them (as the data loaders key them)."""
    from megatron_zaya.data.loaders import dataset_prefixes
    prefixes = [] if data is None or data.mock_data else dataset_prefixes(data)
    real = {p: os.path.realpath(strip_suffix(p)) for p in prefixes}
    blocks = max([len(v) for v in (*state.data_offsets.values(), *state.data_index_sizes.values())], default=0)
    return tuple([{p: values[real[p]][k] for p in prefixes if k < len(values.get(real[p], []))}
                  for k in range(blocks)] for values in (state.data_offsets, state.data_index_sizes))


def plan_train_blocks(run, state, train_samples: int, datasets: dict) -> tuple[list[int], list[dict], list[dict]]:
    """(block sizes, per block where each dataset starts and the size its index was built for) of the phase's
    train dataset for a job that needs `train_samples` of it (train_data_position), resumed at `state`."""
    from megatron_zaya.data.train_blocks import train_blocks
    starts, kept = block_positions(run.data, state)
    blocks = train_blocks(run.data, run.model.seq_length, state.data_blocks, train_samples, datasets, starts, kept)
    return blocks, starts, kept


def record_index_sizes(data, state, seq_length: int, blocks: list[int], datasets: dict, starts: list[dict],
                       kept: list[dict]) -> None:
    """Keep, per dataset and block, the samples this job builds its index for (data/train_blocks.train_requests;
    `starts`, `kept`: block_positions'): a later data phase builds it alike where it can (gpt_dataset.kept_request),
    so that its order stays the one the offsets count in."""
    if data is None or data.mock_data or data.phases:
        return
    from megatron_zaya.data.train_blocks import train_requests
    for k, size in enumerate(blocks):
        start, keep = (given[k] if k < len(given) else None for given in (starts, kept))
        for prefix, request in train_requests(data, seq_length, size, datasets, start, keep).items():
            held = state.data_index_sizes.setdefault(os.path.realpath(strip_suffix(prefix)), [])
            held += [0] * (k + 1 - len(held))
            held[k] = request


def train_data_position(state, schedule, total_iters: int) -> tuple[int, int]:
    """(consumed samples within the current data phase, samples the phase's dataset needs): those
    already read in the phase plus those of the iterations left, at this run's batch sizes."""
    consumed_in_phase = state.consumed_samples - state.data_start_samples
    still_needed = schedule.samples_consumed(state.consumed_samples, total_iters - state.iteration)
    return consumed_in_phase, consumed_in_phase + still_needed
