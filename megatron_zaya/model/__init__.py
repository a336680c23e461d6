"""The ZAYA1 model: math only, single device. Parallelism is applied from outside (megatron_zaya.parallel)."""
from megatron_zaya.model.zaya import ZayaModel, ModelOutput  # noqa: F401
