"""Cross-entropy kernels vs F.cross_entropy (reference.cross_entropy), forward and backward.

Covers the per-token loss, the vocab-parallel partials (a vocab split into uneven slices whose
partials are merged as the all-reduces would merge them), ignored labels, bf16 logits, and the
chunked LM-head + cross-entropy. Tolerances: fp32 atol = rtol = 1e-5 for losses and logit grads;
bf16 logits: loss 1e-4 (the math is fp32 on the same bf16 values), grads 1.6e-2 (bf16 storage);
linear_cross_entropy in fp32: 1e-5 loss, 1e-5 grads."""
import pytest
import torch

from megatron_zaya.kernels import ce_autograd as CE
from megatron_zaya.kernels import reference as R
from megatron_zaya.kernels import triton_cross_entropy as T

TOL = dict(atol=1e-5, rtol=1e-5)


def _problem(n, v, seed, dtype=torch.float32, ignore=True):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, v, generator=gen) * 4).to(dtype)
    labels = torch.randint(0, v, (n,), generator=gen)
    if ignore:
        labels[1] = R.IGNORE_INDEX
    grad = torch.randn(n, generator=gen)
    return logits, labels, grad


def _loss_and_grad(fn, logits, labels, grad):
    z = logits.detach().clone().requires_grad_(True)
    loss = fn(z, labels)
    loss.backward(grad)
    return loss.detach(), z.grad


@pytest.mark.parametrize("n,v", [(5, 37), (4, 200)])
def test_cross_entropy_single_slice(n, v, triton_backend):
    logits, labels, grad = _problem(n, v, n * v)
    loss, g = _loss_and_grad(triton_backend.cross_entropy, logits, labels, grad)
    loss_r, g_r = _loss_and_grad(R.cross_entropy, logits, labels, grad)
    assert loss.dtype == torch.float32 and loss[1] == 0
    torch.testing.assert_close(loss, loss_r, **TOL)
    torch.testing.assert_close(g, g_r, **TOL)


