"""Muon's checks at their bounds and its TP gather chunking (a pure function: hand-computed ranges)."""
import math

import pytest
import torch

from megatron_zaya.optim.muon import Muon, MuonScale, _chunks


@pytest.mark.parametrize("extra", [0.0, -0.2, math.inf, math.nan])
def test_a_scale_factor_that_is_not_a_finite_positive_number_is_refused(extra):
    with pytest.raises(ValueError, match="--muon-extra-scale-factor"):
        MuonScale("spectral", extra)
    assert MuonScale("spectral", 1e-6)(torch.Size((4, 9))) == pytest.approx(3e-6)    # tiny but positive: fine


def test_muon_refuses_vectors_and_scalars():
    for shape in ((8,), ()):
        with pytest.raises(ValueError, match="Muon takes matrices"):
            Muon([torch.nn.Parameter(torch.randn(shape))])
    Muon([torch.nn.Parameter(torch.randn(2, 3)), torch.nn.Parameter(torch.randn(4, 2, 3))])


@pytest.mark.parametrize("sizes, limit, want", [
    ([], 7, []),                                      # nothing to gather: no chunk at all
    ([3, 4, 5, 2], 7, [(0, 2), (2, 4)]),              # a chunk may fill the limit exactly
    ([10, 1], 7, [(0, 1), (1, 2)]),                   # an item over the limit goes alone, never after an empty chunk
    ([1, 10, 1], 7, [(0, 1), (1, 2), (2, 3)]),
    ([2, 2, 2], 100, [(0, 3)]),
])
def test_tp_gather_chunks_are_consecutive_and_within_the_limit(sizes, limit, want):
    assert _chunks(sizes, limit) == want
