"""Putting finished temporary files in place under their final names, replacing what is there or not.

A tool refuses an existing output unless --overwrite is given, but checks at its start: another run of the same
output (a job submitted twice) may write it meanwhile, and renaming over it replaced that run's output without a
word (both runs said they wrote it). Without --overwrite, `put_in_place` therefore gives each file its final name
with a hard link, which fails where the name exists, and only then drops the temporary name: of two runs, the
first to put its first file in place writes the output, and the other stops with FileExistsError, its temporary
files still there for it to remove. On a file system without hard links the name is checked just before a rename
(the window between the two is a few microseconds instead of the whole run).
"""
from __future__ import annotations

import errno
import os

# os.link's errors on file systems that have no hard links (FAT and exFAT, some FUSE and network mounts)
NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}


def put_in_place(pairs: list[tuple[str, str]], replace: bool) -> None:
    """Rename each (temporary, final) of `pairs` into place, in order. `replace`: over any existing file
    (os.replace). Otherwise no existing file is touched: FileExistsError (its `filename` the final name) at the
    first final name that exists, the files this call had put in place taken back first (while their temporary
    names still hold them: the set stays one run's), every temporary name not yet dropped left to the caller."""
    if replace:
        for temporary, final in pairs:
            os.replace(temporary, final)
        return
    placed = []          # (temporary, final, hard-linked: else renamed)
    try:
        for temporary, final in pairs:
            placed.append((temporary, final, _link(temporary, final)))
    except FileExistsError:
        for temporary, final, linked in placed:
            if not linked:                        # renamed there (no hard links): renamed back
                os.rename(final, temporary)
            elif _same_file(temporary, final):
                os.remove(final)
        raise
    for temporary, _, linked in placed:
        if linked:
            os.remove(temporary)


def _link(temporary: str, final: str) -> bool:
    """Give `temporary`'s file the name `final` too (True), or, where hard links are not supported, rename it
    there after checking that `final` does not exist (False); FileExistsError when `final` exists."""
    try:
        os.link(temporary, final)
        return True
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), final) from None
    except OSError as err:
        if err.errno not in NO_HARD_LINKS:
            raise
    if os.path.lexists(final):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), final)
    os.replace(temporary, final)
    return False


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except FileNotFoundError:
        return False


def written_meanwhile(output_prefix: str, err: FileExistsError) -> str:
    """The one-line error for an output (`--output-prefix`) that another run of it wrote while this one ran."""
    return (f"--output-prefix {output_prefix}: {err.filename} was written meanwhile by another run (pass "
            f"--overwrite to replace it)")
