"""The balancing-bias updater across a checkpoint (its state_dict round trip) and on a layer that routes
nothing (every token skipped)."""
import torch

from megatron_zaya.optim.balancing import BalancingBiasUpdater


def _biases(layers=2, experts=4):
    biases = [torch.zeros(experts + 1) for _ in range(layers)]
    for b in biases:
        b[-1] = -1.0
    return biases


def test_a_resumed_updater_continues_exactly_as_an_uninterrupted_one():
    """Adam's moments AND its step count (bias correction) must survive the round trip: a resume that
    lost either would take a different step from the uninterrupted run."""
    gen = torch.Generator().manual_seed(0)
    counts = [torch.randint(0, 40, (2, 5), generator=gen) for _ in range(6)]
    whole_biases = _biases()
    whole = BalancingBiasUpdater(whole_biases, lr=1e-2)
    first_biases = _biases()
    first = BalancingBiasUpdater(first_biases, lr=1e-2)
    for c in counts[:3]:
        whole.update(c)
        first.update(c)
    saved = first.state_dict()
    assert saved["steps"] == 3
    first.update(counts[3])                     # the saved state is a copy, not a view of the live one
    assert not torch.equal(saved["exp_avg"], first.exp_avg)
    resumed_biases = [b.clone() for b in whole_biases]     # the biases travel with the model's weights
    resumed = BalancingBiasUpdater(resumed_biases, lr=1e-2)
    resumed.load_state_dict(saved)
    torch.testing.assert_close(resumed.exp_avg, whole.exp_avg, rtol=0, atol=0)
    torch.testing.assert_close(resumed.exp_avg_sq, whole.exp_avg_sq, rtol=0, atol=0)
    for c in counts[3:]:
        whole.update(c)
        resumed.update(c)
    for got, want in zip(resumed_biases, whole_biases):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_a_layer_that_routes_no_token_gets_a_finite_update():
    """All tokens skipped: no routed shares (each 0, the error -1/E everywhere), never 0/0; the mean-centred
    step is then zero and the biases stay as they were."""
    error = BalancingBiasUpdater.load_error(torch.tensor([[0, 0, 0, 0, 64], [8, 8, 0, 0, 0]]))
    torch.testing.assert_close(error, torch.tensor([[-0.25] * 4, [0.25, 0.25, -0.25, -0.25]], dtype=torch.float64))
    biases = _biases()
    updater = BalancingBiasUpdater(biases, lr=1e-2)
    updater.update(torch.tensor([[0, 0, 0, 0, 64], [8, 8, 0, 0, 0]]))
    assert all(torch.isfinite(b).all() for b in biases)
    assert biases[0].tolist() == [0.0, 0.0, 0.0, 0.0, -1.0]
    assert biases[1][0] < 0 and biases[1][2] > 0
