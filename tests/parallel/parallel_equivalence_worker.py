"""Run under torchrun or mpirun: for each layout given on the command line, compare the parallel
model with an independent single-process run of the same model on the same global batch (fp32):
loss (1e-5 relative), every gradient gathered to full shape (1e-4 relative, per tensor norm),
global routing counts (exact), global grad norm, and the weights after a few optimizer steps
(AdamW; with "muon": single-process Muon + AdamW against DistributedMuon + ZeRO-1 AdamW or plain
Muon + AdamW, fp32 Newton-Schulz, same 1e-4 weight tolerance; under TP Muon gathers the split
matrices over the TP group, --muon-tp-mode duplicated, unless "blockwise" is given: then the
weights must DIFFER from single-process Muon, the control that shows the comparison can fail).

Layout syntax: tp2, cp2, ep2, dp (plain data parallel), sp (sequence parallel), zero (ZeRO-1),
kv1 (a model with one KV head, so TP > HKV replicates it), muon (Muon on the hidden matrices),
blockwise (with muon and TP: per-slice Newton-Schulz), docs (packed documents, --reset-attention-mask:
document_ids whose boundaries sit one before, at and one after the CP chunk edges), joined by '-', e.g.
"tp2-ep2", "cp2-zero", "cp2-docs" or "ep2-zero-muon". Prints one line per layout on rank 0; exits 1 on any mismatch.
"""
from __future__ import annotations

import os
import re
import sys
import time

import torch
import torch.distributed as dist

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel
from megatron_zaya.optim.balancing import BalancingBiasUpdater
from megatron_zaya.optim.builder import OptimizerConfig, muon_bucket_key, split_parameters
from megatron_zaya.optim.distributed import DistributedOptimizer
from megatron_zaya.optim.distributed_muon import DistributedMuon
from megatron_zaya.optim import muon as muon_module
from megatron_zaya.optim.muon import Muon, MuonScale
from megatron_zaya.parallel.apply import full_gradients, gather_full_state_dict, parallelize_model
from megatron_zaya.parallel.collectives import all_gather_single
from megatron_zaya.parallel.context import slice_batch_for_cp
from megatron_zaya.parallel.data import GradientReducer, clip_grad_norm, count_zero_grads
from megatron_zaya.parallel.launch import exit_process, init_distributed
from megatron_zaya.parallel.state import ParallelState

LOSS_RTOL, GRAD_RTOL, WEIGHT_RTOL = 1e-5, 1e-4, 1e-4
GLOBAL_BATCH, SEQ, STEPS, LR, CLIP = 4, 32, 3, 1e-3, 1.0
# Muon under TP gathers whole matrices in chunks: small ones here, so that a step runs several gathers
# (an expert weight, 262K elements, alone; the attention matrices together).
muon_module.TP_GATHER_ELEMENTS = 100_000


KV_HEADS = 2
CCA_KERNELS = (2, 2)


def config():
    return model_config_from_preset("zaya1-tiny", num_layers=2, vocab_size=256, seq_length=SEQ,
                                    num_query_groups=KV_HEADS, cca_depthwise_kernel=CCA_KERNELS[0],
                                    cca_grouped_kernel=CCA_KERNELS[1])


def build_model(seed=1234):
    torch.manual_seed(seed)
    model = ZayaModel(config())
    # Spread the routing over every expert and the skip class (identical on every rank).
    g = torch.Generator().manual_seed(7)
    for block in model.layers:
        block.moe.router.balancing_bias.copy_(torch.randn(5, generator=g) * 0.05)
    return model


# docs: each row's document starts (the first at 0): one before, at and one after the CP=2 chunk edges (8, 16,
# 24 with SEQ 32), so that a halo's lag visibility is cut at each offset from a chunk's first step.
DOC_STARTS = [(7, 23), (8, 24), (9, 25), (15, 17)]