def test_cross_entropy_bf16_logits(triton_backend):
    logits, labels, grad = _problem(4, 150, 2, dtype=torch.bfloat16)
    loss, g = _loss_and_grad(triton_backend.cross_entropy, logits, labels, grad)
    loss_r, g_r = _loss_and_grad(R.cross_entropy, logits, labels, grad)
    assert g.dtype == torch.bfloat16
    torch.testing.assert_close(loss, loss_r, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(g.float(), g_r.float(), atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize("bounds", [(0, 45, 101, 130), (0, 64, 130)])
def test_vocab_parallel_partials_combine(bounds):
    """Split the vocab into uneven slices, merge the per-slice partials like the all-reduces do,
    and check loss and the concatenated per-slice gradients against the full-vocab reference."""
    n, v = 6, bounds[-1]
    logits, labels, grad = _problem(n, v, len(bounds))
    slices = [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
    parts = [T.cross_entropy_partials(logits[:, lo:hi], labels, lo) for lo, hi in slices]
    for (lo, hi), got in zip(slices, parts):  # each slice's partials match the reference partials
        for a, b in zip(got, R.cross_entropy_partials(logits[:, lo:hi], labels, lo)):
            torch.testing.assert_close(a, b, **TOL)
    maxes, sums, targets = (torch.stack(t) for t in zip(*parts))
    global_max = maxes.max(0).values                             # all_reduce(MAX)
    total = (sums * torch.exp(maxes - global_max)).sum(0)        # all_reduce(SUM)
    target = targets.sum(0)                                      # all_reduce(SUM)
    lse = global_max + torch.log(total)
    loss = torch.where(labels == R.IGNORE_INDEX, torch.zeros_like(lse), lse - target)
    loss_r, g_r = _loss_and_grad(R.cross_entropy, logits, labels, grad)
    torch.testing.assert_close(loss, loss_r, **TOL)
    g = torch.cat([T.cross_entropy_grad(logits[:, lo:hi], labels, lse, grad, lo) for lo, hi in slices], dim=1)
    torch.testing.assert_close(g, g_r, **TOL)


def test_vocab_parallel_function_single_rank(triton_backend):
    logits, labels, grad = _problem(5, 90, 9)
    fn = lambda z, y: triton_backend.vocab_parallel_cross_entropy(z, y, 0, None)  # noqa: E731
    loss, g = _loss_and_grad(fn, logits, labels, grad)
    loss_r, g_r = _loss_and_grad(R.cross_entropy, logits, labels, grad)
    torch.testing.assert_close(loss, loss_r, **TOL)
    torch.testing.assert_close(g, g_r, **TOL)


def test_grad_in_place_writes_into_logits():
    logits, labels, grad = _problem(3, 70, 4)
    _, lse = R.combine_cross_entropy_partials(*T.cross_entropy_partials(logits, labels), labels)
    want = R.cross_entropy_grad(logits, labels, lse, grad)
    buf = logits.clone()
    out = T.cross_entropy_grad(buf, labels, lse, grad, inplace=True)
    assert out.data_ptr() == buf.data_ptr()
    torch.testing.assert_close(buf, want, **TOL)
    columns = logits.t().contiguous().t()      # the same values without a unit column stride
    assert columns.stride(-1) != 1
    out = T.cross_entropy_grad(columns, labels, lse, grad, inplace=True)
    assert out.data_ptr() == columns.data_ptr()     # written into the caller's tensor, as the reference does
    torch.testing.assert_close(columns, want, **TOL)


def test_grad_of_a_scalar_loss_gradient_scales_every_row():
    """grad_loss given as one value (a mean's 1/N) scales every row, as the reference broadcasts it (the kernel
    read element `row` of it: rows after the first got whatever lay past its end)."""
    logits, labels, _ = _problem(4, 70, 5)
    _, lse = R.combine_cross_entropy_partials(*T.cross_entropy_partials(logits, labels), labels)
    for grad in (torch.tensor(0.25), torch.tensor([0.25])):
        torch.testing.assert_close(T.cross_entropy_grad(logits, labels, lse, grad),
                                   R.cross_entropy_grad(logits, labels, lse, grad), **TOL)


@pytest.mark.parametrize("reduction,chunk_rows", [("mean", 4), ("sum", 64)])
def test_linear_cross_entropy(reduction, chunk_rows, triton_backend):
    gen = torch.Generator().manual_seed(21)
    n, d, v = 9, 24, 75
    hidden0 = torch.randn(2, n, d, generator=gen)
    weight0 = torch.randn(v, d, generator=gen) * 0.3
    labels = torch.randint(0, v, (2, n), generator=gen)
    labels[0, 3] = R.IGNORE_INDEX

    def run(fn, **kw):
        h = hidden0.clone().requires_grad_(True)
        w = weight0.clone().requires_grad_(True)
        loss = fn(h, w, labels, reduction=reduction, **kw)
        (loss * 1.7).backward()
        return loss.detach(), h.grad, w.grad

    got = run(triton_backend.linear_cross_entropy, chunk_rows=chunk_rows)
    want = run(R.linear_cross_entropy)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)


def test_linear_cross_entropy_torch_ops_match_too():
    """The chunked Function with the reference primitives (the CPU path) is exact as well."""
    gen = torch.Generator().manual_seed(22)
    h = torch.randn(10, 16, generator=gen, requires_grad=True)
    w = torch.randn(40, 16, generator=gen, requires_grad=True)
    labels = torch.randint(0, 40, (10,), generator=gen)
    loss = CE.LinearCrossEntropy.apply(h, w, labels, 0, None, "mean", R.IGNORE_INDEX, 3, R)
    loss.backward()
    h2, w2 = h.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    loss_r = R.linear_cross_entropy(h2, w2, labels)
    loss_r.backward()
    torch.testing.assert_close(loss, loss_r, **TOL)
    torch.testing.assert_close(h.grad, h2.grad, **TOL)
    torch.testing.assert_close(w.grad, w2.grad, **TOL)


def test_padded_vocab_slice_of_minus_inf():
    """A vocab slice that is entirely -inf (padding columns) contributes nothing, without NaN,
    in the kernel partials and in the reference partials and merge."""
    logits, labels, grad = _problem(4, 90, 31)
    logits[:, 70:] = float("-inf")
    labels = labels.clamp(max=69)
    labels[1] = R.IGNORE_INDEX
    slices = [(0, 70), (70, 90)]
    parts = [T.cross_entropy_partials(logits[:, lo:hi], labels, lo) for lo, hi in slices]
    for got, (lo, hi) in zip(parts, slices):
        for a, b in zip(got, R.cross_entropy_partials(logits[:, lo:hi], labels, lo)):
            torch.testing.assert_close(a, b, **TOL)
    assert torch.all(parts[1][1] == 0) and torch.all(torch.isneginf(parts[1][0]))
    maxes, sums, targets = (torch.stack(t) for t in zip(*parts))
    global_max = maxes.max(0).values
    merged = torch.where(sums > 0, sums * torch.exp(maxes - global_max), torch.zeros_like(sums)).sum(0)
    lse = global_max + torch.log(merged)
    loss = torch.where(labels == R.IGNORE_INDEX, torch.zeros_like(lse), lse - targets.sum(0))
    loss_r, g_r = _loss_and_grad(R.cross_entropy, logits[:, :70], labels, grad)
    torch.testing.assert_close(loss, loss_r, **TOL)
    g = torch.cat([T.cross_entropy_grad(logits[:, lo:hi], labels, lse, grad, lo) for lo, hi in slices], dim=1)
    assert torch.all(g[:, 70:] == 0)
    torch.testing.assert_close(g[:, :70], g_r, **TOL)


def test_cross_entropy_partials_of_large_logits_stay_finite():
    """Logits far above exp's fp32 range (~88): the max-shifted partials of the reference (the CPU
    vocab-parallel path) and of the kernel, merged, equal float64 F.cross_entropy (1e-4)."""
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 70, generator=gen) * 4 + 200
    labels = torch.randint(0, 70, (4,), generator=gen)
    want = F.cross_entropy(logits.double(), labels, reduction="none").float()
    for ops in (R, T):
        loss, _ = R.combine_cross_entropy_partials(*ops.cross_entropy_partials(logits, labels), labels)
        torch.testing.assert_close(loss, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_vocab_parallel_cross_entropy_takes_a_custom_ignore_index(backend):
    """ignore_index=-1 (not the default -100) in VocabParallelCrossEntropy's forward and backward: loss and
    gradient equal F.cross_entropy(ignore_index=-1) (1e-5), the ignored row zero in both."""
    import torch.nn.functional as F

    import megatron_zaya.kernels as K
    previous = K.kernel_backend()
    K.set_kernel_backend(backend)
    try:
        gen = torch.Generator().manual_seed(2)
        logits = torch.randn(5, 40, generator=gen)
        labels = torch.randint(0, 40, (5,), generator=gen)
        labels[2] = -1
        g = torch.randn(5, generator=gen)
        z = logits.clone().requires_grad_(True)
        loss = K.vocab_parallel_cross_entropy(z, labels, 0, None, ignore_index=-1)
        loss.backward(g)
    finally:
        K.set_kernel_backend(previous)
    zr = logits.clone().requires_grad_(True)
    want = F.cross_entropy(zr, labels, ignore_index=-1, reduction="none")
    want.backward(g)
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(z.grad, zr.grad, atol=1e-5, rtol=1e-5)
