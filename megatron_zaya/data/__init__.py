"""Data pipeline: tokenizers, Megatron-compatible indexed datasets, GPT samples, blends, samplers.

See docs/DATA.md. Main entry points:
`build_tokenizer`, `IndexedDataset`/`IndexedDatasetWriter`, `DataConfig`,
`build_train_valid_test_datasets`, `build_train_valid_test_loaders`.
"""

from .config import DataConfig, PhaseBlend
from .indexed import IndexedDataset, IndexedDatasetError, IndexedDatasetWriter
from .loaders import build_train_valid_test_datasets, build_train_valid_test_loaders, megatron_num_samples
from .sampler import PretrainingBatchSampler
from .tokenizer import build_tokenizer

__all__ = [
    "DataConfig",
    "PhaseBlend",
    "IndexedDataset",
    "IndexedDatasetError",
    "IndexedDatasetWriter",
    "PretrainingBatchSampler",
    "build_tokenizer",
    "build_train_valid_test_datasets",
    "build_train_valid_test_loaders",
    "megatron_num_samples",
]
