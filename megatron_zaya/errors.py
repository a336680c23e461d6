"""The common base of the errors that mean "the user gave a bad flag, file or value".

Entry points (pretrain_zaya.py) print such an error as one line and exit with status 2, like an
argparse usage error, instead of a traceback. Genuine bugs keep their tracebacks: only this class
(and the checkpoint code's CheckpointError) is caught, never Exception. `hub_name_hint` adds to a
missing-path message the command that fetches a Hugging Face Hub name (nothing is downloaded at run time).
"""
import os
import re


class UserInputError(ValueError):
    """A bad flag, input file or value; the message names it (a ValueError for older callers)."""


def hub_name_hint(path: str, files: str = "", then: str = "give DIR") -> str:
    """"" unless `path` looks like a Hugging Face Hub name (org/name) and is not on disk: then the note that
    nothing is downloaded at run time, with the command that fetches `files` (default: the whole repository)
    and what to do `then`."""
    path = str(path)
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", path) or os.path.exists(path):
        return ""
    return (f"; {path} looks like a Hugging Face Hub name, and nothing is downloaded at run time: fetch it first "
            f"(hf download {path}{' ' + files if files else ''} --local-dir DIR) and {then}")
