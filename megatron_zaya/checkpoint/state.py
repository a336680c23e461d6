"""What a rank saves and how a rank of ANY layout takes its part back.

Model: every parameter and buffer, as the rank holds it (TP / EP slices recorded by the parallel
package on `param.partitions`), written by one replica only (tp_rank 0 for tensors TP does not
split; in its data-parallel x context-parallel group for dense, expert-data-parallel group for expert
tensors, each tensor, or each row share of a large one, by its owner: replica_owners.py, which spreads the
bytes over the group).
Optimizer: per parameter name and state key (`optim/<param>/<key>`), so Muon / AdamW state moves
with its parameter under any layout; ZeRO-1 pieces (flat element ranges of the local parameter)
and their fp32 masters carry their flat range.
RNG: per rank (CPU, CUDA, Python, NumPy), restored on the same rank when the layout allows.
Balancing biases are model buffers; their Adam state (BalancingBiasUpdater) is replicated.
"""
from __future__ import annotations

import random

import numpy as np
import torch

from megatron_zaya.checkpoint.blocks import index_runs, narrow_ranges
from megatron_zaya.checkpoint.format import CheckpointError, CheckpointFolder, Entry
from megatron_zaya.checkpoint.replica_owners import SharedReads, assign_owners, rows_of, select_rows


def unwrap(model):
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def model_pstate(model):
    return getattr(unwrap(model), "pstate", None)


def _partition_rank(pstate, kind: str) -> int:
    if kind == "tp":
        return pstate.tp_rank
    if kind == "ep":
        return pstate.ep_rank
    raise CheckpointError(f"unknown partition kind {kind!r} on a parameter")


def tensor_slicing(t: torch.Tensor, pstate) -> tuple[list[int], list]:
    """(global shape, per-dim runs of global indices) of the local tensor `t` (cached on the tensor)."""
    cached = getattr(t, "_checkpoint_slicing", None)
    if cached is not None and cached[0] == (id(pstate), tuple(t.shape)):
        return cached[1]
    result = _tensor_slicing(t, pstate)
    try:
        t._checkpoint_slicing = ((id(pstate), tuple(t.shape)), result)
    except (AttributeError, RuntimeError):
        pass
    return result


def _tensor_slicing(t: torch.Tensor, pstate) -> tuple[list[int], list]:
    parts = getattr(t, "partitions", []) or []
    shape = list(t.shape)
    for _kind, dim, pieces in reversed(parts):
        shape[dim] = max((b for rank_pieces in pieces for _a, b in rank_pieces), default=0)
    index = [torch.arange(n) for n in shape]
    for kind, dim, pieces in parts:
        mine = pieces[_partition_rank(pstate, kind)]
        index[dim] = torch.cat([index[dim][a:b] for a, b in mine]) if mine else index[dim][:0]
    return shape, [index_runs(i) for i in index]


def is_tp_split(t) -> bool:
    return any(kind == "tp" for kind, _d, _p in (getattr(t, "partitions", []) or []))


def is_expert(t) -> bool:
    return bool(getattr(t, "is_expert", False))


def replica_owners(model) -> dict[str, list | None]:
    """Each model tensor's row shares and their owners in its replica group (replica_owners.assign_owners),
    by name."""
    return assign_owners(named_tensors(model), model_pstate(model), is_expert)


def rows_written(t, pstate, shares) -> list:
    """The rows of tensor `t` this rank writes (replica_owners.rows_of; [] none): one replica of every
    distinct slice is written, by tp_rank 0 for tensors TP does not split, split in row shares among the
    ranks of its replica group."""
    if pstate is None:
        return [None]
    if not is_tp_split(t) and pstate.tp_rank != 0:
        return []
    return rows_of(shares, pstate.rank)


def named_tensors(model) -> dict[str, torch.Tensor]:
    """state_dict names -> the live parameter / buffer objects (with their partition markers)."""
    model = unwrap(model)
    return dict(model.state_dict(keep_vars=True))


# -- model ---------------------------------------------------------------------------------------------
def model_entries(model) -> list[Entry]:
    pstate = model_pstate(model)
    owners = replica_owners(model)
    out = []
    for name, t in named_tensors(model).items():
        for rows in rows_written(t, pstate, owners[name]):
            shape, ranges = tensor_slicing(t, pstate)
            out.append(Entry("model/" + name, select_rows(t.detach(), rows), shape, narrow_ranges(ranges, rows)))
    return out


