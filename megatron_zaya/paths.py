"""Where an output that is not there yet would go: `nearest_existing(path)`, the one walk up to the closest
folder that exists, which the checks of an output path (training's folders, the tools' output files and
folders, a Hugging Face export) share."""
from __future__ import annotations

import os


def nearest_existing(path) -> str:
    """`path` (absolute) or its closest ancestor that exists: where the missing folders of `path` would be made
    (a file there means they cannot be)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    return probe
