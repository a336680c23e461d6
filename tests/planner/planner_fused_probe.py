"""Run as a script under TRITON_INTERPRET=1 MEGATRON_ZAYA_KERNELS=triton: measures the saved-for-backward
bytes of a small model whose RMSNorm/residual/SwiGLU/RoPE/permute/cross-entropy go through the Triton
autograd functions (interpreted on CPU), without and with selective recomputation, each also with packed
documents (the segmented conv kernel), and prints them beside the planner's fused-kernel formula."""
import json
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))      # the repository: its tests package

from megatron_zaya.config import model_config_from_preset  # noqa: E402
from megatron_zaya.planner.activations import StoragePolicy, activation_memory  # noqa: E402
from tests.planner.test_planner_activations import bf16_model, measured_saved_bytes  # noqa: E402


def main():
    config = model_config_from_preset("zaya1-tiny", num_layers=1, vocab_size=256)
    model = bf16_model(config)
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, config.vocab_size, (2, 16), generator=gen)
    labels = torch.randint(0, config.vocab_size, (2, 16), generator=gen)
    policy = StoragePolicy(attention="math", kv_repeated=True, loss="fused", kernels="fused")
    result = {}
    forward = model.forward
    documents = (torch.arange(16) // 6).expand(2, 16)      # packed documents: three per sequence
    for packed in (False, True):
        model.forward = (lambda tokens, labels=None: forward(tokens, labels=labels, document_ids=documents)) if packed \
            else forward
        for recompute in ("none", "selective"):
            model.set_recompute(None if recompute == "none" else recompute)
            measured, routed, padded = measured_saved_bytes(model, tokens, labels, backend=SDPBackend.MATH)
            predicted = activation_memory(config, 16, 2, recompute, policy=policy, routed_fraction=routed,
                                          padded_fraction=padded, packed_documents=packed).stored
            result[("packed " if packed else "") + recompute] = {"measured": measured, "predicted": predicted,
                                                                 "routed": routed}
    print(json.dumps(result["none"] | {key: result[key] for key in ("selective", "packed none", "packed selective")}))


if __name__ == "__main__":
    main()
