"""Pretrain a ZAYA1-style MoE language model (Megatron-style flags).

One process on CPU (the quickstart does all of this for you: bash examples/quickstart_cpu.sh):
    python pretrain_zaya.py --preset zaya1-tiny --data-path data/shakespeare_text_document \
        --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model data/tokenizer/shakespeare_sp8k.model \
        --micro-batch-size 8 --global-batch-size 16 --seq-length 256 --train-iters 200 --lr 3e-3 \
        --lr-warmup-iters 20 --tensorboard-dir runs/tiny/tb --save runs/tiny/ckpt --save-interval 100

Several processes: launch the same command with torchrun, mpirun or srun (see docs/LAUNCH.md), e.g.
    torchrun --nproc-per-node 2 pretrain_zaya.py ... --use-distributed-optimizer
"""
from __future__ import annotations

import sys
import traceback

from megatron_zaya.arguments import parse_args
from megatron_zaya.checkpoint.format import CheckpointError
from megatron_zaya.errors import UserInputError
from megatron_zaya.training.setup import build_and_train, seed_everything
from megatron_zaya.parallel.launch import detect_launcher, end_with_the_launcher, exit_process
from megatron_zaya.parallel.collective_failures import PEER_LOST_EXIT_CODE, collective_timed_out, peer_lost
from megatron_zaya.training.watchdog import WATCHDOG_EXIT_CODE

PROG = "pretrain_zaya.py"


def user_error_line(err: BaseException) -> str | None:
    """The one-line message for an error that is the user's input (a bad flag, data file,
    checkpoint or path), None for anything else, which keeps its traceback."""
    if isinstance(err, (UserInputError, CheckpointError)):
        text = str(err)
        if "Original Traceback" in text:     # raised in a DataLoader worker: its own message is the last line
            text = text.rstrip().splitlines()[-1].split(": ", 1)[-1]
        return text
    if isinstance(err, OSError) and err.filename is not None:     # a path the run was given
        return f"{err.filename}: {err.strerror or err}"
    return None


def main(argv=None) -> int:
    """Parse and validate every flag (before any process group or allocation; a bad flag is reported
    once per node, by its first process, every rank exiting with status 2), then train. Errors in
    the user's input found later (a corrupt dataset or checkpoint, an unusable path) end the run with
    one `error:` line per rank that met it (naming the rank in a multi-process run) and exit status
    2, like a bad flag. A collective that failed because another rank is gone ends this rank with
    PEER_LOST_EXIT_CODE (123), one that timed out with the hang watchdog's 124, after its traceback
    (parallel/collective_failures.py)."""
    end_with_the_launcher()       # a SIGKILLed torchrun leaves no rank behind (holding the --save lock)
    run = parse_args(argv)
    seed_everything(run.train.seed)
    try:
        return build_and_train(run)
    except (UserInputError, CheckpointError, OSError) as err:
        line = user_error_line(err)
        if line is None:
            raise
        launch = detect_launcher()    # a later error can be one rank's own (a file missing on one node)
        where = f" (rank {launch.rank} of {launch.world_size})" if launch.world_size > 1 else ""
        print(f"{PROG}: error{where}: {' '.join(line.splitlines())}", file=sys.stderr, flush=True)
        return 2
    except RuntimeError as err:
        if collective_timed_out(err):       # checked first: gloo's peers of a rank that timed out lose it
            what, code = "a collective timed out: a rank is hung", WATCHDOG_EXIT_CODE
        elif peer_lost(err):
            what, code = "another process of the job is gone", PEER_LOST_EXIT_CODE
        else:
            raise
        traceback.print_exc()
        launch = detect_launcher()
        print(f"{PROG}: rank {launch.rank} of {launch.world_size}: {what} ({str(err).strip().splitlines()[0][:200]}); "
              f"exiting with {code}, which run_mi300x.sh does not blame on this node", file=sys.stderr, flush=True)
        return code


if __name__ == "__main__":
    exit_process(main())      # a rank of a multi-process run skips the interpreter's teardown (launch.py)
