"""Small units of the blend arithmetic (data/blend.py, data/loaders.py) against hand-computed values:
an unweighted list's shares by length, a blend's own dataset order, weights that do not sum to 1, a phase
of no samples, and weights that sum to zero.

    python -m pytest -q tests/data/test_blend_weights_units.py
"""
import numpy as np
import pytest

from megatron_zaya.data import blend
from megatron_zaya.data.loaders import blend_order, blend_weights
from megatron_zaya.errors import UserInputError


def test_an_unweighted_list_is_weighted_by_its_datasets_lengths():
    lengths = {"a": 30, "b": 10, "c": 0}.get
    assert blend_weights(["a", "b"], ["a", "b", "c"], lengths) == [30, 10, 0]
    assert blend_weights(["c", "a", "b"], ["a", "b", "c"], lengths) == [30, 10, 0]
    assert blend_weights(["b"], ["a", "b"]) == [0.0, 1.0]        # one path: no lengths needed
    assert blend_weights(["30", "b", "10", "a"], ["a", "b"]) == [0.25, 0.75]
    assert blend_weights(["c", "c"], ["c"], lengths) == [0]


def test_an_unweighted_blend_asks_each_dataset_for_what_the_interleave_takes():
    # Lengths 3 and 5 over 8 samples: one epoch of each (Megatron-LM's blend of that list), no surplus; over
    # 12 samples ceil(12 * 3 / 8) = 5 and ceil(12 * 5 / 8) = 8, and the interleave takes 5 and 7.
    plan = blend.plan_phases([[3.0, 5.0]], [8], weighted=[False])
    assert plan.requests == [3, 5]
    assert np.bincount(np.asarray(plan.dataset_index[0]), minlength=2).tolist() == [3, 5]
    plan = blend.plan_phases([[3.0, 5.0]], [12], weighted=[False])
    assert plan.requests == [5, 8]
    assert np.bincount(np.asarray(plan.dataset_index[0]), minlength=2).tolist() == [5, 7]


def test_a_blend_order_is_the_order_it_names_its_datasets():
    assert blend_order(["1", "c", "1", "a", "1", "c"], ["a", "b", "c"]) == [2, 0]
    assert blend_order(["b", "a"], ["a", "b"]) == [1, 0]


def test_weights_that_do_not_sum_to_one_are_normalised_first():
    # [1, 3] is [0.25, 0.75]: requests ceil(ceil(8 * w) * 1.005) = ceil(2 * 1.005) = 3 and ceil(6 * 1.005) = 7.
    plan = blend.plan_phases([[1.0, 3.0]], [8])
    assert plan.requests == [3, 7]
    assert np.bincount(np.asarray(plan.dataset_index[0]), minlength=2).tolist() == [2, 6]


def test_a_phase_of_no_samples_from_one_dataset_uses_nothing():
    empty = np.broadcast_to(np.int16(1), (0,))
    assert blend.component_counts(empty, 3).tolist() == [0, 0, 0]
    plan = blend.plan_phases([[1.0, 0.0], [0.0, 1.0]], [5, 0], weighted=[False, False])
    assert plan.requests == [5, 0] and plan.offsets == [[0, 0], [5, 0]]
    assert len(blend.BlendedDataset([list(range(5)), []], plan.dataset_index[1], plan.dataset_sample_index[1],
                                    plan.offsets[1])) == 0


def test_weights_summing_to_zero_are_refused():
    with pytest.raises(UserInputError, match="positive sum"):
        blend.normalize([0.0, 0.0])
    assert blend.normalize([2.0, 6.0]) == [0.25, 0.75]


def test_a_dataset_in_several_phases_is_asked_for_every_phases_samples():
    # Unweighted one-dataset phases of 5 and 3 samples: 8 samples, the second phase from offset 5.
    plan = blend.plan_phases([[1.0, 0.0], [1.0, 0.0]], [5, 3], weighted=[False, False])
    assert plan.requests == [8, 0] and plan.offsets == [[0, 0], [5, 0]]
    # Two 50/50 phases of 10: phase 1 uses 5 of each and asks ceil(5 * 1.005) = 6; phase 2 starts at 5
    # and asks 6 more: 11.
    plan = blend.plan_phases([[0.5, 0.5], [0.5, 0.5]], [10, 10])
    assert plan.requests == [11, 11] and plan.offsets == [[0, 0], [5, 5]]
