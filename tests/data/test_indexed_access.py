"""IndexedDataset's sequence access beyond ds[i]: negative indices and slices (as a list does), token
counts of sequence ranges (the GPT split's tokens per epoch and the blend report read them), a token
run, and whole documents (several sequences, or none)."""

import numpy as np
import pytest

from megatron_zaya.data.indexed import IndexedDataset, IndexedDatasetWriter


@pytest.fixture(params=[True, False], ids=["mmap", "pread"])
def dataset(tmp_path, request):
    rng = np.random.default_rng(5)
    docs = [(rng.integers(0, 60000, 7), [3, 4]), (rng.integers(0, 60000, 5), None), (np.zeros(0, np.int64), []),
            (rng.integers(0, 60000, 9), [1, 0, 8]), (rng.integers(0, 60000, 2), None)]
    prefix = str(tmp_path / "d")
    with IndexedDatasetWriter(prefix, np.uint16) as w:
        for tokens, lengths in docs:
            w.add_document(tokens, lengths)
    sequences = []
    for tokens, lengths in docs:
        cuts = np.cumsum([0] + ([tokens.size] if lengths is None else list(lengths)))
        sequences += [tokens[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
    return IndexedDataset(prefix, mmap_bin=request.param), docs, sequences


def test_negative_indices_and_slices_read_as_a_list_does(dataset):
    ds, _, sequences = dataset
    assert len(ds) == len(sequences) == 7
    for i in range(-len(sequences), len(sequences)):
        np.testing.assert_array_equal(ds[i], sequences[i])
        np.testing.assert_array_equal(ds[np.int64(i)], sequences[i])
    for sl in (slice(None), slice(1, 5), slice(None, None, -2), slice(-3, None), slice(5, 2), slice(2, 100, 3)):
        got = ds[sl]
        assert len(got) == len(sequences[sl]), sl
        for a, b in zip(got, sequences[sl]):
            np.testing.assert_array_equal(a, b)
    for bad in (len(sequences), -len(sequences) - 1):
        with pytest.raises(IndexError, match="out of range"):
            ds[bad]
    with pytest.raises(TypeError, match="unsupported index type"):
        ds[1.0]


def test_part_of_a_sequence_stays_inside_it(dataset):
    """get(i, offset, length) reads within sequence i; a slice past its end (which would read the next
    sequence's tokens, or past the .bin) or a negative offset or length is an IndexError."""
    ds, _, sequences = dataset
    np.testing.assert_array_equal(ds.get(1, 1, 3), sequences[1][1:4])
    np.testing.assert_array_equal(ds.get(1, 2), sequences[1][2:])
    assert ds.get(0, 3, 0).size == 0                     # the empty slice at the end
    for bad in ((0, 2, 2), (0, 4, 0), (6, 1, 2), (0, -1, 1), (0, 1, -1)):
        with pytest.raises(IndexError, match="outside sequence"):
            ds.get(*bad)


def test_token_counts_runs_and_documents(dataset):
    ds, docs, sequences = dataset
    n = len(sequences)
    for first in range(n + 1):
        for stop in range(first, n + 1):
            assert ds.tokens_in(first, stop) == sum(s.size for s in sequences[first:stop]), (first, stop)
    for bad in ((-1, 2), (3, 2), (0, n + 1)):
        with pytest.raises(IndexError, match="outside"):
            ds.tokens_in(*bad)
    flat = np.concatenate(sequences)
    assert ds.num_tokens == flat.size
    for start, count in ((0, flat.size), (3, 9), (flat.size, 0), (5, 0)):
        np.testing.assert_array_equal(ds.tokens(start, count), flat[start:start + count])
        assert ds.tokens(start, count).dtype == np.uint16
    for bad in ((-1, 1), (0, flat.size + 1), (2, -1)):
        with pytest.raises(IndexError, match="outside"):
            ds.tokens(*bad)
    assert ds.num_documents == len(docs)
    for d, (tokens, _) in enumerate(docs):
        got = ds.document(d)
        np.testing.assert_array_equal(got, tokens)
        assert got.dtype == np.uint16