def global_batch(step, docs=False):
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, 256, (GLOBAL_BATCH, SEQ + 1), generator=g)
    mask = (torch.rand(GLOBAL_BATCH, SEQ, generator=g) > 0.1).float()
    pos = torch.arange(SEQ).unsqueeze(0).expand(GLOBAL_BATCH, SEQ)
    batch = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": mask, "position_ids": pos}
    if docs:
        ids = torch.zeros(GLOBAL_BATCH, SEQ, dtype=torch.long)
        for row, starts in enumerate(DOC_STARTS):
            for start in starts:
                ids[row, start:] += 1
        batch["document_ids"] = ids
    return batch


def local_batch(batch, ps, micro):
    """This rank's micro-batches: samples split over DP ranks, then the CP slice."""
    per = GLOBAL_BATCH // ps.dp_size
    mine = {k: v[ps.dp_rank * per:(ps.dp_rank + 1) * per] for k, v in batch.items()}
    m = per // micro
    return [slice_batch_for_cp({k: v[i * m:(i + 1) * m] for k, v in mine.items()}, ps) for i in range(micro)]


def rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-12)) if b.numel() else 0.0


def reference_step(model, batch):
    out = model(batch["tokens"], labels=batch["labels"], position_ids=batch["position_ids"],
                document_ids=batch.get("document_ids"))
    loss = (out.token_losses * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
    loss.backward()
    return loss.detach(), [r.counts for r in out.routing]


def parallel_step(model, reducer, batch, ps, micro):
    count = batch["loss_mask"].sum()
    total = torch.zeros(())
    counts = None
    parts = local_batch(batch, ps, micro)
    for i, mb in enumerate(parts):
        sync = reducer.no_sync() if i < len(parts) - 1 else _null()
        with sync:
            out = model(mb["tokens"], labels=mb["labels"], position_ids=mb["position_ids"],
                        document_ids=mb.get("document_ids"))
            loss = (out.token_losses * mb["loss_mask"]).sum() / count
            loss.backward()
        total += loss.detach()
        c = torch.stack([r.counts for r in out.routing])
        counts = c if counts is None else counts + c
    # Overlap: every bucket that communicates was launched by the backward hooks, before finish().
    late = [i for i, b in enumerate(reducer.buckets) if b.size > 1 and b.work is None]
    reducer.finish()
    if late:
        raise AssertionError(f"buckets {late} were not launched during backward")
    dist.all_reduce(total, group=ps.dp_cp_group)
    return total, counts


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def shard_like(full, p, ps):
    for kind, dim, pieces in getattr(p, "partitions", []):
        rank = ps.tp_rank if kind == "tp" else ps.ep_rank
        parts = [full.narrow(dim, a, b - a) for a, b in pieces[rank]]
        full = torch.cat(parts, dim=dim) if parts else full.narrow(dim, 0, 0)
    return full


# Not the default (spectral x 0.2): a layout whose Muon ignored --muon-scale-mode would not match.
MUON_SCALE = MuonScale("unit_rms_norm", 0.5)


def adamw(params):
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.1)


def build_optimizers(model, ps, reducer, zero: bool, muon: bool, blockwise: bool = False) -> list:
    """[Muon (or DistributedMuon), AdamW (or ZeRO-1 AdamW)], in the order the trainer steps them.
    Under TP, Muon gathers split matrices over the TP group unless `blockwise`."""
    matrices, decay, no_decay = split_parameters(model, muon)
    rest = [p for _, p in decay + no_decay] if muon else list(model.parameters())
    opts = []
    if matrices:
        matrices = [p for _, p in matrices]
        tp_group = ps.tp_group if ps is not None and ps.tp_size > 1 and not blockwise else None
        opts.append(DistributedMuon(matrices, reducer, lr=LR, weight_decay=0.1, ns_dtype=torch.float32,
                                    tp_group=tp_group, scale=MUON_SCALE) if zero
                    else Muon(matrices, lr=LR, weight_decay=0.1, ns_dtype=torch.float32, tp_group=tp_group,
                              scale=MUON_SCALE))
    opts.append(DistributedOptimizer(rest, adamw, ps, reducer=reducer) if zero else adamw(rest))
    return opts


