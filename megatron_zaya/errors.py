"""The common base of the errors that mean "the user gave a bad flag, file or value".

Entry points (pretrain_zaya.py) print such an error as one line and exit with status 2, like an
argparse usage error, instead of a traceback. Genuine bugs keep their tracebacks: only this class
(and the checkpoint code's CheckpointError) is caught, never Exception.
"""


class UserInputError(ValueError):
    """A bad flag, input file or value; the message names it (a ValueError for older callers)."""
