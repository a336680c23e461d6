"""How an evaluation's result is reported: Megatron-LM's TensorBoard tags and one console line.

A result (Trainer.evaluate) holds "validation loss" and "validation ppl" and, for each set of
--multiple-validation-sets, "validation loss NAME" and "validation ppl NAME".
"""

from __future__ import annotations

import math


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0))      # capped: an untrained model's loss must not overflow


def set_names(metrics: dict[str, float]) -> list[str]:
    """The named validation sets of a result, in order (none for a single set)."""
    return [key[len("validation loss "):] for key in metrics if key.startswith("validation loss ")]


def evaluation_scalars(metrics: dict[str, float], split: str = "validation") -> dict[str, float]:
    """'lm loss validation' and 'lm loss validation ppl' ('lm loss test ...' for split="test"), and
    'lm loss validation NAME' and 'lm loss validation NAME ppl' per named set."""
    scalars = {f"lm loss {split}": metrics["validation loss"], f"lm loss {split} ppl": metrics["validation ppl"]}
    for name in set_names(metrics):
        scalars[f"lm loss {split} {name}"] = metrics[f"validation loss {name}"]
        scalars[f"lm loss {split} {name} ppl"] = metrics[f"validation ppl {name}"]
    return scalars


def evaluation_line(metrics: dict[str, float]) -> str:
    """'loss L | ppl P', then 'NAME loss L' per named set (the loss above is then their mean)."""
    parts = [f"loss {metrics['validation loss']:.4f}", f"ppl {metrics['validation ppl']:.3f}"]
    parts += [f"{name} loss {metrics[f'validation loss {name}']:.4f}" for name in set_names(metrics)]
    return " | ".join(parts)
