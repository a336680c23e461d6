"""checkpoint/format.py on hand-made files: the safetensors header's alignment, which folders are one
iteration's checkpoint, which tracker files are named as unreadable, which checkpoint a resume takes, and
the checks of a folder's metadata and rank JSONs."""
import json
import os
import struct
import zlib

import pytest
import torch

from megatron_zaya.checkpoint.format import (COMPLETE_MARKER, FORMAT_VERSION, LATEST_FILE, METADATA_FILE,
                                             CheckpointError, checkpoint_candidates, interrupted_publication,
                                             is_iteration_folder, iter_dir_name, read_folder_metadata, read_rank_meta,
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


def test_of_two_checkpoints_completed_after_the_tracker_file_the_newer_is_the_latest(tmp_path):
    """Two saves published after latest_checkpointed_iteration.txt was last written (the file names 4, the
    complete 8 and 12 are newer): a resume continues from 12, the newest."""
    for it in (4, 8, 12):
        (tmp_path / iter_dir_name(it)).mkdir()
        (tmp_path / iter_dir_name(it) / COMPLETE_MARKER).write_text("")
    (tmp_path / LATEST_FILE).write_text("4\n")
    os.utime(tmp_path / LATEST_FILE, ns=(1, 1))          # written before both
    assert interrupted_publication(str(tmp_path)) == 12


def test_a_rank_json_with_one_digit_changed_is_refused(tmp_path):
    """The rank JSON's crc32 in the manifest is checked, not only its size: a flipped digit (same length) is
    refused, naming the manifest."""
    info = write_safetensors(str(tmp_path / "rank_00000.safetensors"), {"w": torch.zeros(4)})
    data = json.dumps({"file": info, "entries": {}, "state": {"consumed_samples": 1280}}).encode()
    manifest = {"rank_00000.json": {"bytes": len(data), "crc32": zlib.crc32(data)}, "rank_00000.safetensors": info}
    (tmp_path / "rank_00000.json").write_bytes(data)
    assert read_rank_meta(str(tmp_path), 0, manifest)["state"]["consumed_samples"] == 1280
    (tmp_path / "rank_00000.json").write_bytes(data.replace(b"1280", b"9280"))
    with pytest.raises(CheckpointError, match=r"rank_00000.json: corrupt \(does not match the manifest in "
                                              r"metadata.json\)"):
        read_rank_meta(str(tmp_path), 0, manifest)


def test_folder_metadata_needs_the_complete_marker_and_this_format_version(tmp_path):
    metadata = {"format_version": FORMAT_VERSION, "layout": {"world_size": 1}, "train_state": {}, "files": {},
                "model_config": {}}
    (tmp_path / METADATA_FILE).write_text(json.dumps(metadata))
    with pytest.raises(CheckpointError, match=f"{COMPLETE_MARKER}: missing - the save of .* did not complete"):
        read_folder_metadata(str(tmp_path))
    (tmp_path / COMPLETE_MARKER).write_text("")
    assert read_folder_metadata(str(tmp_path)) == metadata
    (tmp_path / METADATA_FILE).write_text(json.dumps({**metadata, "format_version": FORMAT_VERSION + 1}))
    with pytest.raises(CheckpointError, match=rf"format version {FORMAT_VERSION + 1} \(this code reads "
                                              rf"{FORMAT_VERSION}\)"):
        read_folder_metadata(str(tmp_path))
