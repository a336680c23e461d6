"""Weights, gradients and optimizer bytes: the planner against real tensors after a real training step.

Mixed precision as the planner models ZeRO-1 (Megatron's convention, and the trainer's under --bf16
--use-distributed-optimizer): bf16 weights (fp32 router), gradients accumulated into fp32 main-grad buffers by
post-accumulate hooks, fp32 master copies of the bf16 weights, and the optimizer over the masters (on one rank:
ZeRO-1 at DP 1). ZeRO-1 over several ranks is reproduced on one process rank by rank: each parameter group is
flattened in model order and cut into contiguous shards, one master/state tensor per parameter piece, exactly
as a distributed optimizer holds them. Without ZeRO-1 the weights are fp32 (test_planner_trainer_state.py) and
bf16 autocast keeps copies of them for the backward (test_planner_autocast_copies.py)."""
import pytest
import torch

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel
from megatron_zaya.planner.layout import ParallelLayout
from megatron_zaya.planner.memory import state_memory


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def is_expert(name):
    return ".moe.experts." in name


def muon_matrix(name, p):
    return p.ndim >= 2 and not name.startswith("embedding.") and ".conv_" not in name


class MixedPrecisionModel:
    """bf16 model + fp32 main grads filled by hooks during backward (no bf16 .grad kept)."""

    def __init__(self, config, grad_dtype=torch.float32):
        torch.manual_seed(0)
        self.model = ZayaModel(config).to(torch.bfloat16)
        for block in self.model.layers:
            block.moe.router.float()
        self.named = list(self.model.named_parameters())
        self.main_grads = {}
        for name, p in self.named:
            dtype = grad_dtype if grad_dtype == torch.float32 else p.dtype
            self.main_grads[name] = torch.zeros(p.shape, dtype=dtype)
            p.register_post_accumulate_grad_hook(self._hook(name))

    def _hook(self, name):
        def hook(p):
            self.main_grads[name].add_(p.grad)
            p.grad = None
        return hook

    def backward_step(self, micro_batches=2, batch=2, seq=16):
        vocab = self.model.config.vocab_size
        gen = torch.Generator().manual_seed(0)
        for _ in range(micro_batches):
            tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = self.model(tokens[:, :-1], labels=tokens[:, 1:])
            out.token_losses.float().mean().backward()


def masters_for(name, p, grad, lo=0, hi=None):
    """The fp32 master tensor(s) of elements [lo, hi) of a parameter, with their gradient.

    fp32 parameters are their own master (a view, no copy); bf16 ones get an fp32 copy."""
    flat, gflat = p.detach().view(-1), grad.view(-1)
    hi = flat.numel() if hi is None else hi
    data = flat[lo:hi] if p.dtype == torch.float32 else flat[lo:hi].float().clone()
    master = torch.nn.Parameter(data)
    master.grad = gflat[lo:hi].float()
    return master, p.dtype != torch.float32


