"""pretrain_zaya.py with one rank made faulty, for tests: the rank FAULT_RANK sleeps SLOW_SECONDS in every
forward of the model (--log-straggler), and with DIE_AT_FORWARD=N SIGKILLs itself at its N-th forward (a
peer lost in the middle of training).

    FAULT_RANK=1 SLOW_SECONDS=0.2 torchrun --nproc-per-node 2 tests/training/faulty_rank_pretrain.py FLAGS...
"""
import os
import runpy
import signal
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from megatron_zaya.model import ZayaModel  # noqa: E402

if int(os.environ["RANK"]) == int(os.environ["FAULT_RANK"]):
    forward = ZayaModel.forward
    forwards = 0

    def faulty_forward(self, *args, **kwargs):
        global forwards
        forwards += 1
        if forwards == int(os.environ.get("DIE_AT_FORWARD", "0")):
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(float(os.environ.get("SLOW_SECONDS", "0")))
        return forward(self, *args, **kwargs)

    ZayaModel.forward = faulty_forward

sys.argv = [os.path.join(ROOT, "pretrain_zaya.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
