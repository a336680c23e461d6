"""Indexed dataset: byte-for-byte format checks against the spec, round trips and validation errors."""

import os
import struct

import numpy as np
import pytest

import megatron_zaya.data.indexed as indexed_module
from megatron_zaya.data.indexed import (
    IndexedDataset,
    IndexedDatasetError,
    IndexedDatasetWriter,
    check_indexed_dataset,
    optimal_dtype,
    write_dataset,
)


def spec_read(prefix):
    """Independent reader written from the format table in the spec (struct, no numpy views)."""
    idx = open(prefix + ".idx", "rb").read()
    binary = open(prefix + ".bin", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack_from("<Q", idx, 9)
    code = idx[17]
    n, d = struct.unpack_from("<QQ", idx, 18)
    lengths = struct.unpack_from(f"<{n}i", idx, 34)
    pointers = struct.unpack_from(f"<{n}q", idx, 34 + 4 * n)
    docs = struct.unpack_from(f"<{d}q", idx, 34 + 12 * n)
    fmt = {8: "H", 4: "i", 1: "B", 3: "h", 5: "q"}[code]
    seqs = [list(struct.unpack_from(f"<{l}{fmt}", binary, p)) for l, p in zip(lengths, pointers)]
    return version, code, list(docs), seqs


def test_worked_example_bytes(tmp_path):
    prefix = str(tmp_path / "ex")
    write_dataset(prefix, [[1, 2, 3], [4, 5]], dtype=np.uint16)
    binary = open(prefix + ".bin", "rb").read()
    assert binary == bytes.fromhex("01 00 02 00 03 00 04 00 05 00")
    idx = open(prefix + ".idx", "rb").read()
    assert len(idx) == 82
    expected = (
        b"MMIDIDX\x00\x00"
        + struct.pack("<Q", 1)
        + bytes([8])
        + struct.pack("<QQ", 2, 3)
        + struct.pack("<2i", 3, 2)
        + struct.pack("<2q", 0, 6)
        + struct.pack("<3q", 0, 1, 2)
    )
    assert idx == expected
    ds = IndexedDataset(prefix)
    assert len(ds) == 2 and ds.dtype == np.uint16
    assert ds[0].tolist() == [1, 2, 3] and ds[1].tolist() == [4, 5]
    assert ds.document_indices.tolist() == [0, 1, 2]


def test_reads_hand_built_megatron_file(tmp_path):
    """A file assembled byte by byte from the spec (as Megatron writes it), int32, multi-sequence docs."""
    prefix = str(tmp_path / "meg")
    seqs = [[70000, 1], [5], [2, 3, 4, 100000]]
    docs = [0, 2, 3]
    with open(prefix + ".bin", "wb") as f:
        for s in seqs:
            f.write(struct.pack(f"<{len(s)}i", *s))
    ptrs, off = [], 0
    for s in seqs:
        ptrs.append(off)
        off += 4 * len(s)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, 3, 3))
        f.write(struct.pack("<3i", *map(len, seqs)) + struct.pack("<3q", *ptrs) + struct.pack("<3q", *docs))
    ds = IndexedDataset(prefix + ".idx")
    assert [ds[i].tolist() for i in range(3)] == seqs
    assert ds.document(0).tolist() == [70000, 1, 5]
    assert ds.get(2, offset=1, length=2).tolist() == [3, 4]
    assert ds.num_documents == 2


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_writer_matches_spec_reader(tmp_path, dtype):
    rng = np.random.default_rng(0)
    hi = 65000 if dtype == np.uint16 else 300000
    docs = [rng.integers(0, hi, size=rng.integers(1, 50)).tolist() for _ in range(40)]
    prefix = str(tmp_path / "w")
    with IndexedDatasetWriter(prefix, dtype) as w:
        for i, d in enumerate(docs):
            if i % 5 == 0 and len(d) > 2:  # some documents with two sequences
                w.add_document(d, [1, len(d) - 1])
            else:
                w.add_document(d)
    version, code, doc_idx, seqs = spec_read(prefix)
    assert version == 1 and code == (8 if dtype == np.uint16 else 4)
    flat = [t for s in seqs for t in s]
    assert flat == [t for d in docs for t in d]
    assert doc_idx[0] == 0 and doc_idx[-1] == len(seqs) and len(doc_idx) == len(docs) + 1
    ds = IndexedDataset(prefix)
    for i, d in enumerate(docs):
        assert ds.document(i).tolist() == d


