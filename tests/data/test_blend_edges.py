"""data.blend at its edges: a zero weight in a blend, negative and out-of-range indices, a component with
exactly the samples it must give, a phase that leaves a dataset out (the index in the run's numbering), and a
component's request across phases (the largest any phase needs, computed independently here)."""
import math

import numpy as np
import pytest

from megatron_zaya.data.blend import BlendedDataset, PhasedDataset, Positions, parse_data_path, plan_phases


def test_a_zero_weight_is_a_dataset_left_out():
    assert parse_data_path(["0", "a", "1", "b"]) == ([0.0, 1.0], ["a", "b"])


def test_indices_as_a_python_sequence():
    p = Positions(5)
    assert [p[i] for i in range(-5, 5)] == [0, 1, 2, 3, 4] * 2
    for bad in (5, -6):
        with pytest.raises(IndexError):
            p[bad]
    phased = PhasedDataset([list("abc"), list("de")])
    assert [phased[i] for i in range(5)] == list("abcde")
    for bad in (5, -1):
        with pytest.raises(IndexError):
            phased[bad]


def test_a_component_with_exactly_the_samples_it_gives():
    index, sample_index = np.array([0, 1, 0, 1], np.int16), np.array([0, 0, 1, 1])
    blended = BlendedDataset([list("ab"), list("xyz")], index, sample_index, offsets=[0, 1])
    assert [blended[i] for i in range(4)] == ["a", "y", "b", "z"]
    with pytest.raises(ValueError, match="blend component 1 has 3 samples, 4 needed"):
        BlendedDataset([list("ab"), list("xyz")], index, sample_index, offsets=[0, 2])


def test_a_phase_that_leaves_a_dataset_out_numbers_the_others_as_the_run_does():
    plan = plan_phases([[0.5, 0.0, 0.5]], [100])
    counts = np.bincount(np.asarray(plan.dataset_index[0]), minlength=3).tolist()
    assert counts == [50, 0, 50]


def test_a_components_request_is_the_most_any_phase_needs():
    """Phase 2 is short: what it asks of a component (the samples phase 1 used plus its own share with the
    0.5 % surplus) is below phase 1's request, which stands."""
    weights, sizes = [[0.5, 0.5], [0.5, 0.5]], [1000, 2]
    plan = plan_phases(weights, sizes)
    used, want = [0, 0], [0, 0]
    for w, size, index in zip(weights, sizes, plan.dataset_index):
        counts = np.bincount(np.asarray(index), minlength=2)
        for d in range(2):
            want[d] = max(want[d], used[d] + math.ceil(math.ceil(size * w[d]) * 1.005))
            used[d] += int(counts[d])
    assert plan.requests == want == [503, 503]


def test_each_phases_index_is_counted_once_per_build(tmp_path, monkeypatch):
    """Counting a run-sized blend index reads all of it (3.42B samples at ZAYA1's size): plan_phases counts it,
    and the BlendedDataset it becomes takes those counts instead of reading the index again."""
    from megatron_zaya.data import DataConfig, blend, build_train_valid_test_datasets
    from megatron_zaya.data.indexed import write_dataset
    from megatron_zaya.data.tokenizer import build_tokenizer
    for name, base in (("a", 0), ("b", 100)):
        write_dataset(str(tmp_path / name), [[base + i % 7] * 5 + [999] for i in range(30)], dtype=np.uint16)
    counted = []
    real_counts = blend.component_counts
    monkeypatch.setattr(blend, "component_counts", lambda index, n: counted.append(len(index)) or real_counts(index, n))
    cfg = DataConfig(data_path=["0.3", str(tmp_path / "a"), "0.7", str(tmp_path / "b")], split="100,0,0",
                     num_workers=0, data_cache_path=str(tmp_path / "cache"))
    train = build_train_valid_test_datasets(cfg, 4, [40, 0, 0], build_tokenizer("NullTokenizer", 999))[0]
    assert counted == [40]
    from_a = sum(int(train[i]["tokens"].min()) < 100 for i in range(len(train)))
    assert from_a == 12      # the counts passed on still check and index the same samples (0.3 x 40)
