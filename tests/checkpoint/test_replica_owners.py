"""replica_owners.assign_owners: a replicated tensor over its group's even share is split in row shares,
the shares cover its rows once, every rank of the group assigns alike, and the bytes per rank come out
near the even share (ZAYA1-base at 1,024 data-parallel ranks: its 2 GiB embedding is no longer one
rank's). The saves and loads that use them: test_ckpt_reshard.py."""
from types import SimpleNamespace

import torch

from megatron_zaya.checkpoint import replica_owners
from megatron_zaya.checkpoint.replica_owners import assign_owners, rows_of
from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel


def _pstate(rank, dp, experts_alone=False):
    return SimpleNamespace(rank=rank, dp_cp_group="dense", dp_cp_ranks=list(range(dp)),
                           expert_dp_group=None if experts_alone else "experts",
                           expert_dp_ranks=[rank] if experts_alone else list(range(dp)))


def _bytes_per_rank(tensors, owners, dp):
    loads = [0] * dp
    for name, shares in owners.items():
        t = tensors[name]
        for share in shares:
            rows = share.rows or (0, t.shape[0] if t.dim() else 1)
            loads[share.owner] += (t.numel() // max(t.shape[0] if t.dim() else 1, 1)) * (rows[1] - rows[0]) * 4
    return loads


def test_large_tensors_split_in_row_shares_that_cover_them_once(monkeypatch):
    monkeypatch.setattr(replica_owners, "MIN_SHARE_BYTES", 0)
    tensors = {"embedding": torch.empty(1000, 8, device="meta"), "norm": torch.empty(8, device="meta"),
               "scale": torch.empty((), device="meta"), "dense": torch.empty(40, 8, device="meta"),
               "expert": torch.empty(4, 50, 8, device="meta")}
    tensors["expert"].is_expert = True
    is_expert = lambda t: getattr(t, "is_expert", False)     # noqa: E731
    owners = [assign_owners(tensors, _pstate(rank, 4), is_expert) for rank in range(4)]
    assert all(o == owners[0] for o in owners[1:])              # every rank assigns alike
    mine = owners[0]
    assert len(mine["embedding"]) == 4 and [s.rows for s in mine["embedding"]] == [(0, 250), (250, 500),
                                                                                    (500, 750), (750, 1000)]
    assert sorted(s.owner for s in mine["embedding"]) == [0, 1, 2, 3]
    assert [s.rows for s in mine["norm"]] == [None] and [s.rows for s in mine["scale"]] == [None]
    assert all(s.group == "experts" for s in mine["expert"]) and all(s.group == "dense" for s in mine["dense"])
    loads = _bytes_per_rank(tensors, mine, 4)        # the even share (9,929 bytes) plus at most the largest share
    assert sum(loads) == sum(t.numel() * 4 for t in tensors.values()) and max(loads) <= sum(loads) / 4 + 8000, loads
    for rank in range(4):     # what each rank writes: its shares only, and together every row once
        assert rows_of(mine["embedding"], rank) == [s.rows for s in mine["embedding"] if s.owner == rank]
    # Under the 16 MiB floor these stay whole; a rank that holds its experts alone writes them all.
    monkeypatch.setattr(replica_owners, "MIN_SHARE_BYTES", 16 << 20)
    alone = assign_owners(tensors, _pstate(2, 4, experts_alone=True), is_expert)
    assert alone["expert"] is None and rows_of(alone["expert"], 2) == [None]
    assert all(len(alone[name]) == 1 for name in ("embedding", "norm", "scale", "dense"))


def test_zaya1_base_at_1024_data_parallel_ranks_is_near_the_even_share():
    with torch.device("meta"):
        model = ZayaModel(model_config_from_preset("zaya1-base"))
    tensors = dict(model.state_dict(keep_vars=True))
    owners = assign_owners(tensors, _pstate(0, 1024), lambda t: False)
    loads = _bytes_per_rank(tensors, owners, 1024)
    even = sum(t.numel() * 4 for t in tensors.values()) / 1024          # 32.9 MiB (fp32)
    assert sum(loads) == 1024 * even and max(loads) < 1.25 * even, (max(loads), even)
    assert len(owners["embedding.weight"]) > 32      # 2 GiB: the largest tensor, 62x the even share


def test_shares_tile_every_tensor_with_at_most_one_share_per_rank(monkeypatch):
    """Random models and group sizes: a rank file holds one entry per tensor, so no rank gets two shares of
    one tensor, and the shares of each tensor cover its rows once, in order."""
    import random
    monkeypatch.setattr(replica_owners, "MIN_SHARE_BYTES", 0)
    rng = random.Random(5)
    for _ in range(50):
        dp = rng.choice([2, 3, 4, 7, 16])
        tensors = {f"t{i}": torch.empty(rng.randint(1, 300), rng.randint(1, 9), device="meta")
                   for i in range(rng.randint(1, 12))}
        owners = assign_owners(tensors, _pstate(0, dp), lambda t: False)
        for name, shares in owners.items():
            owner_list = [s.owner for s in shares]
            assert len(set(owner_list)) == len(owner_list), (dp, name, shares)
            rows = [s.rows or (0, tensors[name].shape[0]) for s in shares]
            assert rows[0][0] == 0 and rows[-1][1] == tensors[name].shape[0]
            assert all(a[1] == b[0] for a, b in zip(rows, rows[1:])), rows