def fp32_source(folder: CheckpointFolder, name: str) -> str:
    """The checkpoint key of weight `name`'s fp32 values: the fp32 master a --bf16 ZeRO-1 run saved beside its
    bf16 weight, where there is one, else the weight itself (fp32 when saved without ZeRO-1 or by an fp32 run)."""
    master = f"optim/{name}/master"
    if folder.has(master) and folder.global_shape(master) == folder.global_shape("model/" + name):
        return master
    return "model/" + name


def source_of_weight(folder: CheckpointFolder, name: str, t: torch.Tensor) -> str:
    """The checkpoint key a tensor is read from: an fp32 one from its fp32 source (on every rank, not only on
    the owner of the master's shard: the replicas must start equal), a bf16 one from the weight."""
    return fp32_source(folder, name) if t.dtype == torch.float32 else "model/" + name


@torch.no_grad()
def load_model(model, folder: CheckpointFolder) -> list[str]:
    """Copy every parameter / buffer from the checkpoint into this rank's slice; one that other ranks hold
    alike (data- and context-parallel replicas) is read by its owner and broadcast (replica_owners).
    Returns messages about checkpoint tensors this model lacks; tensors missing from the checkpoint, or of
    another shape, are an error (raised on every rank before any read)."""
    pstate = model_pstate(model)
    tensors = named_tensors(model)
    missing = [name for name in tensors if not folder.has("model/" + name)]
    if missing:
        raise CheckpointError(f"{folder.folder}: tensors missing from the checkpoint: {missing[:8]}"
                              + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
    ranges = {}
    for name, t in tensors.items():
        shape, ranges[name] = tensor_slicing(t, pstate)
        if folder.global_shape("model/" + name) != shape:
            raise CheckpointError(f"{folder.folder}: {name} has shape {folder.global_shape('model/' + name)} in the "
                                  f"checkpoint, {shape} in this model (different model config?)")
    owners = replica_owners(model)
    reads, cache = SharedReads(folder, pstate), {}
    for name, t in tensors.items():
        reads.into(t, source_of_weight(folder, name, t), ranges[name], cache, owners[name])
    reads.finish(next(iter(tensors.values())).device)
    extra = sorted(k[len("model/"):] for k in folder.keys("model/"))
    unknown = [k for k in extra if k not in tensors]
    return [f"checkpoint tensors not in this model (ignored): {unknown[:8]}"] if unknown else []


# -- optimizer -----------------------------------------------------------------------------------------
def optimizer_family(cls_name: str) -> str:
    """Optimizers whose per-parameter state is interchangeable share a family name: a checkpoint of
    Muon loads into DistributedMuon (ZeRO-1) and back, AdamW into apex FusedAdam, and so on."""
    name = cls_name.removeprefix("Distributed")
    return {"FusedAdam": "AdamW", "Adam": "AdamW"}.get(name, name)


class Slot:
    """One optimizer holding per-parameter state, and for each of its parameters the model parameter
    it updates: items = [(model param name, model param, flat range or None, master or None, state key)].
    kind: "torch" (a torch.optim.Optimizer), "zero" (DistributedOptimizer: the torch optimizer `inner`
    over flat fp32 master pieces) or "owner" (DistributedMuon: whole matrices on their owner rank)."""

    def __init__(self, tag: str, kind: str, container, items, family: str, distributed=None):
        self.tag, self.kind, self.container, self.items = tag, kind, container, items
        self.family, self.distributed = family, distributed

    @property
    def param_groups(self):
        return self.container.param_groups if self.container is not None else []


def optimizer_slots(optimizer, model, tag: str = "") -> list[Slot]:
    names = {id(p): n for n, p in unwrap(model).named_parameters()}

    def name_of(p):
        if id(p) not in names:
            raise CheckpointError(f"optimizer {tag or type(optimizer).__name__} holds a tensor that is not a model "
                                  f"parameter (shape {tuple(p.shape)}): cannot checkpoint it by name")
        return names[id(p)]

    if hasattr(optimizer, "optimizers") and isinstance(optimizer.optimizers, dict):     # OptimizerSet
        return [s for key, opt in optimizer.optimizers.items()
                for s in optimizer_slots(opt, model, f"{tag}.{key}" if tag else key)]
    if hasattr(optimizer, "pieces") and hasattr(optimizer, "inner"):                    # ZeRO-1 AdamW
        by_master = {id(m): (p, a, b, m) for p, a, b, m in optimizer.pieces}
        items = []
        if optimizer.inner is not None:
            for group in optimizer.inner.param_groups:
                for m in group["params"]:
                    p, a, b, _ = by_master[id(m)]
                    items.append((name_of(p), p, [a, b], m, m))
        family = optimizer_family(type(optimizer.inner).__name__) if optimizer.inner is not None else "AdamW"
        return [Slot(tag or "zero1", "zero", optimizer.inner, items, family, distributed=optimizer)]
    if hasattr(optimizer, "owner") and hasattr(optimizer, "state") and not isinstance(optimizer, torch.optim.Optimizer):
        items = [(name_of(p), p, None, None, p) for p, (bucket, _i, owner) in optimizer.owner.items()
                 if owner == bucket.rank]                                             # ZeRO-1 Muon
        return [Slot(tag or type(optimizer).__name__, "owner", optimizer, items,
                     optimizer_family(type(optimizer).__name__))]
    if isinstance(optimizer, torch.optim.Optimizer):
        items = [(name_of(p), p, None, None, p) for g in optimizer.param_groups for p in g["params"]]
        return [Slot(tag or type(optimizer).__name__, "torch", optimizer, items,
                     optimizer_family(type(optimizer).__name__))]
    raise CheckpointError(f"do not know how to checkpoint an optimizer of type {type(optimizer).__name__}")


def _json_value(v):
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if torch.is_tensor(v) and v.dim() == 0:     # e.g. a step count kept as a tensor
        return v.item()
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    return str(v)


def optimizer_entries(optimizer, model) -> tuple[list[Entry], dict]:
    pstate = model_pstate(model)
    owners = replica_owners(model)
    entries, classes, groups = [], {}, {}
    for slot in optimizer_slots(optimizer, model):
        groups[slot.tag] = [{k: _json_value(v) for k, v in g.items() if k != "params"} for g in slot.param_groups]
        for name, p, flat, master, key_obj in slot.items:
            classes[name] = slot.family
            if flat is None and slot.kind != "owner":      # replicated with its parameter: its row shares
                row_runs = rows_written(p, pstate, owners[name])
                writes_scalars = bool(row_runs) and (owners[name] is None or owners[name][0].owner == pstate.rank)
            else:      # ZeRO-1: every piece / owned matrix is on one rank of its group; TP copies once,
                # except sequence-parallel parameters, whose group is the whole world (TP included)
                writer = (pstate is None or is_tp_split(p) or pstate.tp_rank == 0
                          or getattr(p, "sequence_parallel", False))
                row_runs = [None] if writer else []
                writes_scalars = writer and (flat is None or flat[0] == 0)
            if not row_runs:
                continue
            shape, ranges = tensor_slicing(p, pstate)
            state = dict(slot.container.state.get(key_obj, {}))
            if master is not None and p.dtype != torch.float32:   # an fp32 weight is its master: saved once
                state["master"] = master
            for key, value in state.items():
                if not torch.is_tensor(value):
                    if isinstance(value, (int, float)):
                        value = torch.tensor(float(value), dtype=torch.float64)
                    else:
                        raise CheckpointError(f"optimizer state {name}/{key} of type {type(value).__name__} "
                                              f"cannot be checkpointed")
                k = f"optim/{name}/{key}"
                if value.dim() == 0:
                    if writes_scalars:
                        entries.append(Entry(k, value.detach(), [], []))
                elif flat is None and tuple(value.shape) == tuple(p.shape):
                    entries.extend(Entry(k, select_rows(value.detach(), rows), shape, narrow_ranges(ranges, rows))
                                   for rows in row_runs)
                elif flat is not None and value.numel() == flat[1] - flat[0]:
                    entries.append(Entry(k, value.detach().reshape(-1), shape, ranges, flat=list(flat)))
                else:
                    raise CheckpointError(f"optimizer state {name}/{key} has shape {tuple(value.shape)} for a "
                                          f"parameter of shape {tuple(p.shape)}: cannot describe its slicing")
    return entries, {"classes": classes, "param_groups": groups}


@torch.no_grad()
def saved_param_groups(folder: CheckpointFolder) -> dict[str, list[dict]]:
    """Each optimizer's param groups as saved (JSON), from the first rank that has them."""
    out: dict[str, list[dict]] = {}
    for rf in folder.ranks:
        for tag, groups in rf.meta["objects"].get("optimizer", {}).get("param_groups", {}).items():
            if groups and tag not in out:
                out[tag] = groups
    return out


def restore_group_steps(groups: list[dict], saved: list[dict]) -> None:
    """Copy the saved step counts into `groups` (a state_dict's param_groups). Optimizers that count
    steps per group rather than per parameter (apex FusedAdam) need it for Adam's bias correction;
    the hyperparameters stay this run's."""
    if len(saved) != len(groups):
        return
    for group, old in zip(groups, saved):
        if isinstance(old.get("step"), (int, float)):
            step = int(old["step"])
            group["step"] = torch.tensor(float(step)) if torch.is_tensor(group.get("step")) else step


def load_optimizer(optimizer, model, folder: CheckpointFolder, saved_classes: dict) -> None:
    """Load every optimizer's state from `folder` for this rank's parameters (any saved layout). State that
    data-parallel replicas hold alike (a plain torch optimizer, no ZeRO-1) is read by its parameter's owner
    and broadcast (replica_owners.SharedReads); ZeRO-1 pieces are this rank's own."""
    pstate = model_pstate(model)
    saved_groups = saved_param_groups(folder)
    owners = replica_owners(model)
    reads, cache = SharedReads(folder, pstate), {}
    scalars = reads.whole_tensors(lambda key, entry: key.startswith("optim/") and entry["shape"] == [])
    state_keys: dict[str, list[str]] = {}
    for key in folder.keys("optim/"):
        name, _, sk = key[len("optim/"):].rpartition("/")
        state_keys.setdefault(name, []).append(sk)
    for slot in optimizer_slots(optimizer, model):
        new_state, masters = {}, {}
        for index, (name, p, flat, master, key_obj) in enumerate(slot.items):
            shape, ranges = tensor_slicing(p, pstate)
            saved = saved_classes.get(name)
            if saved is not None and optimizer_family(saved) != slot.family:
                raise CheckpointError(f"{folder.folder}: optimizer state of {name} was saved by {saved}, this run "
                                      f"uses {slot.family} for it; pass --no-load-optim (or --finetune) to start "
                                      f"the optimizer afresh")
            entry = {}
            for sk in state_keys.get(name, []):
                # ZeRO-1 AdamW pieces: below; an fp32 weight is its own master, which load_model read into it
                if sk == "master" and (master is not None or p.dtype == torch.float32):
                    continue
                key = f"optim/{name}/{sk}"
                if folder.global_shape(key) == []:       # read once across the ranks (a failed read: finish raises)
                    entry[sk] = scalars[key].clone() if key in scalars else torch.zeros(())
                    continue
                if folder.global_shape(key) != shape:
                    raise CheckpointError(f"{folder.folder}: optimizer state {name}/{sk} has shape "
                                          f"{folder.global_shape(key)}, the parameter {shape}")
                if flat is None and slot.kind == "torch":       # replicated with its parameter
                    entry[sk] = reads.new(key, ranges, cache, owners[name], p.device)
                else:
                    entry[sk] = folder.piece(key, ranges, flat, cache)
            # A bf16 weight's fp32 master (ZeRO-1): the saved one, else the checkpoint's weight (fp32 when saved
            # without ZeRO-1 or by an fp32 run), not this run's bf16 rounding of it. An fp32 weight is its own
            # master (load_model read the saved master into it).
            saved_master = entry.pop("master", None)
            if slot.kind == "owner" and p.dtype != torch.float32:         # DistributedMuon: on the matrix's owner
                entry["master"] = saved_master if saved_master is not None else folder.piece(
                    fp32_source(folder, name), ranges, None, cache).float()
            if master is not None:
                masters[id(master)] = (p.detach().reshape(-1)[flat[0]:flat[1]].float().cpu().clone()
                                       if p.dtype == torch.float32 else
                                       folder.piece(fp32_source(folder, name), ranges, flat, cache).float())
            if entry:
                new_state[index] = (key_obj, entry)
        if slot.kind == "owner":
            slot.container.state = {k: {sk: v.to(k.device, torch.float32) if v.is_floating_point() else v.to(k.device)
                                        for sk, v in e.items()} for k, e in new_state.values()}
            continue
        template = slot.container.state_dict() if slot.container is not None else None
        if template is not None:
            template["state"] = {index: e for index, (_k, e) in new_state.items()}
            restore_group_steps(template["param_groups"], saved_groups.get(slot.tag, []))
        if slot.kind == "zero":   # masters in the optimizer's piece order (bucket order, not group order)
            ordered = [masters[id(m)] for *_, m in slot.distributed.pieces]
            slot.distributed.load_state_dict({"inner": template, "master": ordered})
        elif slot.container is not None:
            slot.container.load_state_dict(template)
    reads.finish(next(iter(named_tensors(model).values())).device)


def load_saved_masters(optimizer, model, folder: CheckpointFolder) -> None:
    """For a load that starts the optimizer afresh (--finetune, --no-load-optim), after load_model: the fp32
    values of this run's bf16 weights (the masters a --bf16 ZeRO-1 run saved, else the checkpoint's weights,
    fp32 unless saved in bf16), so that this run starts from the trained values, as load_optimizer and
    load_full_model_state do, not from their bf16 rounding. A bf16 weight's ZeRO-1 master piece (or,
    DistributedMuon, its owner's master, with fresh momentum) takes them."""
    pstate = model_pstate(model)
    cache = {}
    for slot in optimizer_slots(optimizer, model):
        for name, p, flat, master, _key in slot.items:
            key = fp32_source(folder, name)
            if p.dtype == torch.float32 or (master is None and slot.kind != "owner"):   # its own master
                continue
            shape, ranges = tensor_slicing(p, pstate)
            if folder.global_shape(key) != shape:
                raise CheckpointError(f"{folder.folder}: {key} has shape {folder.global_shape(key)}, the parameter "
                                      f"{shape}")
            with torch.no_grad():
                if master is not None:
                    master.copy_(folder.piece(key, ranges, flat, cache).to(master.device).view_as(master))
                elif slot.kind == "owner":
                    slot.container.state[p] = {"momentum_buffer": torch.zeros_like(p, dtype=torch.float32),
                                               "master": folder.piece(key, ranges, None, cache).to(p.device).float()}


# -- RNG -------------------------------------------------------------------------------------------------
def rng_entries_and_objects() -> tuple[list[Entry], dict]:
    entries = [Entry("rng/torch_cpu", torch.get_rng_state(), [], [], local=True)]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        entries.append(Entry("rng/torch_cuda", torch.cuda.get_rng_state(), [], [], local=True))
    for e in entries:
        e.shape, e.ranges = list(e.tensor.shape), [[[0, n]] for n in e.tensor.shape]
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state()
    entries.append(Entry("rng/numpy_keys", torch.from_numpy(np_state[1].astype(np.int64)), [len(np_state[1])],
                         [[[0, len(np_state[1])]]], local=True))
    objects = {"python": [version, list(internal), gauss],
               "numpy": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])]}
    return entries, objects


