"""Inference: the CCA KV/conv/value-shift cache, prefill + decode, sampling, checkpoint loading.
See docs/INFERENCE.md.

The names below load their modules (and torch) when first used: tools/text_generation_cli.py imports
inference.request_fields alone and starts without torch."""
import importlib

_HOMES = {"InferenceCache": "cache", "LayerCache": "cache", "GenerationOutput": "decode",
          "forward_with_cache": "decode", "generate": "decode", "prefill": "decode", "SamplingParams": "sampling",
          "make_generator": "sampling", "sample_next_token": "sampling"}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
