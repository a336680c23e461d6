"""GPT dataset: Megatron's split, document/sample/shuffle indices, masks, and the index cache."""

import os

import numpy as np
import pytest
import torch

import data_megatron_reference as ref
from megatron_zaya.data import index_builders as ib
from megatron_zaya.data.gpt_dataset import (GPTDataset, SampleOptions, gpt_sample, ltor_masks_and_position_ids,
                                            split_indices, token_id_outside)
from megatron_zaya.data.indexed import IndexedDataset, write_dataset
from megatron_zaya.errors import UserInputError
from megatron_zaya.model.documents import document_attention_mask


def make_corpus(tmp_path, n_docs=37, seed=0, eod=999, name="c", zero_len=False):
    rng = np.random.default_rng(seed)
    seqs = []
    for i in range(n_docs):
        n = int(rng.integers(1, 30))
        seqs.append(rng.integers(0, 900, size=n).tolist() + [eod])
    if zero_len:
        seqs[3] = []
        seqs[0] = []
    prefix = str(tmp_path / name)
    write_dataset(prefix, seqs, dtype=np.uint16)
    return prefix, seqs


@pytest.mark.parametrize("seq_length,num_samples,zero_len", [
    (8, 20, False),     # less than one epoch
    (8, 150, False),    # several epochs, final epoch large -> shuffled together
    (7, 130, True),     # several epochs with zero-length documents
    (16, 70, False),    # epochs where the final one is small -> separate shuffle
    (5, 1, False),
    # exact multiples (tokens_per_epoch T = 405 for documents 5..32 of make_corpus()): the extra token of the
    # last sample needs one more epoch, and the samples before the final epoch are ((epochs-1)*T - 1) // seq
    (9, 45, False),     # 45 * 9 == T: two epochs (one leaves 44 samples), final epoch separate, 44 before it
    (15, 54, False),    # 54 * 15 == 2T: three epochs
    (9, 50, False),     # (epochs-1) * T a multiple of 9: 44 samples before the separately shuffled final epoch
    (9, 79, False),     # 79 - 44 == int(0.8 * 44): the final epoch is just large enough to shuffle together
])
# the document index walked 1 or 3 entries at a time, the boundaries found 2 or 7 at a time: the same samples
@pytest.mark.parametrize("documents, boundaries", [(None, None), (1, 7), (3, 2)])
def test_samples_match_reference(tmp_path, monkeypatch, seq_length, num_samples, zero_len, documents, boundaries):
    if documents:
        monkeypatch.setattr("megatron_zaya.data.index_builders.DOCUMENT_INDEX_CHUNK", documents)
        monkeypatch.setattr("megatron_zaya.data.index_builders.SAMPLE_INDEX_CHUNK", boundaries)
    prefix, seqs = make_corpus(tmp_path, zero_len=zero_len)
    ds = IndexedDataset(prefix)
    docs = np.arange(5, 33)
    gd = GPTDataset(ds, docs, num_samples, SampleOptions(seq_length, eod=999), seed=1234, cache_dir=str(tmp_path / "cache"))
    expected = ref.gpt_samples(seqs, list(docs), seq_length, num_samples, 1234)
    assert len(gd) == len(expected) >= num_samples
    for i in range(len(gd)):
        s = gd[i]
        assert s["tokens"].tolist() == expected[i][:-1]
        assert s["labels"].tolist() == expected[i][1:]


@pytest.mark.parametrize("seq_length, num_samples", [(9, 45), (8, 20)])     # 45 x 9: the stream's end exactly
def test_samples_without_the_extra_token_cut_the_token_stream(tmp_path, seq_length, num_samples):
    """add_extra_token 0 (Megatron-LM's add_extra_token_to_sequence False): the samples, in index order, are the
    document stream cut into seq_length pieces, the last one included when it ends the stream exactly."""
    prefix, seqs = make_corpus(tmp_path)
    gd = GPTDataset(IndexedDataset(prefix), np.arange(5, 33), num_samples, SampleOptions(seq_length, eod=999),
                    seed=1234, use_cache=False, add_extra_token=0)
    stream = [t for d in gd.document_index for t in seqs[int(d)]]
    pieces = sorted(tuple(stream[k * seq_length:(k + 1) * seq_length]) for k in range(len(gd)))
    assert len(gd) >= num_samples and sorted(tuple(gd.text(i).tolist()) for i in range(len(gd))) == pieces