def test_optimal_dtype():
    assert optimal_dtype(32000) == np.uint16
    assert optimal_dtype(65499) == np.uint16
    assert optimal_dtype(65500) == np.int32
    assert optimal_dtype(262272) == np.int32


def test_token_out_of_range_for_dtype(tmp_path):
    w = IndexedDatasetWriter(str(tmp_path / "x"), np.uint16)
    with pytest.raises(ValueError, match="does not fit uint16"):
        w.add_document(np.array([1, 70000], np.int64))
    w.abort()
    assert not os.listdir(tmp_path)


def test_interrupted_writer_leaves_no_dataset(tmp_path):
    prefix = str(tmp_path / "half")
    with pytest.raises(RuntimeError):
        with IndexedDatasetWriter(prefix, np.uint16) as w:
            w.add_document([1, 2, 3])
            raise RuntimeError("killed")
    assert os.listdir(tmp_path) == []
    w = IndexedDatasetWriter(prefix, np.uint16)
    w.add_document([1, 2, 3])  # not finalized: only a temporary name exists
    assert not os.path.exists(prefix + ".bin") and not os.path.exists(prefix + ".idx")
    w.abort()


def _good(tmp_path):
    prefix = str(tmp_path / "g")
    write_dataset(prefix, [[1, 2, 3], [4, 5]], dtype=np.uint16)
    return prefix


def _patch(path, offset, data):
    b = bytearray(open(path, "rb").read())
    b[offset:offset + len(data)] = data
    open(path, "wb").write(bytes(b))


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda p: _patch(p + ".idx", 0, b"XXXX"), "bad magic"),
        (lambda p: _patch(p + ".idx", 9, struct.pack("<Q", 2)), "unsupported version 2"),
        (lambda p: _patch(p + ".idx", 17, bytes([9])), "unknown dtype code 9"),
        (lambda p: open(p + ".idx", "r+b").truncate(70), "inconsistent"),
        (lambda p: open(p + ".idx", "r+b").truncate(20), "truncated index"),
        (lambda p: open(p + ".idx", "ab").write(b"\0" * 5), "inconsistent"),      # neither layout's size
        (lambda p: open(p + ".bin", "r+b").truncate(8), "does not match the index"),
        (lambda p: open(p + ".bin", "ab").write(b"xx"), "does not match the index"),   # a .bin too long
        (lambda p: _patch(p + ".idx", 34 + 8 + 8, struct.pack("<q", 4)), "sequence pointer 1"),
        (lambda p: _patch(p + ".idx", 34 + 24 + 16, struct.pack("<q", 7)), "document indices"),
        (lambda p: os.remove(p + ".bin"), "file not found"),
    ],
)
def test_corruption_is_reported_with_file_name(tmp_path, corrupt, message):
    prefix = _good(tmp_path)
    corrupt(prefix)
    with pytest.raises(IndexedDatasetError, match=message) as e:
        IndexedDataset(prefix)
    assert str(tmp_path) in str(e.value)


def _seven(tmp_path):
    prefix = str(tmp_path / "seven")
    write_dataset(prefix, [[1] * (i % 3 + 1) for i in range(7)], dtype=np.uint16)
    return prefix


