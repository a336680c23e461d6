"""A run stopped and resumed on this machine's device (a GPU when there is one, else the CPU) trains on
with the uninterrupted run's losses. The resumed run builds its model on the meta device and allocates
it on the device (training/runtime.place_on) before the checkpoint loads: the path a restart takes, which
the CPU test suite cannot reach on a GPU.

    python bench/gpu_resume_check.py [--out DIR] [--tolerance 2e-3]

Three fresh processes of pretrain_zaya.py (--mock-data, zaya1-tiny with 2 layers, bf16 on a GPU): 4
iterations straight; 2 iterations saved; the last 2 resumed from that checkpoint. Exit status 1 when a
resumed loss differs from the straight run's by more than the tolerance (the console prints 4 decimals;
GPU kernels need not be bitwise reproducible).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOSS = re.compile(r"iteration +(\d+)/ *\d+ .*\| lm loss: ([0-9.E+-]+)")


def train(out: str, *extra: str) -> tuple[dict[int, float], str]:
    """(lm loss by iteration, the console output) of one pretrain_zaya.py process."""
    import torch
    argv = [sys.executable, os.path.join(ROOT, "pretrain_zaya.py"), "--preset", "zaya1-tiny", "--num-layers", "2",
            "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1024", "--micro-batch-size", "2",
            "--global-batch-size", "4", "--seq-length", "64", "--train-iters", "4", "--lr", "3e-3",
            "--log-interval", "1", "--eval-iters", "0", "--num-workers", "0", *extra]
    if torch.cuda.is_available():
        argv.append("--bf16")
    result = subprocess.run(argv, cwd=out, capture_output=True, text=True, timeout=300)
    text = result.stdout + result.stderr
    if result.returncode != 0:
        raise SystemExit(f"pretrain_zaya.py {' '.join(extra)} failed (exit {result.returncode}):\n{text[-4000:]}")
    return {int(i): float(loss) for i, loss in LOSS.findall(text)}, text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None,
                        help="folder for the checkpoint and result.json (default: a temporary one)")
    parser.add_argument("--tolerance", type=float, default=2e-3)
    args = parser.parse_args()
    # A SIGTERM (a time limit) ends this check at once, and subprocess.run then kills the running trainer, which
    # would otherwise finish its iteration, save and run on unwatched.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    import torch
    out = args.out or tempfile.mkdtemp(prefix="gpu_resume_check_")
    os.makedirs(out, exist_ok=True)
    ckpt = os.path.join(out, "ckpt")
    straight, _ = train(out)
    first, _ = train(out, "--save", ckpt, "--exit-interval", "2")
    resumed, text = train(out, "--save", ckpt, "--load", ckpt)
    loaded = "loaded checkpoint" in text
    gaps = {i: abs(resumed.get(i, float("nan")) - straight.get(i, float("nan"))) for i in (3, 4)}
    ok = (loaded and sorted(first) == [1, 2] and sorted(resumed) == [3, 4]
          and all(g <= args.tolerance for g in gaps.values()))
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    result = {"device": device, "straight": straight, "first": first, "resumed": resumed, "gaps": gaps,
              "loaded": loaded, "tolerance": args.tolerance, "ok": ok}
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"{device}: straight {straight}, resumed {resumed} (loaded: {loaded}); "
          f"{'OK' if ok else 'MISMATCH'} within {args.tolerance}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
