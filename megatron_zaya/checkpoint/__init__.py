"""Checkpoint formats: Hugging Face folders (hf_format) and megatron-zaya's own checkpoints."""
from megatron_zaya.checkpoint.format import CheckpointError
from megatron_zaya.checkpoint.inspection import inspect_checkpoint, load_full_model_state

__all__ = ["CheckpointError", "inspect_checkpoint", "load_full_model_state"]
