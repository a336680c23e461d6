"""The activation formula against the bytes autograd really saves during a forward on CPU.

The model runs as the planner assumes for training: bf16 weights (fp32 router), bf16 autocast, fp32
residual stream. Saved tensors are collected with saved_tensors_hooks; unique storages are summed and
parameters left out. The formula uses the "cpu-reference" policy (SDPA math path, reference CE)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel
from megatron_zaya.planner.activations import activation_memory, measured_routing
from tests.saved_tensors import saved_storages


def bf16_model(config):
    torch.manual_seed(0)
    model = ZayaModel(config).to(torch.bfloat16)
    for block in model.layers:
        block.moe.router.float()
    return model


def measured_saved_bytes(model, tokens, labels, recompute_blocks=False, backend=SDPBackend.MATH, **inputs):
    """(bytes of the unique storages the forward saves for the backward, parameters left out; routed and
    padded fractions). `inputs`: the model's other keyword arguments (position_ids, document_ids)."""
    originals = None
    if recompute_blocks:
        originals = [block.forward for block in model.layers]
        for block, fwd in zip(model.layers, originals):
            block.forward = (lambda f: lambda *a: checkpoint(f, *a, use_reentrant=False))(fwd)
    try:
        with saved_storages(model) as seen, sdpa_kernel(backend):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(tokens, labels=labels, **inputs)
    finally:
        if originals:
            for block, fwd in zip(model.layers, originals):
                block.forward = fwd
    return sum(seen.values()), *measured_routing(out.routing)


MATH = ("cpu-reference", SDPBackend.MATH)
FLASH = ("cpu-flash", SDPBackend.FLASH_ATTENTION)   # CPU flash needs unit-stride q: only some shapes get it
CONFIGS = [
    ("zaya1-tiny", dict(num_layers=2, vocab_size=1024), 2, 64, *MATH),
    ("zaya1-tiny", dict(num_layers=1, hidden_size=160, num_attention_heads=4, num_query_groups=2, kv_channels=16,
                        router_hidden_size=40, moe_ffn_hidden_size=112, num_experts=3, vocab_size=1024), 2, 50, *MATH),
    ("zaya1-tiny", dict(num_layers=3, hidden_size=256, num_attention_heads=8, num_query_groups=2, kv_channels=32,
                        moe_ffn_hidden_size=512, vocab_size=2048), 1, 128, *MATH),
    ("zaya1-tiny", dict(num_layers=3, hidden_size=256, num_attention_heads=8, num_query_groups=2, kv_channels=32,
                        moe_ffn_hidden_size=512, vocab_size=2048), 1, 128, *FLASH),
]


@pytest.mark.parametrize("recompute", ["none", "selective"])
@pytest.mark.parametrize("preset,overrides,batch,seq,policy,backend", CONFIGS)
def test_activation_formula_matches_saved_tensors(preset, overrides, batch, seq, policy, backend, recompute):
    """Stored activations against the saved tensors, without recomputation and under
    set_recompute("selective"), which drops norm internals, QK-norm factors, RoPE casts, the math core's
    fp32 q/k/v and S x S probabilities, GELU, SiLU and SwiGLU outputs, and keeps the math core's bf16
    inputs and the fp32 RoPE tables instead."""
    config = model_config_from_preset(preset, **overrides)
    model = bf16_model(config)
    if recompute == "selective":
        model.set_recompute("selective")
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (batch, seq), generator=gen)
    labels = torch.randint(0, config.vocab_size, (batch, seq), generator=gen)
    measured, routed, padded = measured_saved_bytes(model, tokens, labels, backend=backend)
    predicted = activation_memory(config, seq, batch, recompute, policy=policy, routed_fraction=routed,
                                  padded_fraction=padded)
    assert abs(predicted.stored - measured) / measured < 0.01, (predicted.stored, measured, routed)
    if recompute == "selective":
        assert predicted.stored < 0.85 * predicted.stored_no_recompute
    else:
        # Without knowing the routing, the planner's upper bound (every token routed) stays within 20%.
        bound = activation_memory(config, seq, batch, "none", policy=policy).stored
        assert abs(bound - measured) / measured < 0.20


