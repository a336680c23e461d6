"""peer_lost and collective_timed_out (parallel/collective_failures.py) on the errors torch raises when another
rank is gone or hung, as gloo, NCCL and the TCP store word them, and on look-alikes that are this process's own.

    python -m pytest -q tests/parallel/test_collective_failures.py

tests/training/test_collective_failure_exits.py runs it for real: a gloo rank whose peer was SIGKILLed.
"""
import pytest
import torch.distributed as dist

from megatron_zaya.parallel.collective_failures import collective_timed_out, peer_lost

GLOO = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:7363. This is typically caused by a remote worker crashing.")


def chained(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer from e
    except BaseException as e:
        return e


@pytest.mark.parametrize("err, lost", [
    (RuntimeError(GLOO), True),
    (RuntimeError("[gloo/transport/tcp/pair.cc:534] Read error [10.0.0.2]:4431: Connection reset by peer"), True),
    (RuntimeError("[gloo/transport/tcp/pair.cc:589] Write error [10.0.0.2]:4431: Broken pipe"), True),
    # NCCL / RCCL over InfiniBand: a dead peer and this node's own failing link give the same error
    (dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1971, remote process exited or there was a "
                           "network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a "
                           "network error or a remote process exiting prematurely."), False),
    # the TCP store after rank 0 died, in two runs of torch 2.13
    (dist.DistNetworkError("Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server "
                           "shutdown or crash?"), True),
    (dist.DistNetworkError("failed to recv from the store: Connection reset by peer"), True),
    (chained(ValueError("while reducing the loss"), RuntimeError(GLOO)), True),
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),
    (RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 2000ms for recv operation to "
                  "complete"), False),
    (BrokenPipeError(32, "Broken pipe"), False),                    # this process's own stdout pipe
    (ConnectionResetError(104, "Connection reset by peer"), False),    # an OSError: a file system or data server
    (ValueError("connection closed by peer"), False),
], ids=["gloo-closed", "gloo-reset", "gloo-pipe", "nccl-remote", "store-closed", "store-reset", "chained", "oom",
        "timeout", "own-pipe", "oserror", "not-runtime"])
def test_which_errors_are_a_lost_peer(err, lost):
    assert peer_lost(err) is lost


@pytest.mark.parametrize("err, timed_out", [
    (RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 2000ms for recv operation to "
                  "complete"), True),
    (RuntimeError("Application timeout caused pair closure"), True),
    (dist.DistBackendError("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
                           "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 ms"), True),
    (RuntimeError(GLOO), False),                           # a peer gone: peer_lost's
    (TimeoutError("timed out waiting for the data server"), False),     # an OSError of this process's own
], ids=["gloo", "gloo-after", "nccl", "peer-gone", "oserror"])
def test_which_errors_are_a_collective_timeout(err, timed_out):
    assert collective_timed_out(err) is timed_out
