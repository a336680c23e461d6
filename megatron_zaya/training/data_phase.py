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

The global batch size is not part of the signature: the samples are the same whatever their
grouping, so a run that only changes --global-batch-size keeps reading where it stopped (its
dataset is sized for the samples already consumed plus those of the iterations left at the new
batch size). Checkpoints written when the signature held it are compared without it.
Megatron-LM has no flag for this, so there is none here either.
"""
from __future__ import annotations

import json
import os

from megatron_zaya.data.blend import is_number, parse_data_path
from megatron_zaya.data.index_builders import parse_split
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


def enter_data_phase(state, signature: str) -> str | None:
    """Start a new data phase on `state` when the loaded signature differs; the log line, or None."""
    if not signature:            # no data pipeline: no data position to keep
        return None
    previous, state.data_signature = state.data_signature, signature
    if not previous or not data_changed(previous, signature):
        return None
    state.data_start_iteration, state.data_start_samples = state.iteration, state.consumed_samples
    state.data_blocks = []
    old = _signature_fields(previous)
    changed = sorted(k for k, v in _signature_fields(signature).items() if old.get(k) != v)
    return (f"data changed since the checkpoint ({', '.join(changed)}): a new data phase starts at iteration "
            f"{state.iteration} (consumed samples {state.consumed_samples}) from sample 0 of its own dataset")


def train_data_position(state, schedule, total_iters: int) -> tuple[int, int]:
    """(consumed samples within the current data phase, samples the phase's dataset needs): those
    already read in the phase plus those of the iterations left, at this run's batch sizes."""
    consumed_in_phase = state.consumed_samples - state.data_start_samples
    still_needed = schedule.samples_consumed(state.consumed_samples, total_iters - state.iteration)
    return consumed_in_phase, consumed_in_phase + still_needed