def test_separate_final_epoch_is_exercised():
    tpe, seq = 400, 16
    assert ib.separate_final_epoch(2, tpe, seq, 26)[0]          # 26 - 24 = 2 < 0.8 * 24
    assert not ib.separate_final_epoch(2, tpe, seq, 45)[0]



def test_sequence_ids_past_int32_keep_their_value():
    """A dataset of 2^31 sequences or more: int64 ids in the document index (int32 would wrap around and
    read other documents); below that, int32 and the same order as ever."""
    big = np.array([2**31 + 5, 3, 2**31 + 9], dtype=np.int64)
    index = ib.build_document_index(big, 2, np.random.RandomState(1), False)
    assert index.dtype == np.int64 and sorted(index.tolist()) == sorted(big.tolist() * 2)
    small = ib.build_document_index(np.arange(5, dtype=np.int64), 2, np.random.RandomState(1), True)
    assert small.dtype == np.int32
    assert small.tolist() == ib.build_document_index(np.arange(5, dtype=np.int32), 2, np.random.RandomState(1),
                                                     True).tolist()
    assert ib.sequence_id_dtype(2**31) == np.int32 and ib.sequence_id_dtype(2**31 + 1) == np.int64

@pytest.mark.parametrize("split,n", [("969,30,1", 1000), ("1,1", 10), ("98,2,0", 37), ("1", 5), ("3,3,3", 7)])
def test_split_bounds_match_reference(split, n):
    assert ib.split_ranges(ib.parse_split(split), n) == ref.split_bounds(split, n)


def test_split_indices_and_bad_split(tmp_path):
    prefix, _ = make_corpus(tmp_path)
    train, valid, test = split_indices(IndexedDataset(prefix), "90,10,0")
    assert train == range(0, 33) and valid == range(33, 37) and test is None
    with pytest.raises(ValueError, match="--split"):
        ib.parse_split("a,b")


@pytest.mark.parametrize("split", ["-5,10,1", "5,-10,1", "1,,2", "1,1,1,1", "0,0,0", "nan,1", "inf", "abc", ""])
def test_bad_split_is_rejected(split):
    """Signs are part of the number: '-5,10,1' used to be read as 5,10,1."""
    with pytest.raises(ValueError, match="--split"):
        ib.parse_split(split)


def test_split_separators():
    assert ib.parse_split("98/2/0") == ib.parse_split("98 2 0") == ib.parse_split(" 98, 2 ,0 ") == [0.98, 0.02, 0.0]


def test_masks_and_position_ids():
    eod = 0
    tokens = np.array([5, 6, 0, 7, 8, 0, 9])
    opts = SampleOptions(7, eod=eod, reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True)
    loss, pos, docs = ltor_masks_and_position_ids(tokens, opts)
    assert loss.tolist() == [1, 1, 0, 1, 1, 0, 1]
    assert pos.tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert docs.tolist() == [0, 0, 0, 1, 1, 1, 2]         # each EOD ends its document
    # The mask the model builds from them is Megatron's: a token after an EOD sees nothing up to it.
    allowed = document_attention_mask(torch.from_numpy(docs)[None], torch.from_numpy(docs)[None])[0, 0]
    for q in range(7):
        doc_start = 0 if q <= 2 else (3 if q <= 5 else 6)
        assert allowed[q].tolist() == [doc_start <= k <= q for k in range(7)]
    loss, pos, docs = ltor_masks_and_position_ids(tokens, SampleOptions(7, eod=eod))
    assert loss.tolist() == [1] * 7 and pos.tolist() == list(range(7)) and docs is None


