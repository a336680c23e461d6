"""Inference: the CCA KV/conv/value-shift cache, prefill + decode, sampling, checkpoint loading.
See docs/INFERENCE.md."""
from megatron_zaya.inference.cache import InferenceCache, LayerCache  # noqa: F401
from megatron_zaya.inference.decode import (  # noqa: F401
    GenerationOutput, forward_with_cache, generate, prefill)
from megatron_zaya.inference.sampling import SamplingParams, make_generator, sample_next_token  # noqa: F401