def test_full_recompute_formula_matches_checkpointed_blocks():
    config = model_config_from_preset("zaya1-tiny", num_layers=2, vocab_size=1024)
    model = bf16_model(config)
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, config.vocab_size, (2, 64), generator=gen)
    labels = torch.randint(0, config.vocab_size, (2, 64), generator=gen)
    measured_none, routed, padded = measured_saved_bytes(model, tokens, labels)
    measured_full, _, _ = measured_saved_bytes(model, tokens, labels, recompute_blocks=True)
    predicted = activation_memory(config, 64, 2, "full", policy="cpu-reference", routed_fraction=routed,
                                  padded_fraction=padded)
    # The checkpointed forward stores only block inputs; the formula's peak adds one block being recomputed.
    stored_inputs = predicted.stored - predicted.per_layer_no_recompute
    assert measured_full < measured_none / 2
    assert abs(stored_inputs - measured_full) / measured_full < 0.20, (stored_inputs, measured_full)


def test_fused_kernel_formula_under_triton_interpreter():
    """The GPU policy's kernel terms: the Triton autograd functions run interpreted on CPU (own process,
    TRITON_INTERPRET must be set before triton loads); attention stays on SDPA's CPU math path. Without
    recomputation and with selective recomputation, each also with packed documents."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", MEGATRON_ZAYA_KERNELS="triton")
    probe = Path(__file__).with_name("planner_fused_probe.py")
    proc = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert abs(result["predicted"] - result["measured"]) / result["measured"] < 0.02, result
    # The same model under selective recomputation (set_recompute("selective")) with the Triton kernels.
    selective = result["selective"]
    assert abs(selective["predicted"] - selective["measured"]) / selective["measured"] < 0.02, result
    assert selective["measured"] < 0.85 * result["measured"], result
    # Packed documents (--reset-attention-mask): the segmented conv kernel keeps its input and the shared
    # visibility, with and without selective recomputation.
    for key in ("packed none", "packed selective"):
        assert abs(result[key]["predicted"] - result[key]["measured"]) / result[key]["measured"] < 0.02, (key, result)


@pytest.mark.parametrize("modules", [["moe"], ["core_attn"], ["layernorm", "moe_act"],
                                     ["moe", "layernorm", "core_attn", "moe_act"]])
def test_recompute_modules_formula_matches_saved_tensors(modules):
    """--recompute-modules: each choice of pieces against the saved tensors (term by term, within 1%).
    With "moe" each MoE sublayer keeps only its inputs (the fp32 normed hidden and the router state); the
    planner's peak adds the one sublayer being recomputed (`recompute_live`), which the forward does not keep."""
    config = model_config_from_preset("zaya1-tiny", num_layers=2, vocab_size=1024)
    model = bf16_model(config)
    model.set_recompute("selective", modules=modules)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (2, 64), generator=gen)
    labels = torch.randint(0, config.vocab_size, (2, 64), generator=gen)
    measured, routed, padded = measured_saved_bytes(model, tokens, labels)
    predicted = activation_memory(config, 64, 2, "selective", policy="cpu-reference", routed_fraction=routed,
                                  padded_fraction=padded, recompute_modules=modules)
    kept = predicted.stored - predicted.recompute_live
    assert abs(kept - measured) / measured < 0.01, (kept, measured)
    assert (predicted.recompute_live > 0) == ("moe" in modules)
    assert predicted.stored < predicted.stored_no_recompute