def test_pad_labels_get_no_loss_and_pad_ids_read_as_zero():
    """Megatron-LM's GPTDataset: loss mask 0 where the label is the pad token, pad ids mapped to 0 in
    tokens and labels (after the EOD-based masks and positions); a pad that is also the EOD is left alone."""
    text = np.array([5, 3, 3, 2, 7, 3], dtype=np.uint16)      # pad 3, eod 2
    sample = gpt_sample(text, SampleOptions(5, eod=2, pad=3, reset_position_ids=True))
    assert sample["tokens"].tolist() == [5, 0, 0, 2, 7] and sample["labels"].tolist() == [0, 0, 2, 7, 0]
    assert sample["loss_mask"].tolist() == [0, 0, 1, 1, 0]
    assert sample["position_ids"].tolist() == [0, 1, 2, 3, 0] and sample["tokens"].dtype == np.uint16
    for pad in (None, -1, 2):                                  # no pad, SentencePiece's "none", pad == EOD
        sample = gpt_sample(text, SampleOptions(5, eod=2, pad=pad))
        assert sample["tokens"].tolist() == [5, 3, 3, 2, 7] and sample["loss_mask"].tolist() == [1] * 5


def test_a_pad_that_is_another_special_token_masks_nothing():
    """As Megatron-LM's datasets: a pad declared as EOD, BOS or UNK (a tokenizer_config.json with pad_token
    "<s>") is not a pad to mask; every document's BOS would read as id 0 and never be predicted."""
    from types import SimpleNamespace

    from megatron_zaya.data.gpt_dataset import loss_masked_pad
    tokenizer = SimpleNamespace(eod=2, bos=1, unk=0, pad=3)
    assert loss_masked_pad(tokenizer) == 3
    for pad in (None, -1, 0, 1, 2):
        assert loss_masked_pad(SimpleNamespace(eod=2, bos=1, unk=0, pad=pad)) is None, pad
    # a Hugging Face tokenizer's pad guessed from its name, none declared: transformers' pad_token_id is None
    assert loss_masked_pad(SimpleNamespace(eod=2, bos=1, unk=0, pad=3, pad_declared=False)) is None


def test_token_ids_outside_the_vocabulary_are_named(tmp_path):
    """A dataset of another tokenizer: ids the tokenizer (and so the embedding) does not have. Read from the
    first tokens before the model is built (loaders.check_token_ids), and from every sample as it is read."""
    from megatron_zaya.data.config import DataConfig
    from megatron_zaya.data.loaders import check_token_ids
    from megatron_zaya.errors import UserInputError

    prefix = str(tmp_path / "other")
    write_dataset(prefix, [[1, 2, 3, 0], [4, 5, 6, 0], [7, 750, 8, 0]], dtype=np.uint16)
    cfg = DataConfig(data_path=[prefix], tokenizer_type="NullTokenizer")
    check_token_ids(cfg, 751)
    check_token_ids(cfg, 100, sample_tokens=8)          # the first 8 tokens only
    with pytest.raises(UserInputError, match=f"--data-path {prefix}: sequence 2 holds token id 750, outside the "
                                             r"vocabulary of --tokenizer-type NullTokenizer \(100 ids\)"):
        check_token_ids(cfg, 100)
    gap = str(tmp_path / "gap")
    write_dataset(gap, [[1, 2], [], [750]], dtype=np.uint16)     # an empty sequence shares the next one's pointer
    with pytest.raises(UserInputError, match="sequence 2 holds token id 750"):
        check_token_ids(DataConfig(data_path=[gap], tokenizer_type="NullTokenizer"), 100)
    gd = GPTDataset(IndexedDataset(prefix), np.arange(3), None, SampleOptions(3, eod=0, vocab_size=100), seed=1,
                    use_cache=False)
    seen = []
    with pytest.raises(UserInputError, match=f"{prefix}: sample \\d+ holds token id 750, outside the tokenizer's "
                                             "vocabulary of 100"):
        for i in range(len(gd)):
            seen.append(gd[i]["tokens"].max())
    assert all(t < 100 for t in seen)


