"""Where an output that is not there yet would go: `nearest_existing(path)`, the one walk up to the closest
folder that exists, which the checks of an output path (training's folders, the tools' output files and
folders, a Hugging Face export) share."""
from __future__ import annotations

import os

from megatron_zaya.errors import UserInputError


class DanglingLink(UserInputError):
    """A symbolic link on the way to an output path points at nothing: no folder can be made through it."""


def nearest_existing(path) -> str:
    """`path` (absolute) or its closest ancestor that exists: where the missing folders of `path` would be made
    (a file there means they cannot be). DanglingLink where `path` or an ancestor on the way is a symbolic link
    to a missing target (os.makedirs would fail there with "File exists")."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        if os.path.islink(probe):
            raise DanglingLink(f"{probe} is a symbolic link to {os.readlink(probe)}, which does not exist (create "
                               f"that folder, or name another)")
        probe = os.path.dirname(probe)
    return probe
