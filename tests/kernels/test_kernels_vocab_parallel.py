"""Vocab-parallel cross-entropy across real ranks: 2 gloo processes on CPU, each holding an uneven
slice of the vocab, with the Triton kernels (interpreted) and with the torch reference. Loss and
gradients must match the single-rank full-vocab reference (fp32, atol = rtol = 1e-5)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import os, sys, tempfile
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported, inherited by the spawned ranks
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    BOUNDS = (0, 60, 101)  # two uneven vocab slices
    TOL = dict(atol=1e-5, rtol=1e-5)

    def worker(rank, world, init_file):
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
        for backend in ("torch", "triton"):
            check(rank, backend)
            if rank == 0:
                print("ok", backend, flush=True)
        dist.destroy_process_group()

    def check(rank, backend):
        import megatron_zaya.kernels as K
        from megatron_zaya.kernels import reference as R
        K.set_kernel_backend(backend)
        gen = torch.Generator().manual_seed(0)  # same data on every rank
        n, d, v = 7, 12, BOUNDS[-1]
        logits = torch.randn(n, v, generator=gen) * 3
        labels = torch.randint(0, v, (n,), generator=gen)
        labels[2] = R.IGNORE_INDEX
        grad = torch.randn(n, generator=gen)
        lo, hi = BOUNDS[rank], BOUNDS[rank + 1]

        full = logits.clone().requires_grad_(True)
        want = R.cross_entropy(full, labels)
        want.backward(grad)
        part = logits[:, lo:hi].clone().requires_grad_(True)
        got = K.vocab_parallel_cross_entropy(part, labels, lo, dist.group.WORLD)
        got.backward(grad)
        torch.testing.assert_close(got, want.detach(), **TOL)
        torch.testing.assert_close(part.grad, full.grad[:, lo:hi], **TOL)

        hidden = torch.randn(n, d, generator=gen)
        weight = torch.randn(v, d, generator=gen) * 0.3
        h_full, w_full = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        want = R.linear_cross_entropy(h_full, w_full, labels)
        want.backward()
        h, w = hidden.clone().requires_grad_(True), weight[lo:hi].clone().requires_grad_(True)
        got = K.linear_cross_entropy(h, w, labels, vocab_start=lo, group=dist.group.WORLD, chunk_rows=3)
        got.backward()
        torch.testing.assert_close(got, want.detach(), **TOL)
        torch.testing.assert_close(w.grad, w_full.grad[lo:hi], **TOL)
        dh = h.grad.clone()
        dist.all_reduce(dh)  # what the caller's tensor-parallel region op does
        torch.testing.assert_close(dh, h_full.grad, **TOL)

    if __name__ == "__main__":
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(worker, args=(2, os.path.join(tmp, "init")), nprocs=2, join=True)
    """
)


def test_vocab_parallel_cross_entropy_two_ranks(tmp_path):
    pytest.importorskip("triton")
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed not available")
    script = tmp_path / "vocab_parallel_ce.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    assert "ok torch" in out and "ok triton" in out, out[-4000:]
