"""CheckpointFolder.full assembles a global tensor from rank pieces: replicated pieces may overlap
(TP ranks sharing a KV head each write it), and a gap is still an 'incomplete' error. A block of rows
(a row share of a replicated tensor, replica_owners) is read from the saved pieces it overlaps alone."""
import pytest
import torch

from megatron_zaya.checkpoint.blocks import narrow_ranges
from megatron_zaya.checkpoint.format import CheckpointError, CheckpointFolder


class _RankFile:
    def __init__(self, rank, tensors):
        self.rank, self.tensors, self.tensor_path = rank, tensors, f"rank_{rank}.safetensors"

    def get(self, key):
        self.reads = getattr(self, "reads", 0) + 1
        return self.tensors[key]

    def get_box(self, key, box, shape):
        self.reads = getattr(self, "reads", 0) + 1
        self.boxes = getattr(self, "boxes", []) + [box]
        return self.tensors[key].view(shape)[tuple(slice(a, b) for a, b in box)]


def _folder(pieces):
    """A CheckpointFolder over in-memory pieces [(ranges, flat, data)] of one (6, 4) tensor 'w'."""
    folder = CheckpointFolder.__new__(CheckpointFolder)
    folder.folder = "ckpt/iter_0000001"
    folder.index = {"w": [(_RankFile(r, {"w": data}), {"shape": [6, 4], "dtype": "F32", "ranges": ranges,
                                                      "flat": flat})
                          for r, (ranges, flat, data) in enumerate(pieces)]}
    return folder


def _block(full, rows):
    return torch.cat([full[a:b] for a, b in rows])


def test_overlapping_replicas_assemble_and_a_gap_is_reported():
    full = torch.arange(24, dtype=torch.float32).view(6, 4)
    # Rank 0: rows 0-1 and the shared rows 4-5; rank 1: rows 2-3 and the same shared rows 4-5
    # (like a conv weight's query channels plus a replicated KV head's channels).
    rows0, rows1 = [[0, 2], [4, 6]], [[2, 4], [4, 6]]
    replicated = [([rows0, [[0, 4]]], None, _block(full, rows0)), ([rows1, [[0, 4]]], None, _block(full, rows1))]
    assert torch.equal(_folder(replicated).full("w"), full)
    # ZeRO-1 flat pieces of the same replicated slice on both replicas.
    flat = [([[[4, 6]], [[0, 4]]], [0, 5], full[4:6].reshape(-1)[:5]),
            ([[[4, 6]], [[0, 4]]], [5, 8], full[4:6].reshape(-1)[5:]),
            ([[[4, 6]], [[0, 4]]], [0, 8], full[4:6].reshape(-1)),
            ([[[0, 4]], [[0, 4]]], None, full[:4])]
    assert torch.equal(_folder(flat).full("w"), full)
    # Rows 2-3 written by nobody: 16 of 24 elements, even though 24 elements were written in all.
    gap = [([rows0, [[0, 4]]], None, _block(full, rows0)), ([rows0, [[0, 4]]], None, _block(full, rows0)),
           ([[[4, 6]], [[0, 4]]], None, full[4:6])]
    with pytest.raises(CheckpointError, match=r"'w' is incomplete \(16 of 24 elements"):
        _folder(gap).full("w")


def test_narrow_ranges_takes_local_rows_across_runs():
    ranges = [[[0, 2], [4, 6]], [[0, 4]]]             # local rows 0-1 are global 0-1, local 2-3 global 4-5
    assert narrow_ranges(ranges, None) is ranges
    assert narrow_ranges(ranges, (1, 3)) == [[[1, 2], [4, 5]], [[0, 4]]]
    assert narrow_ranges(ranges, (2, 4)) == [[[4, 6]], [[0, 4]]]
    assert narrow_ranges(ranges, (0, 1)) == [[[0, 1]], [[0, 4]]]


def test_a_block_of_rows_reads_only_the_pieces_it_overlaps():
    full = torch.arange(24, dtype=torch.float32).view(6, 4)
    shares = [([[[a, b]], [[0, 4]]], None, full[a:b]) for a, b in ((0, 2), (2, 3), (3, 6))]   # saved by 3 ranks
    folder = _folder(shares)
    for rows in ((1, 3), (0, 6), (3, 5)):                         # read back in other shares
        block = folder.piece("w", [[list(rows)], [[0, 4]]], None)
        assert torch.equal(block, full[rows[0]:rows[1]]), rows
    assert [rf.reads for rf, _ in folder.index["w"]] == [2, 2, 2]
    # A piece that leaves part of the block uncovered: the whole-tensor assembly names the gap.
    with pytest.raises(CheckpointError, match="incomplete"):
        _folder(shares[:2]).piece("w", [[[1, 5]], [[0, 4]]], None)
    # ZeRO-1 flat pieces: assembled whole, as before.
    flat = [([[[0, 6]], [[0, 4]]], [0, 10], full.reshape(-1)[:10]), ([[[0, 6]], [[0, 4]]], [10, 24],
                                                                       full.reshape(-1)[10:])]
    assert torch.equal(_folder(flat).piece("w", [[[2, 4]], [[0, 4]]], None), full[2:4])


