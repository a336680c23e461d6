"""kernels.embedding: a bf16 embedding table (ZeRO-1 stores the weights in bf16) gets its gradient summed in
fp32 and rounded once. CPU's own embedding backward adds each occurrence of a token in bf16, so the rows of
frequent tokens drift (8192 occurrences of one token: 5.6% off here, the same direction each time: up to 75%).
Tolerance: 1e-2 relative per row (one bf16 rounding is 2**-8 ~ 4e-3), against a float64 reference of the same
table and upstream gradient."""
import torch
import torch.nn.functional as F

from megatron_zaya import kernels
from megatron_zaya.model.zaya import TokenEmbedding


def row_errors(weight_grad: torch.Tensor, reference: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    diff = (weight_grad.double()[rows] - reference[rows]).norm(dim=1)
    return diff / reference[rows].norm(dim=1)


def test_bf16_table_gradient_is_summed_in_fp32():
    torch.manual_seed(0)
    vocab, dim = 64, 32
    tokens = torch.cat([torch.zeros(8192, dtype=torch.long), torch.randint(1, vocab, (1000,))]).view(4, -1)
    table = torch.randn(vocab, dim).bfloat16().requires_grad_()
    upstream = torch.randn(*tokens.shape, dim)
    out = kernels.embedding(tokens, table)
    assert torch.equal(out, F.embedding(tokens, table))
    out.backward(upstream.bfloat16())
    reference = torch.zeros(vocab, dim, dtype=torch.float64).index_add_(0, tokens.reshape(-1),
                                                                        upstream.bfloat16().double().reshape(-1, dim))
    used = torch.unique(tokens)
    assert table.grad.dtype == torch.bfloat16
    assert row_errors(table.grad, reference, used).max() < 1e-2
    assert torch.equal(table.grad[[r for r in range(vocab) if r not in set(used.tolist())]].float(),
                       torch.zeros(vocab - len(used), dim))
    # the plain bf16 backward: the frequent row is far off (the reason for kernels.embedding)
    plain = table.detach().clone().requires_grad_()
    F.embedding(tokens, plain).backward(upstream.bfloat16())
    assert row_errors(plain.grad, reference, torch.tensor([0])).item() > 3e-2


def test_fp32_and_fp64_tables_take_the_plain_path():
    tokens = torch.tensor([[1, 2, 2, 3]])
    for dtype in (torch.float32, torch.float64):       # (a float64 model's gradients stay float64 sums)
        module = TokenEmbedding(5, 4).to(dtype)
        upstream = torch.randn(1, 4, 4, dtype=dtype)
        module(tokens).backward(upstream)
        plain = module.weight.detach().clone().requires_grad_()
        F.embedding(tokens, plain).backward(upstream)
        assert torch.equal(module.weight.grad, plain.grad)