@pytest.mark.parametrize("chunk", [1, 2, 3, 100])
def test_whole_index_check_reads_in_chunks(tmp_path, monkeypatch, chunk):
    """The check reads CHECK_CHUNK entries at a time: a damaged entry in any chunk is found and named,
    and a sound dataset's token count is the same whatever the chunk."""
    monkeypatch.setattr(indexed_module, "CHECK_CHUNK", chunk)
    prefix = _seven(tmp_path)
    assert IndexedDataset(prefix).num_tokens == 1 + 2 + 3 + 1 + 2 + 3 + 1
    n = 7
    _patch(prefix + ".idx", 34 + 4 * n + 8 * 5, struct.pack("<q", 99))      # pointer of sequence 5
    with pytest.raises(IndexedDatasetError, match="sequence pointer 5 is 99, expected 18"):
        IndexedDataset(prefix)
    prefix = _seven(tmp_path)
    _patch(prefix + ".idx", 34 + 4 * 6, struct.pack("<i", -1))              # length of the last sequence
    with pytest.raises(IndexedDatasetError, match="negative sequence length"):
        IndexedDataset(prefix)
    prefix = _seven(tmp_path)
    _patch(prefix + ".idx", 34 + 12 * n + 8 * 6, struct.pack("<q", 2))      # document index 6 below index 5
    with pytest.raises(IndexedDatasetError, match="not non-decreasing"):
        IndexedDataset(prefix)


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda p: _patch(p + ".idx", 0, b"XXXX"), "bad magic"),
        (lambda p: _patch(p + ".idx", 17, bytes([9])), "unknown dtype code 9"),
        (lambda p: open(p + ".idx", "r+b").truncate(70), "inconsistent"),
        (lambda p: open(p + ".bin", "r+b").truncate(8), "does not match the index"),
        (lambda p: open(p + ".bin", "ab").write(b"xx"), "does not match the index"),
        (lambda p: _patch(p + ".idx", 34 + 24 + 16, struct.pack("<q", 7)), "document indices"),
        (lambda p: os.remove(p + ".idx"), "file not found"),
    ],
)
def test_cheap_check_finds_damage_without_reading_the_index(tmp_path, corrupt, message):
    """check_indexed_dataset (what pretrain_zaya.py runs on every --data-path before any work)
    reads the header and a few entries only, yet names a truncated or mismatched pair."""
    prefix = _good(tmp_path)
    assert check_indexed_dataset(prefix + ".bin").num_sequences == 2     # a .bin/.idx suffix is accepted
    corrupt(prefix)
    with pytest.raises(IndexedDatasetError, match=message) as e:
        check_indexed_dataset(prefix)
    assert str(tmp_path) in str(e.value)


def test_empty_dataset(tmp_path):
    prefix = str(tmp_path / "e")
    write_dataset(prefix, [], dtype=np.uint16)
    ds = IndexedDataset(prefix)
    assert len(ds) == 0 and ds.num_documents == 0 and not ds.multimodal     # its size is also base + 0 modes
    assert check_indexed_dataset(prefix).num_sequences == 0
    # a preprocessing shard that got no documents merges with a full one, on either side
    full, out = str(tmp_path / "full"), str(tmp_path / "out")
    write_dataset(full, [[1, 2, 3], [4, 5]], dtype=np.uint16)
    with IndexedDatasetWriter(out, np.uint16) as w:
        w.add_index(full)
        w.add_index(prefix)
        w.add_index(full)
    merged = IndexedDataset(out)
    assert [merged[i].tolist() for i in range(len(merged))] == [[1, 2, 3], [4, 5]] * 2 and not merged.multimodal


def test_spilling_and_merge_via_add_index(tmp_path, monkeypatch):
    """Force tiny spill buffers so the streamed index assembly is exercised across many chunks."""
    monkeypatch.setattr(IndexedDatasetWriter, "_SPILL", 7)
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 1000, size=rng.integers(0, 9)).tolist() for _ in range(50)]
    a, b, out = (str(tmp_path / x) for x in "abo")
    write_dataset(a, docs[:20], dtype=np.uint16)
    write_dataset(b, docs[20:], dtype=np.uint16)
    with IndexedDatasetWriter(out, np.uint16) as w:
        w.add_index(a)
        w.add_index(b)
    version, code, doc_idx, seqs = spec_read(out)
    assert seqs == docs and doc_idx == list(range(51))
    assert sorted(os.listdir(tmp_path)) == sorted(["a.bin", "a.idx", "b.bin", "b.idx", "o.bin", "o.idx"])


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_index_is_written_in_chunks_with_running_pointers(tmp_path, monkeypatch, dtype):
    """prepare() streams the lengths, pointers and document indices WRITE_CHUNK entries at a time (and add_index
    copies them that way): the byte pointers are the exclusive cumsum of length * itemsize (formats.md) across
    chunk boundaries, not restarting at 0 in each chunk, and every sequence reads back, merged ones included."""
    monkeypatch.setattr(indexed_module, "WRITE_CHUNK", 3)
    rng = np.random.default_rng(2)
    docs = [rng.integers(0, 1000, size=rng.integers(1, 9)).tolist() for _ in range(10)]
    a, b, out = (str(tmp_path / x) for x in "abo")
    write_dataset(a, docs, dtype=dtype)
    lens = np.array([len(d) for d in docs], dtype=np.int64)
    want = (np.cumsum(lens) - lens) * np.dtype(dtype).itemsize
    raw = open(a + ".idx", "rb").read()
    assert np.frombuffer(raw, "<i8", count=10, offset=34 + 4 * 10).tolist() == want.tolist()
    _, _, doc_idx, seqs = spec_read(a)
    assert seqs == docs and doc_idx == list(range(11))
    ds = IndexedDataset(a)
    assert [ds[i].tolist() for i in range(10)] == docs
    write_dataset(b, docs[:4], dtype=dtype)
    with IndexedDatasetWriter(out, dtype) as w:
        w.add_index(a)
        w.add_index(b)
    _, _, doc_idx, seqs = spec_read(out)
    assert seqs == docs + docs[:4] and doc_idx == list(range(15))
    merged = IndexedDataset(out)
    assert [merged[i].tolist() for i in range(14)] == docs + docs[:4]


