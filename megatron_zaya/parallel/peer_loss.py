"""Telling "another process of the job is gone" apart from this rank's own failure.

When a rank dies (the out-of-memory killer, a node or GPU fault, a crash), the next collective of its peers
fails: gloo raises at once ("Connection closed by peer", "Connection reset by peer", a write that meets
"Broken pipe"), NCCL / RCCL report ncclRemoteError ("remote process exited or there was a network error"),
and the rendezvous store's client loses its connection to rank 0. A rank that fails that way exits with
PEER_LOST_EXIT_CODE instead of 1, so that run_mi300x.sh does not blame its healthy node: the launcher then
blames the node whose ranks left no exit record (docs/LAUNCH.md). Only RuntimeErrors (torch.distributed's
DistError and gloo's errors are RuntimeErrors) count; an OSError of this process's own, such as a closed
stdout pipe, is not a peer's doing.
"""
from __future__ import annotations

PEER_LOST_EXIT_CODE = 123

PEER_LOST_MARKERS = (
    "connection closed by peer",           # gloo: the peer's socket closed
    "connection reset by peer",            # gloo, the TCP store: the peer's kernel reset the connection
    "broken pipe",                         # gloo: a write to a peer that is gone
    "remote process exited",               # NCCL / RCCL: ncclRemoteError's text
    "ncclremoteerror",
)


def peer_lost(err: BaseException) -> bool:
    """Whether `err` (or an exception it was raised from or while handling) is a collective or store call
    that failed because another process of the job is gone."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, RuntimeError) and any(m in str(err).lower() for m in PEER_LOST_MARKERS):
            return True
        err = err.__cause__ or err.__context__
    return False
