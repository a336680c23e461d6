"""Whether a process id is running on this machine: the one check the leftover-file cleanup
(leftovers.py), the data cache's stale-lock test (data/cache.py) and the test Slurm share."""
from __future__ import annotations

import os


def process_running(pid: int) -> bool:
    """True unless no process `pid` exists here (one of another user, or a check this system refuses,
    counts as running: never treat a live writer's files or lock as abandoned)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