def balancer(model):
    """The trainer's bias update (loop.py) at its default lr (--moe-router-bias-lr 1e-2)."""
    return BalancingBiasUpdater([block.moe.router.balancing_bias for block in model.layers], lr=1e-2)


def check_biases(model, ref, step) -> list[str]:
    """Every replica holds the single-process balancing biases, bit for bit."""
    mine = torch.cat([b.moe.router.balancing_bias.reshape(-1) for b in model.layers])
    want = torch.cat([b.moe.router.balancing_bias.reshape(-1) for b in ref.layers])
    every = torch.empty(dist.get_world_size() * mine.numel(), dtype=mine.dtype)
    all_gather_single(every, mine)
    errors = [] if torch.equal(mine, want) else [f"step {step}: balancing biases {mine.tolist()} != {want.tolist()}"]
    if not all(torch.equal(r, mine) for r in every.view(-1, mine.numel())):
        errors.append(f"step {step}: balancing biases differ between ranks")
    return errors


def check_memory(opt) -> tuple[str, list[str]]:
    """ZeRO-1's saved fraction: 1 - 1/N over each gradient group of size N (DP x CP for dense
    parameters, expert-DP for experts), to within the bucket padding (< N elements per bucket), when
    AdamW holds every parameter; DistributedMuon owns whole matrices, so its share exceeds 1/N by at
    most the largest one."""
    r = opt.memory_report()
    total = r["params_total"]
    if isinstance(opt, DistributedMuon):
        by_group = {}
        for p, (bucket, _, _) in opt.owner.items():
            n, biggest = by_group.get(id(bucket.group), (0, 0))
            by_group[id(bucket.group)] = (n + p.numel() / bucket.size, max(biggest, p.numel()))
        worst = 1 - sum(n + m for n, m in by_group.values()) / total
        ok = r["saved_fraction"] >= worst - 1e-9
        return f"Muon saves {r['saved_fraction']:.3f}", [] if ok else [f"Muon saved {r['saved_fraction']:.3f} < {worst:.3f}"]
    # The bytes it reports: the inner optimizer's state of the owned pieces, counted here (fp32 weights: their
    # masters are the weights themselves, no extra bytes)
    state = opt.inner.state.values() if opt.inner is not None else []
    held = sum(t.numel() * t.element_size() for s in state for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
    errors = [] if r["sharded_bytes"] == held else [f"ZeRO-1 reports {r['sharded_bytes']} bytes, holds {held}"]
    mine = set(opt.params)
    if any(p not in mine for b in opt.reducer.buckets for p in b.params):   # Muon's matrices share the buckets
        return f"saves {r['saved_fraction']:.4f}", errors   # (the 1/N split is of whole buckets, not of AdamW's part)
    share = slack = 0.0
    for bucket in opt.reducer.buckets:
        share += sum(p.numel() for p in bucket.params) / bucket.size
        slack += bucket.size
    want = 1 - share / total
    ok = abs(r["saved_fraction"] - want) <= slack / total + 1e-9
    line = f"saves {r['saved_fraction']:.4f} (1 - 1/N per group: {want:.4f})"
    if not ok:
        errors.append(f"ZeRO-1 saved fraction {r['saved_fraction']:.4f} != {want:.4f} +- {slack / total:.1e}")
    return line, errors


def run_layout(spec: str, world: int) -> list[str]:
    sizes = {k: int(v) for k, v in re.findall(r"(tp|cp|ep)(\d+)", spec)}
    global KV_HEADS, CCA_KERNELS
    flags = spec.split("-")
    gather = re.search(r"gather(\d+)", spec)     # gatherN: Muon's TP gather chunks of N elements
    muon_module.TP_GATHER_ELEMENTS = int(gather.group(1)) if gather else 100_000
    KV_HEADS = 1 if "kv1" in flags else 2      # kv1: one KV head, replicated over TP ranks
    CCA_KERNELS = (1, 1) if "k11" in flags else (2, 2)   # k11: no convolution reads back; the CP halo's one
                                                          # step is the value shift's
    zero, muon, blockwise = "zero" in flags, "muon" in flags, "blockwise" in flags
    if blockwise and not (muon and sizes.get("tp", 1) > 1):
        raise ValueError(f"{spec}: blockwise is the control for Muon under TP (give muon and tp)")
    ps = ParallelState(sizes.get("tp", 1), sizes.get("cp", 1), sizes.get("ep", 1), world,
                       sequence_parallel="sp" in flags, model_config=config())
    micro = 2 if GLOBAL_BATCH // ps.dp_size >= 2 else 1
    errors, worst = [], {"loss": 0.0, "grad": 0.0, "weight": 0.0, "norm": 0.0, "zeros": 0}

    ref = build_model()
    ref_opts = build_optimizers(ref, None, None, zero=False, muon=muon)
    model = parallelize_model(build_model(), ps)
    # ZeRO-1 with Muon buckets the Muon matrices apart (as distributed_runtime does); mixed-kept:
    # the same layout with mixed buckets, which must train the same.
    key = muon_bucket_key(model, OptimizerConfig(optimizer="muon")) if zero and muon and "mixed" not in flags else None
    reducer = GradientReducer(model, ps, bucket_size=30_000, shard=zero, bucket_key=key)
    opts = build_optimizers(model, ps, reducer, zero, muon, blockwise)
    ref_balancer, model_balancer = balancer(ref), balancer(model)

    for step in range(STEPS):
        batch = global_batch(step, docs="docs" in flags)
        ref_loss, ref_counts = reference_step(ref, batch)
        loss, counts = parallel_step(model, reducer, batch, ps, micro)
        worst["loss"] = max(worst["loss"], abs(float(loss / ref_loss) - 1))
        if not torch.equal(counts, torch.stack(ref_counts)):
            errors.append(f"step {step}: routing counts {counts.tolist()} != {torch.stack(ref_counts).tolist()}")
        ref_grads = {n: p.grad for n, p in ref.named_parameters()}
        if zero:   # each rank holds only the pieces it owns: compare those
            for n, p in model.named_parameters():
                if getattr(p, "main_grad_shard", None) is not None:
                    start, g = p.main_grad_shard
                    want = shard_like(ref_grads[n], p, ps).reshape(-1)[start:start + g.numel()]
                    worst["grad"] = max(worst["grad"], r := rel(g, want))
                    if r > GRAD_RTOL:
                        errors.append(f"step {step}: grad {n} rel {r:.2e}")
        else:
            for n, g in full_gradients(model, ps).items():
                worst["grad"] = max(worst["grad"], r := rel(g, ref_grads[n]))
                if r > GRAD_RTOL:
                    errors.append(f"step {step}: grad {n} rel {r:.2e}")
        ref_zeros = sum(int((p.grad == 0).sum()) for p in ref.parameters() if p.grad is not None)
        # Elements that cancel to within rounding (|g| <= 1e-6 of the tensor's largest) may come out exactly
        # zero in one summation order and not the other; the structural zeros (unseen vocab rows, idle
        # experts) must match.
        near_zero = sum(int(((p.grad != 0) & (p.grad.abs() <= 1e-6 * p.grad.abs().max())).sum())
                        for p in ref.parameters() if p.grad is not None)
        zeros = count_zero_grads(model.parameters(), ps, torch.device("cpu"))
        worst["zeros"] = max(worst["zeros"], ref_zeros)
        if abs(zeros - ref_zeros) > near_zero:
            errors.append(f"step {step}: {zeros} zero gradient elements, single process {ref_zeros} "
                          f"(and {near_zero} within rounding of zero)")
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)
        norm = clip_grad_norm(model.parameters(), CLIP, ps)
        worst["norm"] = max(worst["norm"], abs(float(norm / ref_norm) - 1))
        for opt in ref_opts:
            opt.step()
            opt.zero_grad()
        for opt in opts:
            opt.step()
            opt.zero_grad()
        reducer.zero_grad()
        ref_balancer.update(torch.stack(ref_counts))   # after the step, on the GLOBAL counts (loop.py)
        model_balancer.update(counts)
        errors += check_biases(model, ref, step)
    ref_state = ref.state_dict()
    for n, p in model.named_parameters():     # every rank's own shard (replicas included)
        r = rel(p.detach(), shard_like(ref_state[n], p, ps))
        if r > WEIGHT_RTOL:
            errors.append(f"local shard of {n} rel {r:.2e}")
    full = gather_full_state_dict(model, ps)
    for n, w in ref.state_dict().items():
        worst["weight"] = max(worst["weight"], r := rel(full[n], w))
        if r > WEIGHT_RTOL or full[n].shape != w.shape:
            errors.append(f"weight {n} rel {r:.2e} shapes {tuple(full[n].shape)} {tuple(w.shape)}")
    if worst["loss"] > LOSS_RTOL:
        errors.append(f"loss rel {worst['loss']:.2e}")
    if worst["norm"] > LOSS_RTOL * 10:
        errors.append(f"grad norm rel {worst['norm']:.2e}")
    if worst["zeros"] == 0 and "k11" not in flags:     # (k11's routing leaves no expert unused: the others check)
        errors.append("no gradient element was zero in any step: the zero-count comparison cannot fail")
    report = f"{spec}: {ps.describe()}; max rel loss {worst['loss']:.1e} grad {worst['grad']:.1e} " \
             f"norm {worst['norm']:.1e} zeros up to {worst['zeros']} weights after {STEPS} steps {worst['weight']:.1e}"
    if muon:
        report += "; Muon on the hidden matrices"
    if blockwise:   # the control: per-slice Newton-Schulz must NOT reproduce single-process Muon
        differs = [e for e in errors if e.startswith(("weight ", "local shard "))]
        if not differs:
            return [report, "blockwise Muon matched single-process Muon: the weight comparison cannot fail"]
        report += f"; blockwise differs as expected ({len(differs)} weight mismatches, max rel {worst['weight']:.1e})"
        errors = [e for e in errors if e.startswith("step 0:")]   # before the first update all must agree
    if zero and muon:    # buckets of Muon matrices only are gathered by DistributedMuon, not by AdamW
        adam = set(opts[-1].params)
        muon_only = [b for b in reducer.buckets if not any(p in adam for p in b.params)]
        gathered = opts[-1].gathered_buckets
        if not muon_only or any(b in gathered for b in muon_only) or len(gathered) + len(muon_only) != len(reducer.buckets):
            errors.append(f"ZeRO-1 gathers {len(gathered)} of {len(reducer.buckets)} buckets, "
                          f"{len(muon_only)} hold only Muon matrices")
        regathered = sum(p.numel() for b in gathered for p in b.params if p not in adam)
        if key is not None and regathered:
            errors.append(f"ZeRO-1 all-gathers {regathered} elements of Muon matrices in mixed buckets")
        if key is None and not regathered:
            errors.append("mixed buckets hold no Muon matrix: the mixed layout checks nothing")
        report += (f"; {len(muon_only)} Muon-only buckets not all-gathered, {regathered} Muon elements "
                   f"all-gathered in mixed buckets")
    if zero:
        report += "; " + opts[-1].describe_memory()
        for opt in opts:
            line, errs = check_memory(opt)
            report, errors = report + "; " + line, errors + errs
    report += "; balancing biases identical"
    reducer.remove_hooks()
    return [report] + errors


def main():
    if os.environ.get("PZ_DEBUG_TIMEOUT"):
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ["PZ_DEBUG_TIMEOUT"]), exit=True)
    env = init_distributed()
    torch.set_num_threads(1)
    failed = False
    for spec in sys.argv[1:]:
        t0 = time.time()
        lines = run_layout(spec, env.world_size)
        gathered = [None] * env.world_size
        dist.all_gather_object(gathered, lines[1:])
        if env.rank == 0:
            print(f"[{env.launcher} x{env.world_size}] {lines[0]} ({time.time() - t0:.1f}s)", flush=True)
            for r, errs in enumerate(gathered):
                for e in errs[:8]:
                    print(f"  FAIL rank {r}: {e}", flush=True)
        failed |= any(gathered)
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
    exit_process(0)