def test_token_id_outside_names_ids_at_both_ends_of_the_vocabulary():
    """[0, vocab_size) is the vocabulary: vocab_size itself is outside, and so is a negative id (a signed
    dtype's, e.g. an int32 dataset written by another tool)."""
    assert token_id_outside(np.array([1, 2, 7], np.uint16), 8) is None
    assert token_id_outside(np.array([1, 8, 2], np.uint16), 8) == 8
    assert token_id_outside(np.array([3, -1, 2], np.int32), 8) == -1
    assert token_id_outside(np.zeros(0, np.int32), 8) is None


def test_sample_too_short_dataset_is_clear(tmp_path):
    prefix = str(tmp_path / "tiny")
    write_dataset(prefix, [[1, 2]], dtype=np.uint16)
    with pytest.raises(ValueError, match="too few for one sample"):
        GPTDataset(IndexedDataset(prefix), np.arange(1), None, SampleOptions(8, eod=0), seed=1, use_cache=False)


def test_cache_is_reused_and_keyed(tmp_path):
    prefix, _ = make_corpus(tmp_path)
    ds = IndexedDataset(prefix)
    cache = str(tmp_path / "cache")
    a = GPTDataset(ds, np.arange(37), 50, SampleOptions(8, 999), seed=1, cache_dir=cache)
    files = sorted(os.listdir(cache))
    assert len([f for f in files if f.endswith(".npy")]) == 3 and any(f.endswith("description.json") for f in files)
    b = GPTDataset(ds, np.arange(37), 50, SampleOptions(8, 999), seed=1, cache_dir=cache)
    assert isinstance(b.sample_index, np.memmap) and sorted(os.listdir(cache)) == files
    assert all(np.array_equal(a[i]["tokens"], b[i]["tokens"]) for i in range(len(a)))
    GPTDataset(ds, np.arange(37), 50, SampleOptions(8, 999), seed=2, cache_dir=cache)
    GPTDataset(ds, np.arange(37), 50, SampleOptions(9, 999), seed=1, cache_dir=cache)
    assert len([f for f in os.listdir(cache) if f.endswith(".npy")]) == 9
    default = GPTDataset(ds, np.arange(37), 10, SampleOptions(8, 999), seed=1)
    assert default.cache_dir == str(tmp_path / "cache" / "GPTDataset_indices")


