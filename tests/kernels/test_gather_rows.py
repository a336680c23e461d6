"""reference.GatherRows (the MoE permutation's row gathers, whose index may name a zero row) against
indexing a zero-extended copy, forward and backward, and moe_permute / moe_unpermute round trips."""
import pytest
import torch

from megatron_zaya.kernels import reference


def zero_extended_gather(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.cat((src, torch.zeros(1, *src.shape[1:], dtype=src.dtype)))[index]


@pytest.mark.parametrize("rows, picked", [(7, 7), (7, 4), (0, 0)], ids=["permutation", "partial", "empty"])
def test_gather_rows_through_an_inverse_index(rows, picked):
    """out = src[order] and its inverse gather (rows not in `order` come back as zeros): values and gradients
    equal plain indexing of a zero-extended copy; the backward of each is the other gather."""
    gen = torch.Generator().manual_seed(0)
    src = torch.randn(rows, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    order = torch.randperm(rows, generator=gen)[:picked]
    inverse = reference.inverse_rows(order, rows)
    assert bool((inverse[order] == torch.arange(picked)).all()) and int((inverse == picked).sum()) == rows - picked

    gathered = reference.GatherRows.apply(src, order)
    back = reference.GatherRows.apply(gathered, inverse, order)     # rows of src not in order: zeros
    grad = torch.randn(back.shape, generator=gen, dtype=torch.float64)
    back.backward(grad)

    want_src = src.detach().clone().requires_grad_()
    want_back = zero_extended_gather(want_src[order], inverse)
    want_back.backward(grad)
    torch.testing.assert_close(back, want_back, rtol=0, atol=0)
    torch.testing.assert_close(src.grad, want_src.grad, rtol=0, atol=0)


def test_gather_rows_zero_rows_in_bf16_and_everywhere():
    """An index that names the zero row several times, first and last, in bf16: those rows are exactly 0
    and the others the rows they name."""
    src = torch.arange(12, dtype=torch.bfloat16).view(4, 3) + 1
    index = torch.tensor([4, 2, 4, 0, 3, 4])
    out = reference.GatherRows.apply(src, index)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, zero_extended_gather(src, index), rtol=0, atol=0)
    assert bool((out[index == 4] == 0).all())
