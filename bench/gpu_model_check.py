"""The whole model with the Triton kernels against the same model with the PyTorch reference: same
weights and batch, forward and backward. Reports the loss and gradient differences and the time of
a step for each backend.

    python bench/gpu_model_check.py                          # on a GPU: zaya1-base-4l, 2 x 2048, fp32 and bf16
    python bench/gpu_model_check.py --dtype bf16 --seq-length 4096
    python bench/gpu_model_check.py --preset zaya1-tiny --num-layers 2 --seq-length 16 --micro-batch-size 2
                                                             # without a GPU: the Triton interpreter (slow)

The kernel tests check each kernel alone on small shapes. This script checks them inside the model,
at the model's own shapes, dtypes and layouts. Without a GPU the script sets TRITON_INTERPRET=1
before triton is imported and runs on the CPU: its timings then mean nothing.
Tolerances (TOLERANCES): in fp32 every gradient agrees to a relative Frobenius error of 1e-4, each
token's loss to 1e-4 and the mean loss to 1e-5 (interpreted); on a GPU, where torch's TF32 is off but
Triton's tl.dot rounds fp32 operands to TF32, to 5e-3, 1e-3 and 1e-4; in bf16 to 5e-2, 5e-2, 1e-2. The
two backends round differently, so a token near a routing tie can pick another expert: the count
of such tokens is printed, and their per-token losses are left out of the per-token check (not of
the mean, nor of the gradients).
Exit code: 0 when every comparison is within tolerance, 1 otherwise.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

GPU = torch.cuda.is_available()
if not GPU:
    os.environ["TRITON_INTERPRET"] = "1"   # must precede the first `import triton`

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import megatron_zaya.kernels as K  # noqa: E402
from bench.timing import median_seconds  # noqa: E402
from megatron_zaya.config import model_config_from_preset  # noqa: E402
from megatron_zaya.model import ZayaModel  # noqa: E402

# (gradient relative error, per-token loss |diff|, mean loss |diff|). fp32 on a GPU: Triton's tl.dot
# takes fp32 operands as TF32 (10-bit mantissa) by default, in the CCA conv kernel, so 5e-3.
TOLERANCES = {"fp32": (5e-3 if GPU else 1e-4, 1e-3 if GPU else 1e-4, 1e-4 if GPU else 1e-5),
              "bf16": (5e-2, 5e-2, 1e-2)}


def relative_errors(reference: dict[str, torch.Tensor], test: dict[str, torch.Tensor]) -> dict[str, float]:
    """||test - reference|| / max(||reference||, tiny) per name (Frobenius, in float64)."""
    if reference.keys() != test.keys():
        raise ValueError(f"gradients differ in names: {sorted(reference.keys() ^ test.keys())}")
    errors = {}
    for name, ref in reference.items():
        ref64, test64 = ref.double(), test[name].double()
        errors[name] = ((test64 - ref64).norm() / ref64.norm().clamp_min(1e-30)).item()
    return errors


def step(model, tokens, labels, dtype: str, backend: str):
    """One forward+backward with `backend`: (per-token losses, gradients, expert index per layer)."""
    previous = K.kernel_backend()
    K.set_kernel_backend(backend)
    try:
        model.zero_grad(set_to_none=True)
        with torch.autocast(tokens.device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            out = model(tokens, labels=labels)
        out.token_losses.mean().backward()
    finally:
        K.set_kernel_backend(previous)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.token_losses.detach().float(), grads, [r.expert_index for r in out.routing]


def check(model, tokens, labels, dtype: str, iters: int) -> bool:
    loss_ref, grads_ref, routes_ref = step(model, tokens, labels, dtype, "torch")
    loss_tri, grads_tri, routes_tri = step(model, tokens, labels, dtype, "triton")
    grad_tol, token_tol, mean_tol = TOLERANCES[dtype]
    errors = relative_errors(grads_ref, grads_tri)
    rerouted = torch.stack([a != b for a, b in zip(routes_ref, routes_tri)]).view(len(routes_ref), *tokens.shape)
    loss_diff = (loss_tri - loss_ref).abs().masked_fill(rerouted.any(0), 0.0)
    mean_diff = (loss_tri.mean() - loss_ref.mean()).abs().item()
    loss_ok = loss_diff.max().item() <= token_tol and mean_diff <= mean_tol
    worst = sorted(errors.items(), key=lambda kv: -kv[1])[:5]
    grads_ok = worst[0][1] <= grad_tol
    print(f"[{dtype}] loss: per-token max |diff| {loss_diff.max().item():.2e} (tol {token_tol:g}), mean |diff| "
          f"{mean_diff:.2e} (tol {mean_tol:g}) {'ok' if loss_ok else 'FAIL'}; mean loss torch "
          f"{loss_ref.mean().item():.5f} triton {loss_tri.mean().item():.5f}")
    print(f"[{dtype}] token-layer routings that differ: {int(rerouted.sum())} of {rerouted.numel()}")
    print(f"[{dtype}] gradients: {len(errors)} tensors, worst relative error {worst[0][1]:.2e} "
          f"(tol {grad_tol:g}) {'ok' if grads_ok else 'FAIL'}")
    for name, err in worst:
        print(f"    {err:.2e}  {name}")
    if iters:
        sync = torch.cuda.synchronize if GPU else None
        seconds = {b: median_seconds(lambda b=b: step(model, tokens, labels, dtype, b), iters, synchronize=sync)
                   for b in ("torch", "triton")}
        n = tokens.numel()
        print(f"[{dtype}] forward+backward, median of {iters}: torch {seconds['torch']:.4f} s "
              f"({n / seconds['torch']:.0f} tokens/s), triton {seconds['triton']:.4f} s "
              f"({n / seconds['triton']:.0f} tokens/s): {seconds['torch'] / seconds['triton']:.2f}x")
    return loss_ok and grads_ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="zaya1-base-4l" if GPU else "zaya1-tiny")
    parser.add_argument("--num-layers", type=int, default=None, help="default: the preset's")
    parser.add_argument("--vocab-size", type=int, default=None, help="default: the preset's")
    parser.add_argument("--seq-length", type=int, default=2048 if GPU else 16)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--dtype", choices=["fp32", "bf16", "both"], default="both")
    parser.add_argument("--iters", type=int, default=5 if GPU else 0, help="timed steps per backend (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if GPU else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    overrides = {"seq_length": args.seq_length}
    if args.num_layers:
        overrides["num_layers"] = args.num_layers
    if args.vocab_size:
        overrides["vocab_size"] = args.vocab_size
    config = model_config_from_preset(args.preset, **overrides)
    torch.manual_seed(args.seed)
    model = ZayaModel(config).to(device)
    gen = torch.Generator().manual_seed(args.seed)
    batch = torch.randint(0, config.vocab_size, (args.micro_batch_size, args.seq_length + 1), generator=gen)
    tokens, labels = batch[:, :-1].to(device), batch[:, 1:].to(device)
    name = torch.cuda.get_device_name() if GPU else "cpu (Triton interpreter: timings mean nothing)"
    print(f"device: {name}; torch {torch.__version__}; {args.preset}, {config.num_layers} layers, "
          f"batch {args.micro_batch_size} x {args.seq_length}")
    dtypes = ["fp32", "bf16"] if args.dtype == "both" else [args.dtype]
    ok = all([check(model, tokens, labels, dtype, args.iters) for dtype in dtypes])
    print("model check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
