"""checkpoint/format.py on hand-made files: the safetensors header's alignment, which folders are one
iteration's checkpoint, and which tracker files are named as unreadable."""
import struct

import torch

from megatron_zaya.checkpoint.format import (LATEST_FILE, METADATA_FILE, checkpoint_candidates, is_iteration_folder,
                                             unreadable_latest_file, write_safetensors)


def test_safetensors_header_is_padded_to_8_bytes(tmp_path):
    """The safetensors format's alignment: the header (JSON, space-padded) ends on an 8-byte boundary, so each
    tensor starts aligned to its element size; whatever the names' lengths."""
    from safetensors.torch import load_file

    for name in ("a", "ab", "abc", "a.b.c.d.e"):
        path = str(tmp_path / f"{name}.safetensors")
        tensors = {name: torch.arange(3, dtype=torch.float64), "x" * len(name): torch.ones(2, dtype=torch.int32)}
        written = write_safetensors(path, tensors)
        data = open(path, "rb").read()
        (header_len,) = struct.unpack("<Q", data[:8])
        assert header_len % 8 == 0 and data[8 + header_len - 1:8 + header_len] in (b" ", b"}"), name
        assert written["bytes"] == len(data)
        loaded = load_file(path)
        assert all(torch.equal(loaded[k], v) for k, v in tensors.items())


def test_a_folder_holding_metadata_is_one_checkpoint_whatever_its_name(tmp_path):
    """--load of a copied checkpoint folder not named iter_NNNNNNN (it holds metadata.json) loads that folder,
    not the checkpoints inside it."""
    folder = tmp_path / "best"
    folder.mkdir()
    assert not is_iteration_folder(str(folder))
    (folder / METADATA_FILE).write_text("{}")
    assert is_iteration_folder(str(folder))
    assert checkpoint_candidates(str(folder)) == [str(folder)]


def test_only_a_tracker_file_naming_no_iteration_is_called_unreadable(tmp_path):
    assert unreadable_latest_file(str(tmp_path)) is None                 # absent
    (tmp_path / LATEST_FILE).write_text("12\n")
    assert unreadable_latest_file(str(tmp_path)) is None                 # readable
    (tmp_path / LATEST_FILE).write_text("release\n")
    assert unreadable_latest_file(str(tmp_path)) == \
        f"{tmp_path / LATEST_FILE}: holds 'release', not an iteration number"