@pytest.mark.parametrize("recompute", ["none", "selective"])
@pytest.mark.parametrize("policy,backend", [MATH, FLASH])
def test_packed_documents_formula_matches_saved_tensors(policy, backend, recompute):
    """--reset-attention-mask: the segmented convolution's terms replace the conv inputs, and the flash
    kernel keeps the one attention bias the model builds per forward (the math path adds it unkept).
    Under selective recomputation the segmented conv keeps only its input and the shared visibility."""
    config = model_config_from_preset("zaya1-tiny", num_layers=3, hidden_size=256, num_attention_heads=8,
                                      num_query_groups=2, kv_channels=32, moe_ffn_hidden_size=512, vocab_size=2048)
    model = bf16_model(config)
    if recompute == "selective":
        model.set_recompute("selective")
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (1, 128), generator=gen)
    labels = torch.randint(0, config.vocab_size, (1, 128), generator=gen)
    documents = (torch.arange(128) // 50)[None]
    forward = model.forward
    model.forward = lambda tokens, labels=None: forward(tokens, labels=labels, document_ids=documents)
    measured, routed, padded = measured_saved_bytes(model, tokens, labels, backend=backend)
    predicted = activation_memory(config, 128, 1, recompute, policy=policy, routed_fraction=routed,
                                  padded_fraction=padded, packed_documents=True)
    assert abs(predicted.stored - measured) / measured < 0.01, (predicted.stored, measured)


@pytest.mark.parametrize("mode,kv_heads", [("nosp", 2), ("sp", 2), ("sp", 1)])
def test_tensor_parallel_formula_matches_saved_tensors_on_each_rank(mode, kv_heads):
    """TP 2 on two processes: without --sequence-parallel the residuals, norms, router and LM head input
    are whole on each rank (the plan once divided them by TP: 30% low); with it they are split, and the
    experts' rows stay whole either way (SP all-gathers the group's tokens; once 8% low). With 1 KV head
    each rank keeps the whole replicated head's K/V (TP > KV heads; once counted as half a head)."""
    from tests.parallel.parallel_launcher import run_torchrun   # (planner_fused_probe.py imports this file alone)
    from tests.planner.tp_activations_worker import BATCH, CONFIG
    proc = run_torchrun(2, "tests/planner/tp_activations_worker.py", mode, str(kv_heads))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads(proc.stdout.strip().splitlines()[-1])
    config = model_config_from_preset("zaya1-tiny", **(CONFIG | {"num_query_groups": kv_heads}))
    for rank in ranks:
        predicted = activation_memory(config, config.seq_length, BATCH, "none", policy="cpu-flash", tensor_parallel=2,
                                      sequence_parallel=mode == "sp", routed_fraction=rank["routed"],
                                      padded_fraction=rank["padded"])
        assert abs(predicted.stored - rank["saved"]) / rank["saved"] < 0.03, (predicted.stored, rank)


def context_parallel_ranks(*args) -> list:
    """cp_activations_worker.py's cases, each with every rank's saved bytes and routing."""
    from tests.parallel.parallel_launcher import run_torchrun
    from tests.planner.cp_activations_worker import CASES, FUSED_CASES
    proc = run_torchrun(2, "tests/planner/cp_activations_worker.py", *args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    every = json.loads(proc.stdout.strip().splitlines()[-1])        # each rank's results, case by case
    return [{"case": case, "ranks": list(ranks)} for case, *ranks in zip(FUSED_CASES if args else CASES, *every)]


def check_context_parallel_case(result, config, policy) -> None:
    """The formula at CP 2 against each rank's saved tensors: within 1% (measured: 0.01% or less; +0.1% on CP
    rank 0, which keeps one chunk mask fewer than the rank the planner counts), full recomputation within 3%
    (-1.4%: the block checkpoints also keep the reference RoPE's fp32 tables, in one process too)."""
    _, recompute, modules, _, documents = result["case"]
    for rank in result["ranks"]:
        predicted = activation_memory(config, config.seq_length, 2, recompute, policy=policy, context_parallel=2,
                                      routed_fraction=rank["routed"], padded_fraction=rank["padded"],
                                      recompute_modules=modules, packed_documents=documents)
        kept = predicted.stored - predicted.recompute_live      # what the forward keeps (not the rerun unit)
        tolerance = 0.03 if recompute == "full" else 0.01
        assert abs(kept - rank["saved"]) / rank["saved"] < tolerance, (result["case"], kept, rank)


def test_context_parallel_formula_matches_saved_tensors_on_each_rank():
    """CP 2 on two processes (the trainer's path: parallelize_model, slice_batch_for_cp), on SDPA's CPU flash
    kernel and its math path, with and without GQA, recomputation and packed documents. What only CP keeps:
    the halo's second stacked projection weight and bf16 rows, the reference conv's padding per chunk, SDPA's
    materialised bottom-right causal masks, per-chunk fp32 K/V and probabilities on the math path, and the
    segmented conv over the halo steps (the planner was 12-17% low with GQA and without). Each chunk is
    projected on its own: its flash output is kept once (a concatenation first kept a copy: 2.3% more here)."""
    from tests.planner.tp_activations_worker import CONFIG
    for result in context_parallel_ranks():
        policy, _, _, kv_heads, _ = result["case"]
        config = model_config_from_preset("zaya1-tiny", **(CONFIG | {"num_query_groups": kv_heads}))
        check_context_parallel_case(result, config, policy)


def test_context_parallel_fused_kernel_formula_under_triton_interpreter():
    """CP 2 with the Triton kernels (interpreted): the fused conv keeps the halo's projection output as its
    left context; with packed documents the segmented kernel keeps the halo steps and chunk, and each layer's
    own visibility. With and without selective recomputation."""
    pytest.importorskip("triton")
    from megatron_zaya.planner.activations import StoragePolicy
    from tests.planner.cp_activations_worker import FUSED_CONFIG
    config = model_config_from_preset("zaya1-tiny", **FUSED_CONFIG)
    policy = StoragePolicy(attention="math", kv_repeated=True, loss="fused", kernels="fused")
    for result in context_parallel_ranks("fused"):
        check_context_parallel_case(result, config, policy)


def test_a_rerun_moe_sublayer_keeps_its_moe_act_tensors_while_it_runs():
    """With "moe" and "moe_act" together, the model turns "moe_act" off inside the rerun MoE sublayer
    (ZayaModel.set_recompute), so the sublayer live in the backward keeps the router GELU and SwiGLU outputs:
    the planner's `recompute_live` is that of "moe" alone (it once dropped them: 6.7% low at 1K tokens)."""
    config = model_config_from_preset("zaya1-tiny", num_layers=2, vocab_size=1024)
    model = ZayaModel(config)
    model.set_recompute("selective", modules=["moe_act", "moe"])
    act = [m for m in model.modules() if getattr(m, "recompute_module", None) == "moe_act"]
    assert act and not any(m.recompute_selective for m in act)
    both, moe = (activation_memory(config, 64, 2, "selective", recompute_modules=modules)
                 for modules in (["moe_act", "moe"], ["moe"]))
    assert both.recompute_live == moe.recompute_live > 0


def test_repeated_kv_under_context_parallelism_is_counted_once_for_the_later_chunks_keys():
    """On a GPU packed documents' bias sends attention to the memory-efficient kernel, which takes no grouped
    K/V heads: K/V are repeated to the HQ query heads (cca.kv_for_sdpa). Under CP they are repeated once, for
    the later chunk's keys (the whole sequence on rank 0), and both chunks' calls read views of them
    (parallel/context.py): S x 2 (K, V) x HQ dh bf16 per layer kept in place of the gathered grouped K/V, at any
    CP. ZAYA1-base 32K CP=2: 4.0 GB per GPU more (docs/PLANNER.md; 5.4 GB when each chunk repeated its own)."""
    import dataclasses

    from megatron_zaya.planner.activations import POLICIES
    base = model_config_from_preset("zaya1-base")
    hq, hkv, dh = base.num_attention_heads, base.num_query_groups, base.kv_channels
    grouped = dataclasses.replace(POLICIES["gpu"], mask_repeats_kv=False)
    seq = 32768
    for cp in (2, 4):
        repeated, kept_grouped = (activation_memory(base, seq, 1, policy=policy, context_parallel=cp,
                                                    packed_documents=True).stored
                                  for policy in ("gpu", grouped))
        want = base.num_layers * seq * 2 * 2 * (hq - hkv) * dh
        assert repeated - kept_grouped == pytest.approx(want, rel=1e-12), cp
        if cp == 2:
            assert round(want / 1e9, 1) == 4.0
