"""megatron-zaya: Megatron-style pretraining of ZAYA1-style Mixture-of-Experts language models."""

__version__ = "0.1.0"
