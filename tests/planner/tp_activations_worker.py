"""Worker of test_planner_activations.py: the bytes a bf16 model's forward saves for the backward on
each rank of TP = 2 (hand-rolled tensor parallelism, gloo), with or without sequence parallelism, and the
routing fractions the planner takes. Rank 0 prints every rank's numbers as one JSON line.

    torchrun --nproc-per-node 2 tests/planner/tp_activations_worker.py sp|nosp [KV heads, default 2]

With 1 KV head, TP 2 is more ranks than KV heads: each rank holds the whole KV head (replicated).
"""
import sys

import torch
from torch.nn.attention import SDPBackend

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.parallel.apply import parallelize_model
from megatron_zaya.parallel.launch import init_distributed
from megatron_zaya.parallel.state import ParallelState
from tests.parallel.parallel_launcher import report_from_rank0_and_exit
from tests.planner.test_planner_activations import bf16_model, measured_saved_bytes

# zaya1-tiny at D 256 with 8 query heads over 2 K/V groups: TP 2 splits the heads, the FFN and the vocabulary.
CONFIG = dict(num_layers=2, hidden_size=256, num_attention_heads=8, num_query_groups=2, kv_channels=32,
              moe_ffn_hidden_size=512, vocab_size=2048, seq_length=128)
BATCH = 2


def main() -> None:
    sequence_parallel = sys.argv[1] == "sp"
    env = init_distributed()
    torch.set_num_threads(1)
    kv_heads = int(sys.argv[2]) if len(sys.argv) > 2 else CONFIG["num_query_groups"]
    config = model_config_from_preset("zaya1-tiny", **(CONFIG | {"num_query_groups": kv_heads}))
    pstate = ParallelState(2, 1, 1, 2, sequence_parallel=sequence_parallel, model_config=config)
    model = parallelize_model(bf16_model(config), pstate)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (BATCH, config.seq_length), generator=generator)
    labels = torch.randint(0, config.vocab_size, (BATCH, config.seq_length), generator=generator)
    saved, routed, padded = measured_saved_bytes(model, tokens, labels, backend=SDPBackend.FLASH_ATTENTION)
    report_from_rank0_and_exit(env, {"saved": saved, "routed": routed, "padded": padded})


if __name__ == "__main__":
    main()
