"""Tokens per expert without bincount: kernels.reference.class_counts against torch.bincount, and the MoE
forward (router and permute) free of bincount, which reads its input's min and max back to the host on a
GPU (two device syncs per MoE layer each)."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.kernels.reference import class_counts
from megatron_zaya.model import ZayaModel


@pytest.mark.parametrize("n, classes", [(0, 3), (1, 1), (17, 5), (4096, 17)])
def test_class_counts_match_bincount(n, classes):
    index = torch.randint(0, classes, (n,), generator=torch.Generator().manual_seed(n))
    counts = class_counts(index, classes)
    assert counts.dtype == torch.int64 and counts.tolist() == torch.bincount(index, minlength=classes).tolist()


class OpNames(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_moe_forward_calls_no_bincount():
    torch.manual_seed(0)
    model = ZayaModel(model_config_from_preset("zaya1-tiny", num_layers=2, vocab_size=256))
    tokens = torch.randint(0, 256, (2, 16))
    with OpNames() as ops:
        out = model(tokens, labels=tokens)
    assert "bincount" not in ops.names
    assert sum(int(r.counts.sum()) for r in out.routing) == 2 * 2 * 16      # every token counted once per layer
