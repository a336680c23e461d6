"""An optimizer that counts its steps in param_groups (apex FusedAdam does: group["step"], no
per-parameter step) resumes with its count, so Adam's bias correction continues where it stopped:
the resumed losses equal the uninterrupted run's, bit for bit (one process, fp32)."""
import math

import torch

from ckpt_reshard_worker import SAVE_AT, TOTAL, Runtime, Setup, checkpointer
from megatron_zaya.optim.builder import OptimizerSet


class FusedAdam(torch.optim.Optimizer):
    """AdamW with apex FusedAdam's bookkeeping: the step count lives in each param group."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            beta1, beta2 = group["betas"]
            correction1, correction2 = 1 - beta1 ** group["step"], 1 - beta2 ** group["step"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                state["exp_avg"].mul_(beta1).add_(p.grad, alpha=1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                denom = (state["exp_avg_sq"] / correction2).sqrt_().add_(group["eps"])
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.addcdiv_(state["exp_avg"], denom, value=-group["lr"] / correction1)


def _setup():
    s = Setup("single", 1)
    s.optimizer = OptimizerSet({"adamw": FusedAdam(s.model.parameters(), lr=1e-3)})
    return s


def test_group_step_count_is_restored(tmp_path):
    runtime = Runtime(1)
    first = _setup()
    saver = checkpointer(str(tmp_path / "ckpt"), runtime, "single", load=False)
    for step in range(SAVE_AT):
        first.step(step)
    saver.save(first)
    saver.close()
    straight = [first.step(step) for step in range(SAVE_AT, TOTAL)]

    resumed = _setup()
    loader = checkpointer(str(tmp_path / "ckpt"), runtime, "single", load=True)
    loader.load(resumed)
    loader.close()
    assert resumed.optimizer.optimizers["adamw"].param_groups[0]["step"] == SAVE_AT
    again = [resumed.step(step) for step in range(SAVE_AT, TOTAL)]
    assert all(math.isfinite(x) for x in again)
    assert again == straight, (again, straight)
