"""Bytes of model weights each rank writes at a save (and reads at a load) when the replicas of a tensor
share it out (checkpoint/replica_owners.py), for ZAYA1-base under N data-parallel ranks: the model is
built on the meta device, and the owners assigned as every rank of the group would (no processes).

    python bench/checkpoint_owner_bytes.py [--preset zaya1-base] [--dp 8 64 1024]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from megatron_zaya.checkpoint.replica_owners import assign_owners  # noqa: E402
from megatron_zaya.config import model_config_from_preset  # noqa: E402
from megatron_zaya.model import ZayaModel  # noqa: E402


def bytes_per_rank(tensors: dict, dp: int) -> list[int]:
    """Each of `dp` ranks' bytes, every tensor replicated over all of them (pure data parallelism)."""
    pstate = SimpleNamespace(rank=0, dp_cp_group="dp", dp_cp_ranks=list(range(dp)),
                             expert_dp_group="dp", expert_dp_ranks=list(range(dp)))
    owners = assign_owners(tensors, pstate, lambda t: False)
    loads = [0] * dp
    for name, found in owners.items():
        t = tensors[name]
        if found is None:            # held by this rank alone (one rank: no replicas to share the reads)
            loads[0] += t.numel() * t.element_size()
            continue
        for share in found if isinstance(found, list) else [found]:     # (an older tree: one (group, owner))
            rows = getattr(share, "rows", None)
            owner = share.owner if hasattr(share, "owner") else share[1]
            loads[owner] += (t.numel() if rows is None else t[0].numel() * (rows[1] - rows[0])) * t.element_size()
    return loads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="zaya1-base")
    parser.add_argument("--dp", type=int, nargs="+", default=[8, 64, 1024])
    args = parser.parse_args()
    with torch.device("meta"):
        model = ZayaModel(model_config_from_preset(args.preset))
    tensors = dict(model.state_dict(keep_vars=True))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    largest = max(tensors, key=lambda n: tensors[n].numel())
    print(f"{args.preset}: {total / 2**30:.2f} GiB in {len(tensors)} tensors (fp32); the largest, {largest}: "
          f"{tensors[largest].numel() * tensors[largest].element_size() / 2**30:.2f} GiB")
    print("| DP ranks | even share | most on one rank | least on one rank | assignment s |")
    print("|---|---|---|---|---|")
    for dp in args.dp:
        start = time.perf_counter()
        loads = bytes_per_rank(tensors, dp)
        seconds = time.perf_counter() - start
        assert sum(loads) == total, (sum(loads), total)
        print(f"| {dp:,} | {total / dp / 2**20:,.1f} MiB | {max(loads) / 2**20:,.1f} MiB | "
              f"{min(loads) / 2**20:,.1f} MiB | {seconds:.3f} |")


if __name__ == "__main__":
    main()