def optimizer_bytes(optimizers, masters_with_copy):
    state = [t for opt in optimizers for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    return tensor_bytes(state) + tensor_bytes([m for m, copied in masters_with_copy if copied])


@pytest.mark.parametrize("grad_dtype", ["fp32", "bf16"])
def test_adamw_state_bytes_exact(grad_dtype):
    config = model_config_from_preset("zaya1-tiny", num_layers=2, vocab_size=1024)
    mp = MixedPrecisionModel(config, torch.float32 if grad_dtype == "fp32" else torch.bfloat16)
    mp.backward_step(micro_batches=1)
    masters = [masters_for(n, p, mp.main_grads[n]) for n, p in mp.named]
    opt = torch.optim.AdamW([m for m, _ in masters], lr=1e-3)
    opt.step()
    layout = ParallelLayout(gpus=1, seq_length=32, micro_batch_size=2, global_batch_size=4, zero1=True)
    planned = state_memory(config, layout.validate(config), "adamw", grad_dtype)
    assert planned.weights == tensor_bytes(mp.model.parameters())
    assert planned.gradients == tensor_bytes(mp.main_grads.values())
    assert planned.optimizer == optimizer_bytes([opt], masters)
    assert all(p.grad is None for _, p in mp.named)        # no bf16 .grad held on top


def test_muon_state_bytes_exact():
    config = model_config_from_preset("zaya1-tiny", num_layers=1, vocab_size=512)
    mp = MixedPrecisionModel(config)
    mp.backward_step(micro_batches=1)
    muon_masters, adamw_masters = [], []
    for name, p in mp.named:
        grad = mp.main_grads[name]
        if muon_matrix(name, p):
            # Muon works on 2-D matrices: one master per expert matrix of a 3-D expert weight.
            rows = p.shape[-2] * p.shape[-1]
            for i in range(p.numel() // rows):
                master, copied = masters_for(name, p, grad, i * rows, (i + 1) * rows)
                master = torch.nn.Parameter(master.data.view(p.shape[-2], p.shape[-1]))
                master.grad = grad.view(-1)[i * rows:(i + 1) * rows].float().view(p.shape[-2], p.shape[-1])
                muon_masters.append((master, copied))
        else:
            adamw_masters.append(masters_for(name, p, grad))
    muon = torch.optim.Muon([m for m, _ in muon_masters], lr=1e-3)
    adamw = torch.optim.AdamW([m for m, _ in adamw_masters], lr=1e-3)
    muon.step()
    adamw.step()
    layout = ParallelLayout(gpus=1, seq_length=32, micro_batch_size=2, global_batch_size=2, zero1=True).validate(config)
    planned = state_memory(config, layout, "muon")
    assert planned.optimizer == optimizer_bytes([muon, adamw], muon_masters + adamw_masters)
    assert planned.weights == tensor_bytes(mp.model.parameters())


@pytest.mark.parametrize("ranks,ep", [(3, 1), (4, 2)])
def test_zero1_shards_exact_per_rank(ranks, ep):
    config = model_config_from_preset("zaya1-tiny", num_layers=1, vocab_size=512)
    mp = MixedPrecisionModel(config)
    mp.backward_step(micro_batches=1)
    # Megatron's distributed optimizer keeps separate buffers for dense bf16, dense fp32 and expert weights.
    # With EP, a rank holds E / EP experts; its expert buffer is sharded over the expert-DP group.
    groups = {"dense_bf16": [], "dense_fp32": [], "expert": []}
    for name, p in mp.named:
        if is_expert(name):
            n_local = p.shape[0] // ep
            groups["expert"].append((name, p[:n_local], mp.main_grads[name][:n_local]))
        else:
            groups["dense_fp32" if p.dtype == torch.float32 else "dense_bf16"].append((name, p, mp.main_grads[name]))
    measured = [0] * ranks
    for key, items in groups.items():
        group_ranks = ranks // ep if key == "expert" else ranks
        total = sum(p.numel() for _, p, _ in items)
        shard = -(-total // group_ranks)
        for r in range(ranks):
            g = r % group_ranks
            lo, hi = g * shard, min((g + 1) * shard, total)
            masters, start = [], 0
            for name, p, grad in items:
                a, b = max(lo, start), min(hi, start + p.numel())
                if b > a:
                    masters.append(masters_for(name, p.contiguous() if p.dtype == torch.float32 else p, grad.contiguous(),
                                               a - start, b - start))
                start += p.numel()
            if masters:
                opt = torch.optim.AdamW([m for m, _ in masters], lr=1e-3)
                opt.step()
                measured[r] += optimizer_bytes([opt], masters)
    layout = ParallelLayout(gpus=ranks, seq_length=32, micro_batch_size=1, global_batch_size=ranks,
                            expert_parallel=ep, zero1=True).validate(config)
    planned = state_memory(config, layout, "adamw")
    assert planned.optimizer_per_rank == measured
    assert planned.optimizer == max(measured)
    # Weights and fp32 gradient buffers stay whole (ZeRO-1 shards only master weights and optimizer state).
    expert_local = sum(p.numel() for n, p in mp.named if is_expert(n)) // ep
    dense = [p for n, p in mp.named if not is_expert(n)]
    assert planned.weights == tensor_bytes(dense) + expert_local * 2
    assert planned.gradients == 4 * (sum(p.numel() for p in dense) + expert_local)


def test_zero1_muon_at_1024_ranks_keeps_whole_matrices_on_their_owners():
    """ZAYA1-base over 1024 ranks: DistributedMuon gives each whole (expert-stacked) matrix to one owner, which
    keeps its fp32 momentum and master, so the busiest rank holds at least the largest matrix's 8 bytes per
    element (about 1.07 GB for a layer's experts' gate/up), far above 1/1024 of the state (0.07 GB: the flat cut
    the planner once made), and its Newton-Schulz time is that rank's."""
    from megatron_zaya.planner import CLUSTERS, Efficiency
    from megatron_zaya.planner.memory import parameter_inventory
    from megatron_zaya.planner.time import newton_schulz_flops, step_time

    config = model_config_from_preset("zaya1-base")
    layout = ParallelLayout(1024, 4096, 1, 4096, zero1=True).validate(config)
    largest = max(p.numel for p in parameter_inventory(config) if p.muon)
    muon = state_memory(config, layout, "muon")
    assert largest * 8 <= muon.optimizer < 2 * largest * 8
    assert muon.optimizer > 10 * state_memory(config, layout, "adamw").optimizer
    experts, d, f = config.num_experts, config.hidden_size, config.moe_ffn_hidden_size
    cluster, eff = CLUSTERS["mi300x"], Efficiency()
    muon_time, adamw_time = (step_time(config, layout, cluster, eff, optimizer) for optimizer in ("muon", "adamw"))
    busiest = muon_time.optimizer - adamw_time.optimizer     # (less: Muon moves fewer state bytes than AdamW)
    assert busiest >= experts * newton_schulz_flops(2 * f, d) / (cluster.peak_flops * eff.compute) * 0.9
