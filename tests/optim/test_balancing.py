"""The balancing-bias update balances a router that training skews; without it the skew stays; a skip target
steers that share of the tokens to the skip class; and --no-moe-router-bias-update turns it off in a training
run."""
import pytest
import torch
from pydoc_data.topics import topics

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel
from megatron_zaya.optim.balancing import BalancingBiasUpdater
from megatron_zaya.optim.builder import OptimizerConfig, build_optimizer
from megatron_zaya.training.metrics import routing_statistics

TEXT = torch.tensor(list("\n\n".join(topics[k] for k in sorted(topics)).encode()[:200_000]))


def train_and_measure(update_biases: bool, steps: int = 80, skip_target: float | None = None) -> tuple[float, float]:
    """(normalised routing entropy of the worst layer, share of tokens skipped), means of the last 10 steps."""
    torch.manual_seed(0)
    model = ZayaModel(model_config_from_preset("zaya1-tiny", vocab_size=256, num_layers=2, seq_length=64))
    opt = build_optimizer(model, OptimizerConfig(optimizer="muon", lr=3e-3))
    balancer = BalancingBiasUpdater([b.moe.router.balancing_bias for b in model.layers], lr=3e-2,
                                    skip_target=skip_target)
    gen = torch.Generator().manual_seed(0)
    entropies, skipped = [], []
    for _ in range(steps):
        starts = torch.randint(0, len(TEXT) - 65, (8,), generator=gen)
        batch = torch.stack([TEXT[s: s + 65] for s in starts])
        out = model(batch[:, :-1], labels=batch[:, 1:])
        opt.zero_grad()
        out.token_losses.mean().backward()
        opt.step()
        counts = torch.stack([r.counts for r in out.routing])
        if update_biases:
            balancer.update(counts)
        entropies.append(min(routing_statistics(c)["routing_entropy"] for c in counts))
        skipped.append((counts[:, -1].sum() / counts.sum()).item())
    return sum(entropies[-10:]) / 10, sum(skipped[-10:]) / 10


def test_bias_update_balances_a_skewed_router():
    """Balanced, the skip class is never chosen: the skip bias stays at -1 against probabilities and the expert
    biases keep their mean, 0, so the best expert's p_e + b_e > 0 > p_skip - 1."""
    balanced, skipped = train_and_measure(update_biases=True)
    skewed, _ = train_and_measure(update_biases=False)
    assert balanced > 0.85, balanced      # observed 0.97
    assert skipped == 0.0
    assert skewed < 0.3, skewed           # observed 0.02: the router collapses onto one expert


def test_a_skip_target_steers_that_share_of_tokens_to_the_skip_class():
    """--moe-router-skip-target 0.25: the skip bias is balanced with the experts', so about a quarter of the
    tokens skip the experts (from none at -1) while the routed ones stay balanced."""
    balanced, skipped = train_and_measure(update_biases=True, steps=120, skip_target=0.25)
    assert abs(skipped - 0.25) < 0.06, skipped     # observed 0.28 (0.25 after 80 steps, while still balancing)
    assert balanced > 0.85, balanced                # observed 0.98


def test_load_error_ignores_skip_and_keeps_bias_mean():
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, -1.0])
    updater = BalancingBiasUpdater([bias], lr=0.1)
    updater.update(torch.tensor([[70, 10, 10, 10, 1000]]))
    assert bias[0] < 0 and (bias[1:4] > 0).all()           # overloaded expert pushed down, others up
    assert abs(bias[:4].sum().item()) < 1e-6 and bias[4] == -1.0
    error = BalancingBiasUpdater.load_error(torch.tensor([[70, 10, 10, 10, 1000]]))
    torch.testing.assert_close(error, torch.tensor([[0.45, -0.15, -0.15, -0.15]], dtype=torch.float64))


