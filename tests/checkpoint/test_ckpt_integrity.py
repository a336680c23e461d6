"""Checkpoint writes and loads that must not pass unseen: one async save in flight at a time (the host
buffers are reused from save to save), and every rank of a multi-rank load checking the crc of its share of
the tensor files."""
import os
import time

import pytest
import torch

from megatron_zaya.checkpoint import CheckpointError, saver
from megatron_zaya.checkpoint.format import CheckpointFolder


def test_a_second_async_save_waits_for_the_one_in_flight(tmp_path, monkeypatch):
    """At most one save in flight: save_async of iteration 2 while iteration 1 still writes waits for it
    before it copies its state into the host buffers the first save is writing from (reused from save to
    save). Reference: the values each save was given (exact), and both outcomes recorded in order."""
    from megatron_zaya.checkpoint.format import Entry

    real = saver.write_safetensors
    slow = {"first": True}

    def write_tensors(path, tensors, metadata=None):
        if slow.pop("first", False):
            time.sleep(0.5)                       # the first save is still before its tensor file
        return real(path, tensors, metadata)
    monkeypatch.setattr(saver, "write_safetensors", write_tensors)
    writer = saver.CheckpointWriter(str(tmp_path), 0, 1, "run", finalize_timeout=30)
    meta = {"layout": {"world_size": 1}, "train_state": {}, "model_config": {}}
    for iteration in (1, 2):
        writer.save_async(iteration, [Entry("model/w", torch.full((4,), float(iteration)), [4], [[[0, 4]]])],
                          {}, meta)
    assert writer.wait(timeout=30) == (2, True)
    assert writer.completed == [(1, True), (2, True)]
    for iteration in (1, 2):
        folder = CheckpointFolder(os.path.join(str(tmp_path), f"iter_{iteration:07d}"))
        assert torch.equal(folder.full("model/w"), torch.full((4,), float(iteration))), iteration


def test_every_rank_checks_its_share_of_the_tensor_files(tmp_path):
    """A 2-rank checkpoint whose rank_00001.safetensors has a flipped byte (same size): rank 1 checks the
    files of its share (rank_00001's crc32) at open_for_load, so the load refuses the folder, naming the
    file, instead of marking every file verified unread. Reference: the crc32 in rank_00001.json."""
    from megatron_zaya.checkpoint.format import Entry, read_folder_metadata, read_rank_meta
    from megatron_zaya.checkpoint.training import TrainingCheckpointer

    save = str(tmp_path)
    meta = {"layout": {"world_size": 2}, "train_state": {"iteration": 1}, "model_config": {}}
    for rank in (1, 0):                   # rank 0 finalizes once rank 1's files are there
        writer = saver.CheckpointWriter(save, rank, 2, "run", finalize_timeout=30)
        entry = Entry(f"model/w{rank}", torch.full((64,), float(rank)), [64], [[[0, 64]]])
        writer.save_sync(1, [entry], {}, meta, agree=lambda flag: flag)
    folder = os.path.join(save, "iter_0000001")
    with open(os.path.join(folder, "rank_00001.safetensors"), "r+b") as f:
        f.seek(-8, os.SEEK_END)
        byte = f.read(1)
        f.seek(-8, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    ck = TrainingCheckpointer.__new__(TrainingCheckpointer)
    ck.rank, ck.world_size, ck.is_main = 1, 2, False
    ck.agree = lambda flag: flag                           # this rank's answer is the group's
    ck.log = ck._log_error = lambda msg: None

    def shared_rank_metas(path):                           # (the gather of the ranks' shares of the JSONs)
        metadata = read_folder_metadata(path)
        return metadata, [read_rank_meta(path, r, metadata["files"]) for r in range(2)]
    ck._shared_rank_metas = shared_rank_metas
    with pytest.raises(CheckpointError, match=r"rank_00001\.safetensors: corrupt"):
        ck.open_for_load(save)
