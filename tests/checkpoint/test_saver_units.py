"""checkpoint.saver.CheckpointWriter on its own, one process standing for the ranks: rank 0's finalize waits
for every rank (and gives up at once on a rank's failure note, naming it), refuses a tensor file whose size is
not what its rank wrote; an asynchronous save's snapshot is a copy made when it is taken, of each tensor's own
shape and dtype; a replaced folder whose iteration is not complete again is the only copy and stays; and
--ckpt-keep 0 is refused."""
import os

import pytest
import torch

from megatron_zaya.checkpoint import saver
from megatron_zaya.checkpoint.format import COMPLETE_MARKER, Entry, list_complete

RUN_ID = "0123456789"


def writer(save, rank=0, world_size=1, **kwargs):
    return saver.CheckpointWriter(str(save), rank, world_size, RUN_ID, log=lambda msg: None, **kwargs)


def entry(value, shape=(4,), dtype=torch.float32):
    n = 1
    for s in shape:
        n *= s
    return Entry("model/w", torch.full(shape, float(value), dtype=dtype), list(shape), [[[0, n]]])


def test_finalize_waits_for_every_rank_and_stops_at_a_failure_note(tmp_path):
    rank0, rank1 = writer(tmp_path, 0, 2), writer(tmp_path, 1, 2)
    folder = rank0.partial_dir(3)
    rank0.write_rank(folder, 3, [entry(1)], {})
    assert rank0._wait_for_ranks(folder, timeout=0.2) == "ranks [1] did not finish writing within 0 s"
    rank1._note_failure(folder, OSError("disk full"))
    with pytest.raises(saver.CheckpointSaveError, match=r"rank_00001: OSError: disk full"):
        rank0.finalize(folder, 3, {}, timeout=20)
    rank1.write_rank(folder, 3, [entry(2)], {})
    os.unlink(os.path.join(folder, "rank_00001.failed"))
    rank0.finalize(folder, 3, {}, timeout=10)
    assert list_complete(str(tmp_path)) == [3]


def test_finalize_refuses_a_tensor_file_of_another_size_than_written(tmp_path):
    w = writer(tmp_path)
    folder = w.partial_dir(1)
    w.write_rank(folder, 1, [entry(1)], {})
    with open(os.path.join(folder, "rank_00000.safetensors"), "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(saver.CheckpointSaveError, match="rank_00000.safetensors: size"):
        w.finalize(folder, 1, {}, timeout=10)
    assert list_complete(str(tmp_path)) == []


def test_a_snapshot_is_a_copy_with_each_tensors_shape_and_dtype(tmp_path):
    w = writer(tmp_path)
    live = entry(1.0)
    copy, = w.snapshot([live])
    live.tensor.fill_(7.0)               # the next step updates the weights while the save writes
    assert copy.tensor.tolist() == [1.0] * 4
    bf16, = w.snapshot([entry(2.0, dtype=torch.bfloat16)])
    assert bf16.tensor.dtype == torch.bfloat16 and bf16.tensor.tolist() == [2.0] * 4
    wider, = w.snapshot([entry(3.0, shape=(2, 3))])
    assert wider.tensor.shape == (2, 3) and wider.tensor.sum().item() == 18.0


def test_a_replaced_folder_whose_iteration_is_not_complete_again_stays(tmp_path):
    """iter_5 there but without its marker (a new save of 5 being published): the replaced complete copy of 5
    is the only one; a prune must not take it for debris."""
    save = str(tmp_path)
    os.makedirs(os.path.join(save, "iter_0000005"))
    replaced = os.path.join(save, f"iter_0000005.replaced-{'c' * 10}")
    os.makedirs(replaced)
    open(os.path.join(replaced, COMPLETE_MARKER), "w").write("5\n")
    writer(tmp_path, keep=1).prune(just_saved=5)
    assert os.path.isdir(replaced)


def test_ckpt_keep_and_retain_interval_must_be_positive(tmp_path):
    for kwargs, flag in ((dict(keep=0), "--ckpt-keep=0"), (dict(retain_interval=0), "--save-retain-interval=0")):
        with pytest.raises(ValueError, match=flag):
            writer(tmp_path, **kwargs)
