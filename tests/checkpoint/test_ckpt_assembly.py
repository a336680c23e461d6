"""CheckpointFolder.full assembles a global tensor from rank pieces: replicated pieces may overlap
(TP ranks sharing a KV head each write it), and a gap is still an 'incomplete' error."""
import pytest
import torch

from megatron_zaya.checkpoint.format import CheckpointError, CheckpointFolder


class _RankFile:
    def __init__(self, rank, tensors):
        self.rank, self.tensors, self.tensor_path = rank, tensors, f"rank_{rank}.safetensors"

    def get(self, key):
        return self.tensors[key]


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