def test_a_flat_piece_reads_only_the_saved_flat_pieces_it_overlaps():
    """ZeRO-1 under another data-parallel size: the same block (rows 0-3), cut into flat pieces elsewhere."""
    full = torch.arange(24, dtype=torch.float32).view(6, 4)
    block, flat_block = [[[0, 4]], [[0, 4]]], full[:4].reshape(-1)
    saved = [(block, [a, b], flat_block[a:b]) for a, b in ((0, 5), (5, 11), (11, 16))]
    saved.append(([[[4, 6]], [[0, 4]]], None, full[4:6]))          # another block (rows 4-5): never read
    folder = _folder(saved)
    assert torch.equal(folder.piece("w", block, [3, 8]), flat_block[3:8])
    assert torch.equal(folder.piece("w", block, [11, 16]), flat_block[11:16])
    assert [getattr(rf, "reads", 0) for rf, _ in folder.index["w"]] == [1, 1, 1, 0]
    assert [rf.boxes for rf, _ in folder.index["w"][:2]] == [[[(3, 5)]], [[(0, 3)]]]     # the overlaps alone
    with pytest.raises(CheckpointError, match="incomplete"):          # a gap: the whole-tensor assembly names it
        _folder(saved[:1] + saved[2:]).piece("w", block, [3, 8])


def test_a_block_of_several_runs_reads_only_the_pieces_it_overlaps():
    """TP slices of a fused weight (two runs of rows each) read under another TP size: pieces, not the tensor."""
    full = torch.arange(24, dtype=torch.float32).view(6, 4)
    quarters = [[[0, 1], [3, 4]], [[1, 2], [4, 5]], [[2, 3], [5, 6]]]        # saved: three slices of two runs
    folder = _folder([([rows, [[0, 4]]], None, _block(full, rows)) for rows in quarters])
    wanted = [[0, 2], [3, 5]]                                                # read: rows 0-1 and 3-4
    assert torch.equal(folder.piece("w", [wanted, [[0, 4]]], None), _block(full, wanted))
    assert [getattr(rf, "reads", 0) for rf, _ in folder.index["w"]] == [1, 1, 0]


def test_rows_of_a_tensor_saved_whole_read_only_those_rows():
    """A checkpoint whose replicated tensor was saved whole (by one owner, or before row shares), read by the
    owner of rows 2-3 alone: the bytes of those rows, not the tensor."""
    full = torch.arange(24, dtype=torch.float32).view(6, 4)
    folder = _folder([([[[0, 6]], [[0, 4]]], None, full)])
    assert torch.equal(folder.piece("w", [[[2, 4]], [[0, 4]]], None), full[2:4])
    assert folder.index["w"][0][0].boxes == [[(2, 4), (0, 4)]]


def test_a_flat_piece_of_another_block_layout_reads_the_overlapping_pieces():
    """ZeRO-1 under another TP layout: saved as flat pieces of two row blocks (TP2 over rows), read as a flat
    piece of a column block (another split): assembled from the saved pieces that hold its elements."""
    full = torch.arange(24, dtype=torch.float32).view(6, 4)
    top, bottom = [[[0, 3]], [[0, 4]]], [[[3, 6]], [[0, 4]]]
    saved = [(top, [0, 7], full[:3].reshape(-1)[:7]), (top, [7, 12], full[:3].reshape(-1)[7:]),
             (bottom, [0, 12], full[3:].reshape(-1))]
    folder = _folder(saved)
    columns = [[[0, 6]], [[1, 3]]]                     # columns 1-2 of every row: 12 elements
    wanted = full[:, 1:3].reshape(-1)
    assert torch.equal(folder.piece("w", columns, [1, 5]), wanted[1:5])       # rows 0-2: the top pieces
    assert [getattr(rf, "reads", 0) for rf, _ in folder.index["w"]] == [1, 1, 0]
    assert torch.equal(folder.piece("w", columns, [0, 12]), wanted)
    with pytest.raises(CheckpointError, match="incomplete"):                 # a gap: named by the assembly
        _folder(saved[:2]).piece("w", columns, [4, 10])


def test_index_runs_keep_every_run_of_a_tp_slice():
    """A TP slice of the experts' fused gate/up weight holds two runs of rows: the ranges a rank saves must
    name both. Reference: the index tensor itself (exact), expanded back from the runs."""
    from megatron_zaya.checkpoint.blocks import _run_index, index_runs
    for index in ([0, 1, 4, 5, 6, 9], [3, 4, 5], [7], [0, 2, 4], []):
        runs = index_runs(torch.tensor(index, dtype=torch.long))
        assert _run_index(runs).tolist() == index, (index, runs)
        assert all(a < b for a, b in runs) and all(p[1] < n[0] for p, n in zip(runs, runs[1:])), runs
    assert index_runs(torch.tensor([0, 1, 4, 5, 6, 9])) == [[0, 2], [4, 7], [9, 10]]
