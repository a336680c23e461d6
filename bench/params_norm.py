"""The params norm a logged step computes (TensorBoard's params-norm, --log-params-norm): the runtime's
(fp32 rows summed in fp64, parallel.data.sum_of_squares) against the float64 copy of every weight it
replaced, on one process, same weights, alternating.

    python bench/params_norm.py                            # zaya1-100m, 1 thread
    python bench/params_norm.py --preset zaya1-tiny --repeats 3
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megatron_zaya.config import model_config_from_preset  # noqa: E402
from megatron_zaya.model import ZayaModel  # noqa: E402
from megatron_zaya.training.runtime import SingleProcess  # noqa: E402


def float64_copies(params) -> float:
    return math.sqrt(torch.stack([p.detach().double().pow(2).sum() for p in params]).sum().item())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="zaya1-100m")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    runtime = SingleProcess(torch.device("cpu"))
    runtime.prepare_model(ZayaModel(model_config_from_preset(args.preset)))
    params = list(runtime.model.parameters())
    timings = {"float64 copies": [], "runtime.params_norm": []}
    values = {}
    for _ in range(args.repeats + 1):         # the first round warms up
        for name, norm in (("float64 copies", lambda: float64_copies(params)),
                           ("runtime.params_norm", runtime.params_norm)):
            start = time.perf_counter()
            values[name] = norm()
            timings[name].append(time.perf_counter() - start)
    print(f"{args.preset}: {sum(p.numel() for p in params) / 1e6:.1f}M parameters, {args.threads} thread(s)")
    for name, seconds in timings.items():
        print(f"  {name:20s} median {statistics.median(seconds[1:]) * 1e3:8.1f} ms   norm {values[name]:.9f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
