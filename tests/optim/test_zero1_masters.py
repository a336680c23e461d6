"""ZeRO-1 on one rank (no process group: the sharded code paths with a group of one) against plain
optimizers: DistributedMuon's fp32 masters of bf16 weights, and the memory report's byte count."""
import torch

from megatron_zaya.optim.distributed import DistributedOptimizer
from megatron_zaya.optim.distributed_muon import DistributedMuon
from megatron_zaya.optim.muon import Muon
from megatron_zaya.parallel.data import GradientReducer
from megatron_zaya.parallel.state import ParallelState


def test_distributed_muon_accumulates_sub_bf16_updates_in_its_fp32_master():
    """A bf16 weight near 1 (bf16 spacing 2**-7) takes 20 Muon steps of lr 1e-3, each far below that
    spacing: the fp32 master must accumulate them as plain Muon does on an fp32 copy fed the same
    bf16-rounded gradients (1e-5 absolute), and the bf16 weight (the master rounded) must have moved.
    A master rebuilt from the bf16 weight every step would lose every update."""
    torch.manual_seed(0)
    w0 = 1.0 + 0.1 * torch.randn(32, 32)
    weight = torch.nn.Parameter(w0.bfloat16())
    ref = torch.nn.Parameter(w0.bfloat16().float())
    reducer = GradientReducer([weight], ParallelState(1, 1, 1), shard=True)
    opt = DistributedMuon([weight], reducer, lr=1e-3, ns_dtype=torch.float32)
    ref_opt = Muon([ref], lr=1e-3, ns_dtype=torch.float32)
    grad = torch.randn(32, 32)
    for _ in range(20):
        (weight.float() * grad).sum().backward()
        reducer.finish()
        opt.step()
        reducer.zero_grad()
        ref.grad = grad.bfloat16().float()
        ref_opt.step()
        ref_opt.zero_grad()
    master = opt.state[weight]["master"]
    error = float((master - ref.detach()).abs().max())
    assert error < 1e-5, f"fp32 master {error:.2e} away from fp32 Muon's weight"
    assert torch.equal(weight.detach(), master.bfloat16())
    assert int((weight.detach() != w0.bfloat16()).sum()) > 100


def test_zero1_memory_report_counts_masters_of_bf16_weights_only():
    """After one AdamW step on one rank, the report's bytes are counted independently: AdamW's two fp32
    moments (8 bytes an element) for every weight, plus an fp32 master (4 bytes) only for the bf16
    weight (an fp32 weight is its own master): 8 * 70 + 12 * 13 bytes, nothing saved on one rank."""
    torch.manual_seed(0)
    full = torch.nn.Parameter(torch.randn(10, 7))
    half = torch.nn.Parameter(torch.randn(13).bfloat16())
    ps = ParallelState(1, 1, 1)
    reducer = GradientReducer([full, half], ps, shard=True)
    opt = DistributedOptimizer([full, half], lambda groups: torch.optim.AdamW(groups, lr=1e-3), ps, reducer=reducer)
    (full.sum() + half.float().sum()).backward()
    reducer.finish()
    opt.step()
    moments = sum(t.numel() * t.element_size() for s in opt.inner.state.values() for t in s.values()
                  if torch.is_tensor(t) and t.dim() > 0)
    assert moments == 8 * 83
    report = opt.memory_report()
    assert (report["params_owned"], report["params_total"]) == (83, 83)
    assert report["sharded_bytes"] == report["unsharded_bytes"] == 8 * 70 + 12 * 13
    assert report["saved_fraction"] == 0.0
