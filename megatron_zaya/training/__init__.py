"""The training loop, its configuration, metrics (FLOPs/MFU, routing statistics) and logging."""
