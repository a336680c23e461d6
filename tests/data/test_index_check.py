"""index_check.open_checked: a dataset's whole index is checked and hashed once per version of its files;
later opens (other ranks, restarts) take the record instead of reading the index again."""
import os

import numpy as np
import pytest

import megatron_zaya.data.index_check as index_check
from megatron_zaya.data.cache import array_digest
from megatron_zaya.data.gpt_dataset import dataset_fingerprint
from megatron_zaya.data.indexed import IndexedDataset, IndexedDatasetError, write_dataset


@pytest.fixture
def checks(monkeypatch):
    """The prefixes whose whole index was checked, in order."""
    seen = []
    real = index_check._check

    def counted(prefix):
        seen.append(os.path.basename(prefix))
        return real(prefix)

    monkeypatch.setattr(index_check, "_check", counted)
    return seen


def _write(prefix, docs):
    write_dataset(prefix, docs, dtype=np.uint16)
    return prefix


def test_a_restart_takes_the_record_instead_of_reading_the_index(tmp_path, checks):
    prefix = _write(str(tmp_path / "a"), [[1, 2, 3], [4], [5, 6]])
    cache = str(tmp_path / "cache")
    first = index_check.open_checked([prefix], True, lambda p: cache, start=0)[prefix]
    assert checks == ["a"]
    fresh = IndexedDataset(prefix)
    want = array_digest(fresh.sequence_lengths, fresh.document_indices)
    assert dataset_fingerprint(first)["lengths_blake2b"] == want
    again = index_check.open_checked([prefix], True, lambda p: cache, start=3)[prefix]
    assert checks == ["a"]                                  # not read again
    assert again.num_tokens == fresh.num_tokens == 6
    assert dataset_fingerprint(again) == dataset_fingerprint(fresh)
    assert again.get(2).tolist() == [5, 6]


def test_rewritten_files_are_checked_again(tmp_path, checks):
    """Re-tokenized data of the same size: new change and modification times, so a new check and hash."""
    prefix = _write(str(tmp_path / "a"), [[1, 2, 3], [4]])
    cache = str(tmp_path / "cache")
    before = dataset_fingerprint(index_check.open_checked([prefix], True, lambda p: cache, start=0)[prefix])
    _write(prefix, [[1], [2, 3, 4]])
    after = index_check.open_checked([prefix], True, lambda p: cache, start=0)[prefix]
    assert checks == ["a", "a"]
    assert dataset_fingerprint(after)["lengths_blake2b"] != before["lengths_blake2b"]
    assert after.get(1).tolist() == [2, 3, 4]


def test_a_damaged_dataset_is_named_and_gets_no_record(tmp_path, checks):
    prefix = _write(str(tmp_path / "bad"), [[1, 2, 3], [4]])
    with open(prefix + ".idx", "r+b") as f:        # pointer of sequence 1
        f.seek(34 + 4 * 2 + 8)
        f.write(np.int64(2).tobytes())
    cache = str(tmp_path / "cache")
    for _ in range(2):
        with pytest.raises(IndexedDatasetError, match=f"{prefix}.idx: sequence pointer 1"):
            index_check.open_checked([prefix], True, lambda p: cache, start=0)
    assert checks == ["bad", "bad"]
    assert not [f for f in os.listdir(cache) if f.endswith(".npy") or f.endswith(".json")]


def test_each_rank_starts_at_its_own_dataset_and_no_cache_checks_every_time(tmp_path, checks, monkeypatch):
    prefixes = [_write(str(tmp_path / name), [[1, 2], [3]]) for name in ("x", "y", "z")]
    opened = index_check.open_checked(prefixes, False, lambda p: str(tmp_path / "cache"), start=4)
    assert checks == ["y", "z", "x"] and list(opened) == prefixes      # 4 mod 3: the second first
    assert all(opened[p].num_tokens == 3 for p in prefixes)
    validated = []
    real = IndexedDataset._validate
    monkeypatch.setattr(IndexedDataset, "_validate", lambda self, *a: validated.append(1) or real(self, *a))
    index_check.open_checked(prefixes, False, lambda p: str(tmp_path / "cache"), start=0)
    assert validated == []
    index_check.open_checked(prefixes[:1], False, None)     # --no-index-cache: no record, a check every open
    index_check.open_checked(prefixes[:1], False, None)
    assert validated == [1, 1]


def test_build_order_starts_at_each_rank_or_each_node(monkeypatch):
    """Ranks start at their own entry; with per_node every process of a host starts at the same one."""
    from megatron_zaya.data.cache import build_order

    assert build_order([0, 1, 2], start=4) == [1, 2, 0] and build_order([], start=1) == []
    monkeypatch.setenv("WORLD_SIZE", "8")
    orders = []
    for rank in ("5", "6"):
        monkeypatch.setenv("RANK", rank)
        orders.append((build_order([0, 1, 2]), build_order(list(range(7)), per_node=True)))
    assert orders[0][0] == [2, 0, 1] and orders[1][0] == [0, 1, 2]
    assert orders[0][1] == orders[1][1] and sorted(orders[0][1]) == list(range(7))
