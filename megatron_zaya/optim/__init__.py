"""Optimizers: Muon + AdamW (builder.py), LR schedules, router balancing biases, ZeRO-1 (distributed.py)."""
