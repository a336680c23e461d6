"""Checkpoint formats: Hugging Face folders (hf_format) and megatron-zaya's own checkpoints."""