def load_rng(folder: CheckpointFolder, rank: int) -> bool:
    if rank >= len(folder.ranks):
        return False
    rf = folder.ranks[rank]
    objects = rf.meta["objects"].get("rng")
    if not objects or "rng/torch_cpu" not in rf.meta["entries"]:
        return False
    torch.set_rng_state(rf.get("rng/torch_cpu"))
    if "rng/torch_cuda" in rf.meta["entries"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(rf.get("rng/torch_cuda"))
    version, internal, gauss = objects["python"]
    random.setstate((version, tuple(internal), gauss))
    name, pos, has_gauss, cached = objects["numpy"]
    np.random.set_state((name, rf.get("rng/numpy_keys").numpy().astype(np.uint32), pos, has_gauss, cached))
    return True


# -- balancing-bias optimizer ----------------------------------------------------------------------------
def balancer_entries(balancer, rank: int) -> tuple[list[Entry], dict]:
    if balancer is None or rank != 0:
        return [], {}
    state = balancer.state_dict()
    entries = []
    for key in ("exp_avg", "exp_avg_sq"):
        t = state[key]
        entries.append(Entry("balancer/" + key, t, list(t.shape), [[[0, n]] for n in t.shape]))
    return entries, {"steps": int(state["steps"])}


def load_balancer(balancer, folder: CheckpointFolder, model) -> bool:
    """The balancing-bias optimizer's state (rank 0 saved it; host tensors): read by the rank whose share of
    the files holds it, and exchanged (SharedReads.whole_tensors) among `model`'s ranks."""
    if balancer is None or not folder.has("balancer/exp_avg"):
        return False
    steps = folder.ranks[0].meta["objects"].get("balancer", {}).get("steps", 0)
    reads = SharedReads(folder, model_pstate(model))
    state = reads.whole_tensors(lambda key, _entry: key.startswith("balancer/"))
    reads.finish(next(iter(named_tensors(model).values())).device)    # the collectives' device (NCCL: a GPU)
    exp_avg, exp_avg_sq = state["balancer/exp_avg"], state["balancer/exp_avg_sq"]
    if tuple(exp_avg.shape) != tuple(balancer.exp_avg.shape):
        if exp_avg.shape[0] == balancer.exp_avg.shape[0]:    # the skip class balanced in one run, not the other
            return False
        raise CheckpointError(f"{folder.folder}: balancing-bias optimizer state has shape {tuple(exp_avg.shape)}, "
                              f"this model {tuple(balancer.exp_avg.shape)}")
    balancer.load_state_dict({"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "steps": steps})
    return True
