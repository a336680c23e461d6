"""Dropless top-1 SwiGLU experts computed grouped: tokens sorted by expert, all experts' matmuls
done as one grouped GEMM each for gate/up and down (torch._grouped_mm), never a loop on the main path.

Weights are stored like the transformers reference: gate_up (E, 2F, D) and down (E, D, F).

On CPU in bf16/fp16 the groups' row counts are padded (zero rows) to a few bucketed sizes: oneDNN,
which runs those matmuls, compiles a kernel for every new shape, ~15 ms each at 100M-model sizes
against ~1.5 ms for the matmul itself, and routing gives new per-expert counts every step."""
from __future__ import annotations

import torch
from torch import nn

from megatron_zaya import kernels
from megatron_zaya.kernels.reference import GatherRows, inverse_rows
from megatron_zaya.model import recompute
from megatron_zaya.model.weight_casts import WeightCasts

_HAS_GROUPED_MM = hasattr(torch, "_grouped_mm")
_GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _contiguous_grad(t: torch.Tensor) -> torch.Tensor:
    # _grouped_mm's backward rejects expanded (stride-0) gradients, e.g. from .sum().
    if t.requires_grad:
        t.register_hook(lambda g: g.contiguous())
    return t


def _rows_aligned(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """torch._grouped_mm needs rows of a multiple of 16 bytes in its operands and results, forward and
    backward: the input and output widths (e.g. --hidden-size 130, or an expert FFN width / TP of 132 in
    bf16, are not)."""
    return all(width * x.element_size() % 16 == 0 for width in (x.shape[-1], weight.shape[-2]))


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor,
                   cast: WeightCasts | None = None) -> torch.Tensor:
    """Rows of x (sorted by group) times weight[g].T for their group g.

    x: (K, in); weight: (G, out, in); counts: (G,) rows per group, summing to K. Returns (K, out).
    Under autocast both run in its dtype, the weight cast by `cast` (a step's kept copy) when given."""
    if torch.is_autocast_enabled(x.device.type):
        x = x.to(torch.get_autocast_dtype(x.device.type))
    weight = cast(weight, x.dtype) if cast is not None else weight.to(x.dtype)
    if _HAS_GROUPED_MM and x.dtype in _GROUPED_MM_DTYPES and x.shape[0] > 0 and _rows_aligned(x, weight):
        offsets = torch.cumsum(counts, 0).to(torch.int32)
        return _contiguous_grad(torch._grouped_mm(x, weight.transpose(-2, -1), offs=offsets))
    # Fallback for builds without grouped GEMM, float64 checks and unaligned widths: correct, slower.
    outputs = [chunk @ w.T for chunk, w in zip(torch.split(x, counts.tolist()), weight)]
    return torch.cat(outputs) if outputs else x.new_zeros(0, weight.shape[1])


def bucketed_rows(rows: int) -> int:
    """rows rounded up to a multiple of 2^(floor(log2 rows) - 3), at least 16: at most 1/8 more
    rows (1/16 on average) and only 8 sizes per power of two, so kernels compiled per shape are
    reused from step to step."""
    if rows == 0:
        return 0
    quantum = max(16, 1 << max(0, rows.bit_length() - 4))
    return -(-rows // quantum) * quantum


def pads_groups(x: torch.Tensor) -> bool:
    """Whether the grouped matmuls of x would run through oneDNN's per-shape kernels (CPU, bf16/fp16)."""
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
    return x.device.type == "cpu" and dtype in (torch.bfloat16, torch.float16)


def padded_group_layout(counts: torch.Tensor):
    """Rows of groups of `counts` rows, each group padded to bucketed_rows: returns (padded counts,
    dest: the padded position of each row (K,), source: the row of each padded position or K for
    a zero row (K_pad,)), or None when every group already has a bucketed size."""
    rows = counts.tolist()
    padded_rows = [bucketed_rows(r) for r in rows]
    if padded_rows == rows:
        return None
    padded = torch.tensor(padded_rows, dtype=counts.dtype, device=counts.device)
    shift = torch.cumsum(padded, 0) - padded - (torch.cumsum(counts, 0) - counts)
    total = sum(rows)
    dest = torch.arange(total, device=counts.device) + torch.repeat_interleave(shift, counts, output_size=total)
    return padded, dest, inverse_rows(dest, sum(padded_rows))


class GroupedExperts(nn.Module):
    recompute_module = "moe_act"
    recompute_selective = False     # memory policy (ZayaModel.set_recompute): the SwiGLU output recomputed
    weight_casts: WeightCasts | None = None     # the model's (ZayaModel sets it): per-step bf16 copies

    def __init__(self, num_experts: int, hidden_size: int, ffn_hidden_size: int):
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_weight = nn.Parameter(torch.empty(num_experts, 2 * ffn_hidden_size, hidden_size))
        self.down_weight = nn.Parameter(torch.empty(num_experts, hidden_size, ffn_hidden_size))

    def forward(self, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """tokens (K, D) sorted by expert with counts (E,) -> expert outputs (K, D), same order."""
        layout = padded_group_layout(counts) if pads_groups(tokens) and tokens.shape[0] > 0 else None
        if layout is None:
            return self.grouped_swiglu(tokens, counts)
        padded_counts, dest, source = layout
        # Zero rows in and out of the padding meet only zeros; outputs and gradients differ from the
        # unpadded ones by rounding only (oneDNN may block a different M differently).
        out = self.grouped_swiglu(GatherRows.apply(tokens, source, dest), padded_counts)
        return GatherRows.apply(out, dest, source)

    def grouped_swiglu(self, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """down(swiglu(gate_up(tokens))). Under selective recomputation the SwiGLU output, which the down
        matmul keeps for its backward, is recomputed from gate_up instead (and the reference SwiGLU keeps
        only gate_up)."""
        drop = recompute.selective(self)
        gate_up = grouped_matmul(tokens, self.gate_up_weight, counts, self.weight_casts)
        return recompute.feed(lambda hidden: grouped_matmul(hidden, self.down_weight, counts, self.weight_casts),
                              lambda x: kernels.swiglu(x, recompute=drop), gate_up, drop)