@pytest.mark.parametrize("same_total", [True, False])
def test_cache_is_not_reused_after_retokenizing(tmp_path, same_total):
    """Same document count (so the same .idx size), other lengths: the stale indices must not be used,
    even when the .idx mtime is unchanged (coarse clocks, copies with preserved times)."""
    prefix, seqs = make_corpus(tmp_path, n_docs=37)
    cache = str(tmp_path / "cache")
    opts = SampleOptions(8, 999)
    old = GPTDataset(IndexedDataset(prefix), np.arange(37), 60, opts, seed=1, cache_dir=cache)
    st = os.stat(prefix + ".idx")
    if same_total:   # same .bin size too: move tokens from the longest documents to the shortest
        seqs = sorted(seqs, key=len)
        new = [s[:] for s in seqs]
        for i in range(10):
            moved = new[-1 - i][:len(new[-1 - i]) // 2]
            new[-1 - i] = new[-1 - i][len(moved):]
            new[i] = moved + new[i]
        assert sum(map(len, new)) == sum(map(len, seqs)) and list(map(len, new)) != list(map(len, seqs))
    else:
        new = [s[:2] for s in seqs]   # much shorter documents: the old sample index points past the end
    write_dataset(prefix, new, dtype=np.uint16)
    os.utime(prefix + ".idx", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.path.getsize(prefix + ".idx") == st.st_size
    ds = IndexedDataset(prefix)
    fresh = GPTDataset(ds, np.arange(37), 60, opts, seed=1, cache_dir=cache)
    assert fresh.description != old.description
    assert len([f for f in os.listdir(cache) if f.endswith(".npy")]) == 6
    ref_ds = GPTDataset(ds, np.arange(37), 60, opts, seed=1, use_cache=False)
    assert len(fresh) == len(ref_ds)
    for i in range(len(fresh)):
        assert np.array_equal(fresh[i]["tokens"], ref_ds[i]["tokens"])
    # a pure mtime change (touch) also makes a new entry; the same file reopened reuses it
    again = GPTDataset(IndexedDataset(prefix), np.arange(37), 60, opts, seed=1, cache_dir=cache)
    assert again.description == fresh.description
    os.utime(prefix + ".idx", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    GPTDataset(IndexedDataset(prefix), np.arange(37), 60, opts, seed=1, cache_dir=cache)
    assert len([f for f in os.listdir(cache) if f.endswith(".npy")]) == 9


def test_a_dataset_without_eod_tokens_is_warned_about_when_the_flags_need_them(tmp_path):
    """--reset-attention-mask / --reset-position-ids / --eod-mask-loss act at EOD tokens: a dataset
    preprocessed without --append-eod gets a warning naming it and the flags; one with EODs none."""
    from megatron_zaya.data import DataConfig
    from megatron_zaya.data.loaders import missing_eod_warnings

    with_eod, without = str(tmp_path / "with_eod"), str(tmp_path / "without")
    write_dataset(with_eod, [[5, 6, 7, 0], [8, 9, 0]], dtype=np.uint16)
    write_dataset(without, [[5, 6, 7], [8, 9]], dtype=np.uint16)
    config = DataConfig(data_path=["1", with_eod, "1", without], split="100,0,0", reset_attention_mask=True,
                        eod_mask_loss=True)
    warnings = missing_eod_warnings(config, eod=0)
    assert len(warnings) == 1 and without in warnings[0]
    assert warnings[0].startswith("--reset-attention-mask --eod-mask-loss: none of the first 2 documents")
    assert missing_eod_warnings(DataConfig(data_path=[without], split="100,0,0"), eod=0) == []   # no such flag
    # a document of several sequences ends with its last non-empty one
    from megatron_zaya.data.indexed import IndexedDatasetWriter
    from megatron_zaya.data.loaders import last_token
    split_doc = str(tmp_path / "split_doc")
    with IndexedDatasetWriter(split_doc, np.uint16) as writer:
        writer.add_document([5, 6, 7, 0], lengths=[2, 2])
        writer.add_document([8, 9], lengths=[2])
    data = IndexedDataset(split_doc)
    assert [last_token(data, d) for d in range(2)] == [0, 9]
    assert missing_eod_warnings(DataConfig(data_path=[split_doc], split="100,0,0", reset_position_ids=True), 0) == []


def test_indices_beyond_the_machines_memory_are_refused_before_they_are_built(tmp_path, monkeypatch):
    """A small dataset asked for far more samples than it holds (ZAYA1's run on a toy corpus) would repeat its
    documents millions of times: one line naming the dataset and the memory, not a numpy MemoryError."""
    prefix, _ = make_corpus(tmp_path)
    monkeypatch.setattr("megatron_zaya.data.index_builders.physical_memory_bytes", lambda: 1 << 20)   # 1 MiB
    with pytest.raises(UserInputError, match=r"passes over its [\d,]+ tokens: building their order needs about") as err:
        GPTDataset(IndexedDataset(prefix), np.arange(5, 33), 10 ** 6, SampleOptions(8, eod=999), seed=1,
                   cache_dir=str(tmp_path / "cache"))
    assert str(err.value).startswith(f"{prefix} (train split): 1,000,000 samples of 8 tokens take"), err.value
    GPTDataset(IndexedDataset(prefix), np.arange(5, 33), 100, SampleOptions(8, eod=999), seed=1,
               cache_dir=str(tmp_path / "cache"))      # within the memory: built
    # A blend's order, 10 bytes a sample: ZAYA1's 3.4e9 samples on a login node was a numpy MemoryError
    from megatron_zaya.data.index_builders import build_blending_indices
    with pytest.raises(UserInputError, match=r"the blend's order of 200,000 samples .* needs about 0.0 GiB, more than"
                                             r".* or train on fewer samples \(--train-iters / --train-samples\)"):
        build_blending_indices([0.3, 0.7], 200_000)
    assert len(build_blending_indices([0.3, 0.7], 1000)[0]) == 1000


@pytest.mark.parametrize("first, second", [
    ((np.arange(20), 30), (np.arange(20, 37), 30)),     # another --split: other documents, same sample count
    ((np.arange(37), 20), (np.arange(37), 300)),         # a longer run: more epochs of the same documents
], ids=["documents", "num-samples"])
def test_a_cached_index_is_not_reused_for_other_documents_or_sizes(tmp_path, first, second):
    """The index cache key holds the split's documents and the sample count: a second dataset of other
    documents (a changed --split) or of more epochs (a longer run), built into the same cache folder, reads
    exactly the samples of the same dataset built without a cache (the reference), token for token."""
    prefix, _ = make_corpus(tmp_path)
    ds, opts, cache = IndexedDataset(prefix), SampleOptions(8, 999), str(tmp_path / "cache")
    GPTDataset(ds, first[0], first[1], opts, seed=1, cache_dir=cache)
    got = GPTDataset(ds, second[0], second[1], opts, seed=1, cache_dir=cache)
    want = GPTDataset(ds, second[0], second[1], opts, seed=1, use_cache=False)
    assert len(got) == len(want) >= second[1]
    assert all(np.array_equal(got[i]["tokens"], want[i]["tokens"]) for i in range(len(want)))


@pytest.mark.parametrize("use_cache", [True, False])
def test_pickled_dataset_samples_as_the_original(tmp_path, use_cache):
    """A loader worker started by spawn or forkserver (macOS; Python 3.14's default on Linux) gets the
    dataset pickled: with an index cache its index arrays are not sent but read back from the cache,
    without one they travel by value; either way the worker's samples are the parent's."""
    import pickle

    prefix, _ = make_corpus(tmp_path)
    ds = IndexedDataset(prefix)
    cache = str(tmp_path / "cache") if use_cache else None
    a = GPTDataset(ds, np.arange(37), 300, SampleOptions(8, 999), seed=3, cache_dir=cache, use_cache=use_cache)
    blob = pickle.dumps(a)
    arrays_bytes = sum(np.asarray(getattr(a, k)).nbytes for k in ("document_index", "sample_index", "shuffle_index"))
    assert (len(blob) < arrays_bytes) == use_cache, (len(blob), arrays_bytes)
    b = pickle.loads(blob)
    assert len(b) == len(a) >= 300
    for k in ("document_index", "sample_index", "shuffle_index"):
        np.testing.assert_array_equal(getattr(b, k), getattr(a, k))
    for i in range(len(a)):
        for key, value in a[i].items():
            np.testing.assert_array_equal(b[i][key], value)


@pytest.mark.parametrize("tpe, seq, n, epochs", [(405, 4, 101, 1), (405, 2, 202, 1), (810, 4, 202, 1),
                                                 (405, 4, 102, 2), (405, 9, 45, 2)])
def test_num_epochs_at_exact_multiples(tpe, seq, n, epochs):
    """N * seq + 1 tokens exactly fill the epochs: no extra epoch."""
    assert ib.num_epochs(tpe, seq, n) == epochs


def test_offsets_past_int32_in_one_long_document():
    """A document of 2^31+ tokens: its boundary offsets need int64 (int32 would wrap negative)."""
    sizes = np.array([2**31 + 10], dtype=np.int64)
    out = ib.build_sample_index(sizes, np.array([0], dtype=np.int32), 2**30, 1, 2**31 + 10)
    assert out.tolist() == [[0, 0], [0, 2**30], [0, 2**31]]


def test_an_empty_split_is_a_user_error():
    """No tokens is a UserInputError naming it, not a ZeroDivisionError."""
    from megatron_zaya.errors import UserInputError
    with pytest.raises(UserInputError, match="holds no tokens"):
        ib.num_epochs(0, 8, 10)