def test_merge_keeps_sequence_modes_and_refuses_mixing(tmp_path):
    """add_index of multimodal datasets (an int8 mode per sequence after the document indices) ends the merged
    index with their modes in order (they were dropped); adding a dataset without modes to such an output, or
    the other way round, is an error naming the output, and the with block leaves nothing behind."""
    a, b, plain = (str(tmp_path / x) for x in ("a", "b", "plain"))
    write_dataset(a, [[1, 2, 3], [4, 5]], dtype=np.uint16)
    write_dataset(b, [[6], [7, 8], [9]], dtype=np.uint16)
    write_dataset(plain, [[10]], dtype=np.uint16)
    for prefix, modes in ((a, [0, 1]), (b, [2, 0, 1])):
        with open(prefix + ".idx", "ab") as f:
            f.write(np.array(modes, np.int8).tobytes())
    out = str(tmp_path / "out")
    with IndexedDatasetWriter(out, np.uint16) as w:
        w.add_index(a)
        w.add_index(b)
    merged = IndexedDataset(out)
    assert merged.multimodal and merged.sequence_modes.tolist() == [0, 1, 2, 0, 1]
    assert [merged[i].tolist() for i in range(5)] == [[1, 2, 3], [4, 5], [6], [7, 8], [9]]
    for first, second in ((a, plain), (plain, a)):
        with pytest.raises(IndexedDatasetError, match="mixed"):
            with IndexedDatasetWriter(str(tmp_path / "mixed"), np.uint16) as w:
                w.add_index(first)
                w.add_index(second)
    assert not any(name.startswith("mixed") for name in os.listdir(tmp_path))


def test_positional_reads_match_the_memory_map(tmp_path):
    """IndexedDataset(prefix, mmap_bin=False) (--no-mmap-bin-files) reads the same tokens as the memory
    map, also after pickling (a spawned loader worker reopens the file); a .bin shorter than its .idx
    says fails naming the file."""
    import pickle

    prefix = str(tmp_path / "d")
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 60000, size=int(rng.integers(1, 40))).tolist() for _ in range(25)]
    write_dataset(prefix, docs, dtype=np.uint16)
    mapped, reads = IndexedDataset(prefix), IndexedDataset(prefix, mmap_bin=False)
    copy = pickle.loads(pickle.dumps(reads))
    for i in range(len(mapped)):
        assert np.array_equal(mapped[i], reads[i]) and np.array_equal(mapped[i], copy[i])
        assert mapped[i].tolist() == docs[i]
    assert np.array_equal(mapped.get(3, 1, 2), reads.get(3, 1, 2))
    assert np.array_equal(mapped.document(7), reads.document(7))
    size = os.path.getsize(prefix + ".bin")
    with open(prefix + ".bin", "r+b") as f:
        f.truncate(size - 2)
    short = IndexedDataset.__new__(IndexedDataset)   # skip __init__'s own size checks: the read must catch it
    short.__dict__.update(reads.__dict__)
    from megatron_zaya.data.indexed import _FileReads
    short._bin = _FileReads(prefix + ".bin")
    with pytest.raises(IndexedDatasetError, match=r"d\.bin: read 0 of|d\.bin: read \d+ of"):
        short[len(short) - 1]
