"""Worker of test_planner_activations.py: the bytes a bf16 model's forward saves for the backward on each rank
of CP = 2 (parallelize_model, slice_batch_for_cp, gloo), case by case, and the routing fractions of each rank's
own tokens (counts not summed over the CP group). Rank 0 prints every case's ranks as one JSON line.

    torchrun --nproc-per-node 2 tests/planner/cp_activations_worker.py [fused]

"fused": the Triton kernels, run by the interpreter, on a smaller model (the fused-kernel policy's terms).
"""
import os
import sys

if sys.argv[1:] == ["fused"]:
    os.environ["TRITON_INTERPRET"] = "1"      # before triton loads

import torch  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402

from megatron_zaya import kernels  # noqa: E402
from megatron_zaya.config import model_config_from_preset  # noqa: E402
from megatron_zaya.parallel.apply import parallelize_model  # noqa: E402
from megatron_zaya.parallel.context import slice_batch_for_cp  # noqa: E402
from megatron_zaya.parallel.launch import init_distributed  # noqa: E402
from megatron_zaya.parallel.state import ParallelState  # noqa: E402
from tests.parallel.parallel_launcher import report_from_rank0_and_exit  # noqa: E402
from tests.planner.test_planner_activations import bf16_model, measured_saved_bytes  # noqa: E402
from tests.planner.tp_activations_worker import BATCH, CONFIG  # noqa: E402

BACKENDS = {"cpu-flash": SDPBackend.FLASH_ATTENTION, "cpu-reference": SDPBackend.MATH, "fused": SDPBackend.MATH}
# (policy, recompute, --recompute-modules, KV heads, packed documents): with 2 KV heads the 8 query heads are
# grouped (GQA), with 8 not.
CASES = [
    ("cpu-flash", "none", None, 2, False),
    ("cpu-flash", "selective", None, 2, False),
    ("cpu-flash", "none", None, 8, False),
    ("cpu-flash", "selective", None, 8, False),
    ("cpu-reference", "none", None, 2, False),
    ("cpu-reference", "selective", None, 8, False),
    ("cpu-flash", "selective", ["moe"], 2, False),
    ("cpu-reference", "selective", ["core_attn"], 2, False),
    ("cpu-flash", "full", None, 2, False),
    ("cpu-flash", "none", None, 2, True),
    ("cpu-reference", "selective", None, 2, True),
]
# The fused kernels' probe (planner_fused_probe.py): zaya1-tiny with 1 layer, 2 x 16 tokens.
FUSED_CONFIG = dict(num_layers=1, vocab_size=256, seq_length=16)
FUSED_CASES = [("fused", recompute, None, 2, documents) for documents in (False, True)
               for recompute in ("none", "selective")]


def measure(case, env) -> dict:
    """This rank's saved bytes and routing for one case."""
    policy, recompute, modules, kv_heads, documents = case
    overrides = FUSED_CONFIG if policy == "fused" else CONFIG | {"num_query_groups": kv_heads}
    config = model_config_from_preset("zaya1-tiny", **overrides)
    pstate = ParallelState(1, 2, 1, env.world_size, model_config=config)
    model = bf16_model(config)
    model.set_recompute(None if recompute == "none" else recompute, modules=modules)
    model = parallelize_model(model, pstate)
    model.local_routing_counts = True       # the routing of this rank's tokens, as its experts saw them
    seq = config.seq_length
    generator = torch.Generator().manual_seed(1)      # the same sequences on both ranks: CP splits them
    batch = {"tokens": torch.randint(0, config.vocab_size, (BATCH, seq), generator=generator),
             "labels": torch.randint(0, config.vocab_size, (BATCH, seq), generator=generator)}
    if documents:     # documents across the chunk edges
        batch["document_ids"] = (torch.arange(seq) // (seq // 3 + 1)).expand(BATCH, seq).contiguous()
    local = slice_batch_for_cp(batch, pstate)
    extra = {key: local[key] for key in ("position_ids", "document_ids") if key in local}
    saved, routed, padded = measured_saved_bytes(model, local["tokens"], local["labels"], backend=BACKENDS[policy],
                                                 **extra)
    return {"saved": saved, "routed": routed, "padded": padded}


def main() -> None:
    env = init_distributed()
    torch.set_num_threads(1)
    fused = sys.argv[1:] == ["fused"]
    if fused:
        kernels.set_kernel_backend("triton")
    report_from_rank0_and_exit(env, [measure(case, env) for case in (FUSED_CASES if fused else CASES)])


if __name__ == "__main__":
    main()
