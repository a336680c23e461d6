"""GPT pretraining samples with Megatron-LM's semantics over one indexed dataset split.

Each sample is seq_length + 1 consecutive tokens of the shuffled document stream (documents packed
and crossing sample boundaries; consecutive samples share one token); `tokens = text[:-1]`,
`labels = text[1:]`. The document, sample and shuffle indices are built once (see
index_builders.py) and cached as .npy files under the cache directory. See docs/DATA.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from megatron_zaya.errors import UserInputError
from megatron_zaya.paths import default_cache_dir

from . import index_builders as ib
from .cache import cached_arrays
from .index_check import lengths_digest
from .indexed import IndexedDataset


@dataclass
class SampleOptions:
    seq_length: int
    eod: int
    pad: int | None = None
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    vocab_size: int | None = None       # token ids must be below it (the tokenizer's vocabulary), if given


def loss_masked_pad(tokenizer) -> int | None:
    """The pad id whose labels get no loss (gpt_sample), as Megatron-LM's datasets decide it: none when the
    tokenizer has none (a Hugging Face tokenizer: none declared), or when its pad is also its EOD, BOS or UNK
    token (a tokenizer declaring <s> as pad would have every document's BOS read as id 0, never predicted)."""
    pad = tokenizer.pad
    if pad is None or pad < 0 or not getattr(tokenizer, "pad_declared", True):   # (a Hugging Face pad guessed
        return None                                                                # from its name: not one)
    return None if pad in {tokenizer.eod, tokenizer.bos, getattr(tokenizer, "unk", None)} else pad


def dataset_fingerprint(indexed: IndexedDataset) -> dict:
    """What identifies the data an index cache entry was built from: the .idx/.bin sizes, the .idx
    mtime and a hash of the sequence lengths and document boundaries (a re-tokenized corpus with
    the same number of documents must not reuse stale indices; index_check.lengths_digest, computed once
    per opened dataset or taken from its check's record)."""
    st = os.stat(indexed.path_prefix + ".idx")
    return {
        "idx_bytes": st.st_size,
        "idx_mtime_ns": st.st_mtime_ns,
        "bin_bytes": os.path.getsize(indexed.path_prefix + ".bin"),
        "lengths_blake2b": lengths_digest(indexed),
    }


def token_id_outside(tokens: np.ndarray, vocab_size: int) -> int | None:
    """A token id of `tokens` outside [0, vocab_size), or None."""
    if not tokens.size:
        return None
    low, high = int(tokens.min()), int(tokens.max())
    return high if high >= vocab_size else low if low < 0 else None


def gpt_sample(text: np.ndarray, opts: SampleOptions) -> dict[str, np.ndarray]:
    """The training sample of seq_length + 1 token ids: inputs, shifted labels, masks and positions."""
    tokens, labels = text[:-1], text[1:]
    loss_mask, position_ids, document_ids = ltor_masks_and_position_ids(tokens, opts)
    if opts.pad is not None and opts.pad >= 0 and opts.pad != opts.eod and (text == opts.pad).any():
        # as Megatron-LM's GPTDataset: no loss where the label is the pad token, and pad ids read as id 0
        # (opts.pad: loss_masked_pad, none when it is also the EOD, BOS or UNK token)
        loss_mask[labels == opts.pad] = 0.0
        tokens, labels = np.where(tokens == opts.pad, 0, tokens), np.where(labels == opts.pad, 0, labels)
    sample = {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids}
    if document_ids is not None:
        sample["document_ids"] = document_ids
    return sample


def ltor_masks_and_position_ids(tokens: np.ndarray, opts: SampleOptions):
    """Loss mask, position ids and (with reset_attention_mask) document ids for one sample.

    With reset_position_ids, positions restart after every EOD; with reset_attention_mask, tokens
    after an EOD cannot attend to tokens up to it, as in Megatron. Instead of Megatron's (1, S, S)
    mask the sample carries that rule's compact form: document ids (S,) int64, the number of EODs
    before each position (the model's PackedDocuments builds the mask from them, model/documents.py).
    With eod_mask_loss, positions whose INPUT token is EOD get no loss.
    """
    s = tokens.shape[0]
    loss_mask = np.ones(s, dtype=np.float32)
    if opts.eod_mask_loss:
        loss_mask[tokens == opts.eod] = 0.0
    position_ids = np.arange(s, dtype=np.int64)
    document_ids = None
    if opts.reset_attention_mask:
        document_ids = np.concatenate(([0], np.cumsum(tokens[:-1] == opts.eod))).astype(np.int64)
    if opts.reset_position_ids:
        prev = 0
        for i in np.nonzero(tokens == opts.eod)[0]:
            position_ids[i + 1:] -= i + 1 - prev
            prev = i + 1
    return loss_mask, position_ids, document_ids


def tokens_in_split(indexed: IndexedDataset, ids) -> int:
    """The tokens of the sequences `ids` (a range or an array) of `indexed`: one epoch of a split."""
    if isinstance(ids, range):
        return indexed.tokens_in(ids.start, ids.stop)
    return int(np.asarray(indexed.sequence_lengths, dtype=np.int64)[ids].sum())


def index_shape(indexed: IndexedDataset, ids, num_samples: int, seq_length: int, add_extra_token: int = 1):
    """(epochs, separate final epoch) of the GPTDataset index for `num_samples`: its arrays depend on the
    number of samples only through these two, so two sizes of the same shape build the same index."""
    tokens = tokens_in_split(indexed, ids)
    epochs = ib.num_epochs(tokens, seq_length, num_samples, add_extra_token)
    return epochs, ib.separate_final_epoch(epochs, tokens, seq_length, num_samples, add_extra_token)[0]


def kept_request(indexed: IndexedDataset, ids, request: int, keep: int | None, seq_length: int) -> int:
    """The samples to build a dataset's index for, when `request` are needed and the run's earlier data phases
    read it through an index built for `keep` (training/data_phase.py): `keep` where that index holds the samples
    in another shape, so that the samples after the earlier phases' offset are still the unseen ones; else
    `request` (the same shape: the same order; or more epochs than `keep`'s index has: shuffled anew, as
    Megatron-LM shuffles a dataset built for more samples)."""
    if not keep or keep == request:
        return request
    was, now = index_shape(indexed, ids, keep, seq_length), index_shape(indexed, ids, request, seq_length)
    return keep if was != now and now[0] <= was[0] else request


class GPTDataset:
    """Samples of one split (`indices`: the sequence ids it owns, a range or an array) of an indexed dataset."""

    def __init__(self, indexed: IndexedDataset, indices: range | np.ndarray, num_samples: int | None,
                 opts: SampleOptions, seed: int, split_name: str = "train", cache_dir: str | None = None,
                 use_cache: bool = True, add_extra_token: int = 1):
        self.indexed = indexed
        self.indices = indices if isinstance(indices, range) else np.asarray(indices, dtype=ib.sequence_id_dtype(len(indexed)))
        self.opts = opts
        self.seed = seed
        self.split_name = split_name
        self.add_extra_token = add_extra_token
        if len(self.indices) == 0:
            raise ValueError(f"{indexed.path_prefix}: the {split_name} split is empty (check --split)")
        self.requested = num_samples
        self.description = {
            "class": "GPTDataset",
            "path_prefix": os.path.abspath(indexed.path_prefix),
            **dataset_fingerprint(indexed),
            "split": split_name,
            "indices": [int(self.indices[0]), int(self.indices[-1]) + 1, int(len(self.indices))],
            "num_samples": num_samples,
            "seq_length": opts.seq_length,
            "seed": seed,
            "add_extra_token": add_extra_token,
        }
        if cache_dir is None and use_cache:
            cache_dir = default_cache_dir(indexed.path_prefix)
        self.cache_dir = cache_dir if use_cache else None
        try:
            arrays = cached_arrays(self.cache_dir, f"GPTDataset-{split_name}", self.description,
                                   ["document_index", "sample_index", "shuffle_index"], self._build)
        except UserInputError as err:      # e.g. a split too short for one sample: name the dataset
            raise UserInputError(f"{indexed.path_prefix} ({split_name} split): {err}") from None
        self.document_index = arrays["document_index"]
        self.sample_index = arrays["sample_index"]
        self.shuffle_index = arrays["shuffle_index"]

    def _build(self) -> dict[str, np.ndarray]:
        sizes, ids = self.indexed.sequence_lengths, self.indices
        seq = self.opts.seq_length
        tokens_per_epoch = tokens_in_split(self.indexed, ids)
        if isinstance(ids, range):
            ids = np.arange(ids.start, ids.stop, dtype=ib.sequence_id_dtype(ids.stop))
        epochs = ib.num_epochs(tokens_per_epoch, seq, self.requested, self.add_extra_token)
        separate, before = ib.separate_final_epoch(epochs, tokens_per_epoch, seq, self.requested, self.add_extra_token)
        ib.check_build_memory(len(ids), epochs, tokens_per_epoch, self.requested, seq)
        rng = np.random.RandomState(self.seed)
        document_index = ib.build_document_index(ids, epochs, rng, separate)
        sample_index = ib.build_sample_index(sizes, document_index, seq, epochs, tokens_per_epoch, self.add_extra_token)
        total = sample_index.shape[0] - 1
        shuffle_index = ib.build_shuffle_index(before if separate else total, total, rng)
        return {"document_index": document_index, "sample_index": sample_index, "shuffle_index": shuffle_index}

    def __len__(self) -> int:
        return int(self.sample_index.shape[0]) - 1

    def text(self, idx: int) -> np.ndarray:
        """The seq_length + 1 token ids of sample `idx` (after the shuffle)."""
        i = int(self.shuffle_index[idx])
        beg_doc, beg_off = (int(x) for x in self.sample_index[i])
        end_doc, end_off = (int(x) for x in self.sample_index[i + 1])
        get = self.indexed.get
        extra = self.add_extra_token
        if beg_doc == end_doc:
            return np.asarray(get(int(self.document_index[beg_doc]), beg_off, end_off - beg_off + extra), dtype=np.int64)
        parts = [get(int(self.document_index[beg_doc]), beg_off)]
        for d in range(beg_doc + 1, end_doc):
            parts.append(get(int(self.document_index[d])))
        parts.append(get(int(self.document_index[end_doc]), 0, end_off + extra))
        return np.concatenate(parts).astype(np.int64)

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        text = self.text(idx)
        limit = self.opts.vocab_size
        bad = None if limit is None else token_id_outside(text, limit)
        if bad is not None:   # what an embedding lookup would fail on (on a GPU: a device-side assert, no index named)
            raise UserInputError(f"{self.indexed.path_prefix}: sample {idx} holds token id {bad}, outside the "
                                 f"tokenizer's vocabulary of {limit} (was the dataset preprocessed with another "
                                 f"tokenizer?)")
        return gpt_sample(text, self.opts)

    # Memory maps must not be pickled by value into loader workers: reopen them instead.
    def __getstate__(self):
        state = dict(self.__dict__)
        if self.cache_dir is not None:
            for k in ("document_index", "sample_index", "shuffle_index"):
                state[k] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if self.cache_dir is not None and self.document_index is None:
            arrays = cached_arrays(self.cache_dir, f"GPTDataset-{self.split_name}", self.description,
                                   ["document_index", "sample_index", "shuffle_index"], self._build)
            self.document_index = arrays["document_index"]
            self.sample_index = arrays["sample_index"]
            self.shuffle_index = arrays["shuffle_index"]


def split_indices(indexed: IndexedDataset, split: str) -> list[range | None]:
    """Sequence ids of the train/valid/test splits of `indexed` for `--split`: ranges, which take no
    memory (an array of a corpus of billions of sequences would take GBs on every rank)."""
    ranges = ib.split_ranges(ib.parse_split(split), len(indexed))
    return [None if r is None else range(r[0], r[1]) for r in ranges]
