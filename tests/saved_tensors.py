"""What a forward keeps for its backward, for the memory tests: each saved storage once, the model's
parameters left out (they live anyway)."""
import contextlib

import torch


@contextlib.contextmanager
def saved_storages(model):
    """Inside: the forward's saved tensors are recorded; yields {storage address: bytes}, filled as it runs
    (sum its values after the forward)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield kept
