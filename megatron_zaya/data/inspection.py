"""What a Megatron `.bin/.idx` dataset holds, behind tools/inspect_dataset.py.

`dataset_report(prefix, tokenizer)` opens the pair (IndexedDataset checks the header, the document index,
the pointers and the .bin size), reads the tokenizer record beside it (dataset_tokenizer.py) and, from the
index alone, the counts and the spread of document lengths. With a tokenizer it also reads tokens: the
id range and how many documents end with EOD, over the first `sample_tokens` tokens and `sample_documents`
documents, or over all of them with `scan` (in chunks, `progress(done, total)` after each); and it decodes
the first `show_documents` documents.
"""
from __future__ import annotations

import os

import numpy as np

from megatron_zaya.data.dataset_tokenizer import describe, read_record, record_path
from megatron_zaya.data.indexed import IndexedDataset, bin_path, idx_path

CHUNK_TOKENS = 1 << 26


def document_lengths(data: IndexedDataset) -> np.ndarray:
    """Tokens per document (documents of several sequences summed)."""
    docs = data.document_indices
    if data.num_documents == len(data) and np.array_equal(docs, np.arange(len(data) + 1)):
        return data.sequence_lengths
    ends = np.concatenate(([0], np.cumsum(data.sequence_lengths, dtype=np.int64)))
    return ends[docs[1:]] - ends[docs[:-1]]


def _spread(lengths: np.ndarray) -> dict:
    if lengths.size == 0:
        return {}
    return {"min": int(lengths.min()), "median": float(np.median(lengths)), "mean": float(lengths.mean()),
            "max": int(lengths.max())}


def _token_view(data: IndexedDataset) -> np.ndarray:
    return np.memmap(bin_path(data.path_prefix), dtype=data.dtype, mode="r") if data.num_tokens else np.zeros(
        0, data.dtype)


def scan_ids(tokens: np.ndarray, limit: int, vocab_size: int, progress=None) -> dict:
    """Smallest and largest id of tokens[:limit] and how many lie at or past vocab_size, read in chunks."""
    low, high, outside = None, None, 0
    for start in range(0, limit, CHUNK_TOKENS):
        chunk = np.asarray(tokens[start:min(limit, start + CHUNK_TOKENS)])
        low = int(chunk.min()) if low is None else min(low, int(chunk.min()))
        high = int(chunk.max()) if high is None else max(high, int(chunk.max()))
        outside += int(np.count_nonzero(chunk >= vocab_size))
        if progress is not None:
            progress(min(limit, start + CHUNK_TOKENS), limit)
    return {"tokens_read": limit, "min_id": low, "max_id": high, "ids_outside_vocabulary": outside}


def eod_endings(tokens: np.ndarray, lengths: np.ndarray, count: int, eod: int) -> dict:
    """How many of the first `count` documents end with the EOD id (empty documents do not)."""
    ends = np.cumsum(lengths[:count], dtype=np.int64) - 1
    kept = ends[np.asarray(lengths[:count]) > 0]
    hits = sum(int(np.count_nonzero(np.asarray(tokens[kept[i:i + (1 << 20)]]) == eod))
               for i in range(0, kept.size, 1 << 20))
    return {"documents_read": count, "ending_with_eod": hits, "eod": eod}


def dataset_report(prefix: str, tokenizer=None, show_documents: int = 2, max_chars: int = 600,
                   sample_tokens: int = 1 << 20, sample_documents: int = 1000, scan: bool = False,
                   progress=None) -> dict:
    """The report tools/inspect_dataset.py prints (see the module docstring); IndexedDatasetError or
    UserInputError (naming the file) for a damaged pair or tokenizer record."""
    data = IndexedDataset(prefix)
    lengths = document_lengths(data)
    record = read_record(data.path_prefix)
    report = {
        "prefix": data.path_prefix, "bin_bytes": os.path.getsize(bin_path(data.path_prefix)),
        "idx_bytes": os.path.getsize(idx_path(data.path_prefix)), "dtype": data.dtype.name,
        "sequences": len(data), "documents": data.num_documents, "tokens": data.num_tokens,
        "document_tokens": _spread(lengths), "empty_documents": int(np.count_nonzero(lengths == 0)),
        "tokenizer_record": None if record is None else {"file": record_path(data.path_prefix),
                                                          "flags": describe(record), **record},
    }
    if tokenizer is None:
        return report
    tokens = _token_view(data)
    read = data.num_tokens if scan else min(data.num_tokens, sample_tokens)
    report["ids"] = {**scan_ids(tokens, read, tokenizer.vocab_size, progress), "vocab_size": tokenizer.vocab_size}
    report["eod_endings"] = eod_endings(tokens, lengths, data.num_documents if scan else min(
        data.num_documents, sample_documents), tokenizer.eod)
    report["documents_shown"] = []
    for doc in range(min(show_documents, data.num_documents)):
        ids = data.document(doc)
        shown = ids[:4 * max_chars].tolist()                       # enough tokens for max_chars characters
        try:
            text = tokenizer.decode(shown)
        except Exception:   # (ids outside the vocabulary, the "ids" line's finding: not decodable as a whole)
            text = " ".join(f"<id {t}>" if not 0 <= t < tokenizer.vocab_size else tokenizer.decode([t]) for t in shown)
        report["documents_shown"].append({"document": doc, "tokens": int(ids.size), "text": text[:max_chars],
                                          "cut": len(text) > max_chars or ids.size > 4 * max_chars})
    return report
