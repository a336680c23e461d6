"""`DataConfig`: everything the data pipeline needs, with Megatron-LM's names.

    DataConfig(
        data_path=["30", "data/web_text_document", "70", "data/code_text_document"],  # --data-path
        split="969,30,1",                    # --split (train, valid, test shares of each dataset)
        data_cache_path="cache/",            # --data-cache-path (default: <data dir>/cache/GPTDataset_indices)
        seed=1234,                           # --seed (document and sample shuffles)
        num_workers=2,                       # --num-workers (DataLoader workers per rank)
        reset_position_ids=False,            # --reset-position-ids
        reset_attention_mask=False,          # --reset-attention-mask
        eod_mask_loss=False,                 # --eod-mask-loss
        tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model="data/tok.model",
        phases=[PhaseBlend(["data/web_text_document"], train_samples=1000),
                PhaseBlend(["50", "data/web_text_document", "50", "data/code_text_document"])],
    )

`phases` (optional) replaces `data_path` for TRAINING with a curriculum: phase p uses its own blend
for its `train_samples` samples (None on the last phase: all remaining samples). Validation and
test always use `data_path` (default: the first phase's blend).

`mock_data` replaces all of them with random tokens (no files).

Instead of one blend cut by `split`, each split may have its own (Megatron-LM's --train-data-path,
--valid-data-path, --test-data-path): every document of those datasets belongs to that split, and a
split without a blend has no dataset. They exclude `data_path`.

`multiple_validation_sets` and `full_validation` (Megatron-LM's flags) shape the validation sets:
see data/validation.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from megatron_zaya.errors import UserInputError

from .blend import parse_data_path


@dataclass
class PhaseBlend:
    data_path: list[str]
    train_samples: int | None = None

    def __post_init__(self):
        if isinstance(self.data_path, str):
            self.data_path = self.data_path.split()
        if self.train_samples is not None and self.train_samples < 0:
            raise ValueError(f"phase train_samples must be >= 0, got {self.train_samples}")


@dataclass
class DataConfig:
    data_path: list[str] = field(default_factory=list)
    split: str = "969,30,1"
    data_cache_path: str | None = None
    seed: int = 1234
    num_workers: int = 2
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    tokenizer_type: str | None = None
    tokenizer_model: str | None = None
    vocab_file: str | None = None        # GPT2BPETokenizer's --vocab-file
    merge_file: str | None = None        # GPT2BPETokenizer's --merge-file
    tiktoken_pattern: str | None = None             # TikTokenizer's settings (data/tokenizer_tiktoken.py)
    tiktoken_num_special_tokens: int | None = None
    tokenizer_special_tokens: list[str] | None = None
    tokenizer_vocab_size: int | None = None         # TikTokenizer's size (Megatron's --vocab-size for it)
    phases: list[PhaseBlend] = field(default_factory=list)
    mid_level_dataset_surplus: float = 0.005
    prefetch_factor: int = 4
    pin_memory: bool = True          # only used when CUDA/ROCm is available
    no_index_cache: bool = False     # build indices in memory on every rank instead of caching
    train_data_path: list[str] = field(default_factory=list)   # per-split blends (exclude data_path)
    valid_data_path: list[str] = field(default_factory=list)
    test_data_path: list[str] = field(default_factory=list)
    mock_data: bool = False          # --mock-data: random tokens, no files (megatron_zaya/data/mock.py)
    mmap_bin_files: bool = True      # False (--no-mmap-bin-files): read .bin files with positional reads
    multiple_validation_sets: bool = False   # one validation set per dataset of the validation split
    full_validation: bool = False            # each validation set read whole, once (data/validation.py)

    def tokenizer_kwargs(self) -> dict:
        """build_tokenizer's keyword arguments beyond type and model: GPT-2's two files, and
        TikTokenizer's settings where given."""
        from .tokenizer import tiktoken_options
        return dict(vocab_file=self.vocab_file, merge_file=self.merge_file, **tiktoken_options(self))

    @property
    def separate_splits(self) -> bool:
        return bool(self.train_data_path or self.valid_data_path or self.test_data_path)

    def split_blends(self) -> tuple[list[str], list[str], list[str]]:
        """(train, valid, test) blends; an empty one has no dataset."""
        if self.separate_splits:
            return self.train_data_path, self.valid_data_path, self.test_data_path
        return self.data_path, self.data_path, self.data_path

    def __post_init__(self):
        for name in ("data_path", "train_data_path", "valid_data_path", "test_data_path"):
            value = getattr(self, name)
            setattr(self, name, value.split() if isinstance(value, str) else list(value or []))
        self.phases = [p if isinstance(p, PhaseBlend) else PhaseBlend(**p) for p in (self.phases or [])]
        if self.mock_data:
            if self.data_path or self.separate_splits or self.phases:
                raise ValueError("--mock-data and --data-path (or the per-split paths, or phases) exclude each other")
        elif self.separate_splits:
            if self.data_path:
                raise ValueError("--data-path and --train-data-path / --valid-data-path / --test-data-path exclude "
                                 "each other (one blend cut by --split, or one blend per split)")
            if not self.train_data_path and not self.phases:
                raise ValueError("--train-data-path is required with --valid-data-path / --test-data-path")
        else:
            if not self.data_path and self.phases:
                self.data_path = list(self.phases[0].data_path)
            if not self.data_path:
                raise ValueError("--data-path is required (or phases with their own data_path)")
        for p in self.phases[:-1]:
            if p.train_samples is None:
                raise ValueError("every phase but the last needs train_samples")
        if self.mock_data and (self.multiple_validation_sets or self.full_validation):
            raise UserInputError("--multiple-validation-sets and --full-validation need datasets, not --mock-data")
        if self.multiple_validation_sets and self.valid_data_path and \
                parse_data_path(self.valid_data_path, "--valid-data-path")[0] is not None:
            raise UserInputError(f"--multiple-validation-sets: --valid-data-path {' '.join(self.valid_data_path)} has "
                             f"weights, but each dataset is evaluated on its own; list the datasets without weights")
        if self.num_workers < 0:
            raise ValueError(f"--num-workers must be >= 0, got {self.num_workers}")
