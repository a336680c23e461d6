"""Telling a collective that failed because of another rank apart from this rank's own failure.

- A peer is gone. When a rank dies (the out-of-memory killer, a node fault, a crash), the next collective
  of its peers fails: gloo raises at once ("Connection closed by peer", "Connection reset by peer", a write
  that meets "Broken pipe": TCP's word that the other end closed), and the rendezvous store's client loses
  its connection to rank 0 ("Connection reset by peer", "Failed to recv, got 0 bytes"). Such a rank exits
  with PEER_LOST_EXIT_CODE (123). Not NCCL / RCCL's ncclRemoteError ("remote process exited or there was a
  network error"): InfiniBand reports a dead peer and this node's own failing link alike (a completion
  error such as IBV_WC_RETRY_EXC_ERR), so it stays an exit 1, and the node with a broken link is still
  blamed (with its healthy peers, when they get it too).
- A collective timed out (--distributed-timeout-minutes): some rank is hung. gloo raises "Timed out waiting
  ...ms for recv operation to complete" on the ranks that waited (then "Application timeout caused pair
  closure" on their next call), NCCL's watchdog "Watchdog caught collective operation timeout" when it
  raises rather than aborts the process. Such a rank exits with the hang watchdog's code (124,
  training/watchdog.py), which every rank waiting in a hung collective gives alike.
run_mi300x.sh blames neither on the rank's node (docs/LAUNCH.md): it blames the node whose ranks left no
exit record, or none. Only RuntimeErrors count (torch.distributed's DistError and gloo's errors are
RuntimeErrors); an OSError of this process's own, such as a closed stdout pipe, is not another rank's doing.
"""
from __future__ import annotations

PEER_LOST_EXIT_CODE = 123

PEER_LOST_MARKERS = (
    "connection closed by peer",           # gloo: the peer's socket closed
    "connection reset by peer",            # gloo, the TCP store: the peer's kernel reset the connection
    "broken pipe",                         # gloo: a write to a peer that is gone
    "failed to recv, got 0 bytes",         # the TCP store: its server (rank 0) closed the connection
)

TIMEOUT_MARKERS = (
    "timed out waiting",                   # gloo: "... for recv operation to complete"
    "application timeout caused pair closure",     # gloo: the call after a timeout
    "watchdog caught collective operation timeout",     # NCCL / RCCL
)


def _matches(err: BaseException, markers: tuple[str, ...]) -> bool:
    """Whether `err`, or an exception it was raised from or while handling, is a RuntimeError whose text has
    one of `markers`."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, RuntimeError) and any(m in str(err).lower() for m in markers):
            return True
        err = err.__cause__ or err.__context__
    return False


def peer_lost(err: BaseException) -> bool:
    """A collective or store call that failed because another process of the job is gone."""
    return _matches(err, PEER_LOST_MARKERS)


def collective_timed_out(err: BaseException) -> bool:
    """A collective that timed out waiting for another rank (one that is hung)."""
    return _matches(err, TIMEOUT_MARKERS)
