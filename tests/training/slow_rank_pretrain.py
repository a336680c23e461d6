"""pretrain_zaya.py with one rank made slow, for the --log-straggler test: the rank SLOW_RANK sleeps
SLOW_SECONDS in every forward of the model.

    SLOW_RANK=1 SLOW_SECONDS=0.2 torchrun --nproc-per-node 2 tests/training/slow_rank_pretrain.py FLAGS...
"""
import os
import runpy
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from megatron_zaya.model import ZayaModel  # noqa: E402

if int(os.environ["RANK"]) == int(os.environ["SLOW_RANK"]):
    forward = ZayaModel.forward

    def slow_forward(self, *args, **kwargs):
        time.sleep(float(os.environ["SLOW_SECONDS"]))
        return forward(self, *args, **kwargs)

    ZayaModel.forward = slow_forward

sys.argv = [os.path.join(ROOT, "pretrain_zaya.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