def test_a_skip_target_of_0_asks_the_skip_class_for_no_tokens():
    """--moe-router-skip-target 0 is in [0, 1): the skip class is balanced too, its target share 0 and each of
    the E experts' 1/E, over every token (not only the routed ones as without a skip target)."""
    counts = torch.tensor([[40, 20, 20, 0, 20]])          # 100 tokens, 20 skipped
    error = BalancingBiasUpdater.load_error(counts, skip_target=0.0)
    torch.testing.assert_close(error, torch.tensor([[0.15, -0.05, -0.05, -0.25, 0.2]], dtype=torch.float64))
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, -1.0])
    updater = BalancingBiasUpdater([bias], lr=0.1, skip_target=0.0)
    updater.update(counts)
    # First Adam step: lr * sign(error) (eps aside), the skip class's step (+lr, it is over its target) taken from
    # every expert's: the overloaded expert stays level with the skip class, the others rise against it.
    torch.testing.assert_close(bias, torch.tensor([0.0, 0.2, 0.2, 0.2, -1.0]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("skip_target", [None, 0.2, 0.0], ids=["experts", "skip-target", "skip-target-0"])
def test_bias_update_is_mean_centred_adam_on_the_load_error(skip_target):
    """Independent reference: torch.optim.Adam (float64, no weight decay, the updater's lr / betas / eps) fed
    each layer's load error p_e - 1/E over the routed experts as the gradient, its step then centred on the
    experts' mean; six steps of random counts (3 layers, 5 experts + skip) agree to 1e-6 and the skip
    biases stay at their init. Bias correction and the square root of Adam both matter here. With a skip target
    R the skip class is one more: shares over every token less (1 - R) / E per expert and R for the skip class,
    the skip class's step taken from every expert's instead (the skip bias stays at -1, as transformers loads
    it). A skip target of 0 (valid, [0, 1)) is a skip target too: every token's share counts and the skip
    class's target is 0."""
    torch.manual_seed(0)
    layers, experts = 3, 5
    biases = [torch.zeros(experts + 1) for _ in range(layers)]
    for b in biases:
        b[-1] = -1.0
    updater = BalancingBiasUpdater(biases, lr=1e-2, beta1=0.8, beta2=0.99, eps=1e-3,   # eps ~1% of the steps
                                   skip_target=skip_target)
    balanced = experts if skip_target is None else experts + 1
    ref = torch.zeros(layers, balanced, dtype=torch.float64, requires_grad=True)
    adam = torch.optim.Adam([ref], lr=1e-2, betas=(0.8, 0.99), eps=1e-3, foreach=False)
    want = torch.zeros(layers, balanced, dtype=torch.float64)
    for _ in range(6):
        counts = torch.randint(0, 50, (layers, experts + 1))
        updater.update(counts)
        if skip_target is None:
            routed = counts[:, :-1].double()
            ref.grad = routed / routed.sum(1, keepdim=True) - 1.0 / experts
        else:
            shares = counts.double() / counts.sum(1, keepdim=True)
            ref.grad = shares - torch.tensor([(1 - skip_target) / experts] * experts + [skip_target])
        old = ref.detach().clone()
        adam.step()
        delta = ref.detach() - old
        want += delta - (delta.mean(1, keepdim=True) if skip_target is None else delta[:, -1:])
    got = torch.stack([b[:experts] for b in biases]).double()
    assert (got - want[:, :experts]).abs().max() < 1e-6
    assert all(b[-1] == -1.0 for b in biases)


def test_no_moe_router_bias_update_leaves_the_biases_of_a_training_run_as_initialised(tmp_path, monkeypatch,
                                                                                      capsys):
    """Two steps of a tiny --mock-data run: the balancing biases move after each step by default, and with
    --no-moe-router-bias-update (Megatron-LM's flag) they stay as initialised; the --moe-router-bias-* flags
    reach the updater."""
    from megatron_zaya.arguments import parse_args
    from megatron_zaya.training import loop
    from megatron_zaya.training.setup import build_and_train

    monkeypatch.setenv("WORLD_SIZE", "1")
    real_step, moved, settings = loop.Trainer.train_step, [], []

    def recording_step(trainer, micro_batches):
        b = trainer.balancer
        settings.append((b.lr, b.beta1, b.beta2, b.eps, b.skip_target))
        before = [b.clone() for b in trainer.balancer.biases]
        result = real_step(trainer, micro_batches)
        moved.append(any(not torch.equal(a, b) for a, b in zip(before, trainer.balancer.biases)))
        return result

    monkeypatch.setattr(loop.Trainer, "train_step", recording_step)
    adam_flags = ["--moe-router-bias-lr", "0.02", "--moe-router-bias-beta1", "0.5", "--moe-router-bias-beta2", "0.9",
                  "--moe-router-bias-eps", "0.001", "--moe-router-skip-target", "0.1"]
    for flags, update in (([], True), (["--no-moe-router-bias-update"], False), (adam_flags, True)):
        run = parse_args(["--mock-data", "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "100",
                          "--preset", "zaya1-tiny", "--num-layers", "1", "--seq-length", "32",
                          "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "2",
                          "--eval-iters", "0", "--num-workers", "0", "--data-cache-path", str(tmp_path), *flags])
        assert run.train.moe_router_bias_update is update
        moved.clear()
        assert build_and_train(run) == 0
        assert moved == [update, update]
    assert settings[0] == (1e-2, 0.9, 0.999, 1e-8, None) and settings[-1] == (0.02, 0.5, 0.9, 1e-3, 0.1)
    with pytest.raises(SystemExit):
        parse_args(["--mock-data", "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "100", "--preset",
                    "zaya1-tiny", "--micro-batch-size", "2", "--train-iters", "2", "--data-cache-path", str(tmp_path),
                    "--no-moe-router-bias-update", "--moe-router-skip-target", "0.1"])
    assert "--moe-router-skip-target=0.1 needs the balancing-bias update" in capsys.readouterr().err
