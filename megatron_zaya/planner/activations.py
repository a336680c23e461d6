"""Activation memory: the tensors autograd saves for the backward pass, term by term.

Counted per token, per layer, from the model's code path (model/*.py with the kernels' reference ops,
bf16 autocast, bf16 weights and an fp32 residual stream). Notation: D hidden, HQ/HKV query/KV heads,
dh head dim, C = (HQ + HKV) dh conv channels, R router width, K = E + 1 router classes, F expert
width, V vocabulary, r = rotary dims, S sequence length, rho = share of tokens routed to a real expert
(1 = none skipped, the planner's upper bound).

Two storage policies differ only where the devices' code paths differ:
* "gpu" (the planner's default): flash attention (saves q, k, v, the output and an fp32 log-sum-exp
  per head; never the S x S scores; the output is the projection's input, one tensor), K/V heads not repeated for GQA; the fused cross-entropy saves
  bf16 logits (2V per token) and an fp32 log-sum-exp;
* "cpu-reference": what the CPU path saves when SDPA takes its math path: fp32 q, k, v with K/V
  repeated to HQ heads (SDPA's math path repeats them under enable_gqa) and the S x S probabilities
  stored (4 HQ S bytes per token), and the reference (row-blocked) cross-entropy's unscaled gradient,
  made in the forward in the logits' memory (2V per token); the experts' rows padded to bucketed
  counts (model/experts.py), `padded_fraction` rows per token instead of rho;
* "cpu-flash": the CPU path when SDPA takes its flash kernel (bf16, K/V heads not repeated: the
  kernel takes enable_gqa; no S x S).
The tests pin SDPA's backend and measure both CPU policies.
CCA's four input projections run as one matmul on their stacked weights: the stacked bf16 weight is
saved for the backward, a per-layer constant (not per token), `projection_weight_bytes`. A term counts
bytes per local token, per sequence of the micro-batch or once (`Term.per`).
Context parallelism (parallel/context.py): a rank keeps S / CP tokens, as two chunks of S / 2CP, and
* flash attention saves the all-gathered K/V of the whole sequence (CP times the local K/V), once for both
  chunks, also where they are repeated to the query heads (cca.kv_for_sdpa: once, for the later chunk, whose
  keys hold the earlier one's; on rank 0 that is the whole sequence); the math path's fp32 K/V are copies per
  chunk, of the keys up to the chunk's end: chunk i and 2CP-1-i read (i + 1) and (2CP - i) chunk lengths,
  (2CP + 1) / 2 per query token on every rank (`chunk_reads`), and its probabilities are (S / 2CP) x that
  many keys;
* each chunk is projected on its own (linear_proj keeps a view of the output its flash core keeps: the output
  once, as in one process);
* the halo projects the `lookback` hidden rows left of each chunk with the stacked weights again: a second
  stacked weight per layer, the rows' bf16 cast and, for the fused conv (which keeps its left context),
  their whole projection output; the reference conv's causal padding is per chunk (two per sequence);
* on CPU, SDPA materialises the bottom-right causal mask of a chunk whose keys run past its queries (bf16,
  queries x keys; `StoragePolicy.causal_mask_kept`) and its flash kernel keeps it: (2CP + 1) (S / 2CP)^2
  per layer on every rank but the first (the planner counts the largest rank);
* packed documents: each chunk's segmented conv runs over the halo steps and the chunk (`lookback` more
  steps per chunk), on a new tensor of C channels (not the stacked projection output) and its own
  visibility (not the one all layers share);
* the index that puts the gathered K/V in sequence order (int64, S) is shared by the layers.
Tensor parallelism (`Term.tp`): what TP splits by heads, FFN or vocabulary is divided by TP; the residuals,
norms, router and the LM head's input only under sequence parallelism; the experts' token rows never (SP
all-gathers the TP group's tokens before the experts).

On top of the saved tensors, the fused cross-entropy's backward begins with the gradient of the
logits (bf16, 2V per token) while everything saved is still alive: `backward_transient`, counted in
the planner's total but not in "stored" (which is what the tests measure). The reference
cross-entropy scales its saved gradient in place: no transient.

Recomputation: "selective" is what `pretrain_zaya.py --recompute-granularity selective` does
(model/recompute.py): it recomputes the cheap elementwise pieces and runs no matmul or conv twice. Dropped
(`Term.recomputed_by`, the --recompute-modules piece that drops it): the QK-norm factors and RoPE's cos/sin casts,
the math-path attention core's fp32 q/k/v and S x S probabilities (core_attn), the router's GELU outputs
and the experts' SwiGLU output (the inputs of fc2/out_proj and of the down projection, recomputed from the
activations' inputs before those matmuls' backward) and the reference SwiGLU's SiLU output (moe_act).
"layernorm" drops nothing: every RMSNorm, Triton or reference, keeps only its input and rstd.
Kept instead (`Term.kept_by`): the recomputed attention core's bf16 q, k, v and, on the reference path,
the fp32 cos/sin tables the recomputed RoPE reads. The "moe" piece keeps of each MoE sublayer (`Term.moe`)
only its inputs and reruns one at a time. "full" keeps only each block's inputs (fp32 residual, fp32
router state for EDA) and re-runs one block at a time, so one block's activations are live on top.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from megatron_zaya.config import ModelConfig
from megatron_zaya.model.experts import bucketed_rows
from megatron_zaya.model.recompute import DEFAULT_MODULES, check_modules
from megatron_zaya.planner.layout import tp_rank_config


@dataclass(frozen=True)
class StoragePolicy:
    attention: str = "flash"          # "flash": q, k, v, out, lse; "math": fp32 q, k, v and S x S probabilities
    kv_repeated: bool = False         # K/V expanded to HQ heads inside attention (SDPA's CPU math path)
    loss: str = "fused"               # "fused": bf16 logits + lse; "reference": bf16 logits (lse recomputed)
    kernels: str = "fused"            # "fused": the Triton RMSNorm/residual/SwiGLU/RoPE/permute/CCA-conv autograd
                                      # functions; "reference": the torch reference ops (kernels/reference.py)
    mask_repeats_kv: bool = False     # an explicit mask (packed documents) gets K/V repeated to HQ heads: GPU
                                      # flash takes no mask, the memory-efficient kernel no grouped heads
    causal_mask_kept: bool = False    # CP's bottom-right causal chunks: SDPA materialises the mask (CPU) and
                                      # the flash kernel keeps it; GPU flash takes that causality as it is


POLICIES = {
    "gpu": StoragePolicy("flash", False, "fused", "fused", mask_repeats_kv=True),
    "cpu-reference": StoragePolicy("math", True, "reference", "reference", causal_mask_kept=True),
    "cpu-flash": StoragePolicy("flash", False, "reference", "reference", causal_mask_kept=True),
}


def storage_policy(name) -> StoragePolicy:
    """A policy by name, or a StoragePolicy passed through."""
    if isinstance(name, StoragePolicy):
        return name
    if name not in POLICIES:
        raise ValueError(f"--activation-policy={name}: choose one of {sorted(POLICIES)}")
    return POLICIES[name]


@dataclass(frozen=True)
class Term:
    name: str
    bytes: float                      # per `per`
    recomputed_by: str | None = None  # the --recompute-modules piece that recomputes it (then not stored)
    kept_by: str | None = None        # stored only when that piece is recomputed (what the recomputed piece keeps)
    moe: bool = False                 # inside the MoE sublayer (the "moe" piece keeps only the sublayer's inputs)
    tp: str = "split"                 # under TP: "split" by heads, FFN or vocabulary; "sequence": whole on
                                      # each rank, split by sequence parallelism; "gathered": whole on each
                                      # rank either way (the experts' rows: SP all-gathers the group's tokens)
    per: str = "token"                # "token": per local token; "sequence": per sequence of the micro-batch;
                                      # "once": whatever the micro-batch (a layer's or the model's constant)

    def stored(self, modules=()) -> bool:
        """Whether autograd keeps this term when the pieces `modules` are recomputed (none: ())."""
        if self.moe and "moe" in modules:
            return False
        return self.recomputed_by not in modules and (self.kept_by is None or self.kept_by in modules)


def chunk_reads(seq_length: int, context_parallel: int = 1) -> tuple[float, float]:
    """(queries per attention call, keys a query's call reads in units of that length, averaged over a rank's
    calls): one causal call over the sequence in one process, (S, 1); under CP each of a rank's two chunks
    of S / 2CP queries reads the keys up to its end, chunk i's (i + 1) and chunk 2CP-1-i's (2CP - i) chunk
    lengths: (S / 2CP, (2CP + 1) / 2) on every rank."""
    if context_parallel == 1:
        return seq_length, 1.0
    return seq_length / (2 * context_parallel), (2 * context_parallel + 1) / 2


def conv_terms(config: ModelConfig, pol: StoragePolicy, context_parallel: int, packed_documents: bool) -> list[Term]:
    """What CCA's convolutions and value shift keep. Under CP a chunk's left context comes from the halo:
    the reference conv's padding is per chunk, and the segmented conv runs over the halo steps in front."""
    hq, hkv, dh, lookback = config.num_attention_heads, config.num_query_groups, config.kv_channels, config.cca_lookback
    c = (hq + hkv) * dh
    fused = pol.kernels == "fused"
    chunks = 1 if context_parallel == 1 else 2           # a rank's pieces of each sequence
    if not packed_documents:
        # The fused conv keeps packed q0/k0, a view that keeps the whole stacked projection output alive.
        if fused:
            return [Term("attention: conv input (packed q0/k0: the stacked projection output, bf16)",
                         2 * (hq + 2 * hkv) * dh)]
        return [Term("attention: conv inputs (depthwise + grouped, bf16)", 2 * 2 * c),
                Term("attention: conv inputs' causal padding or left context (bf16)",
                     conv_padding_bytes_per_sequence(config, pol) * chunks, per="sequence")]
    # The segmented conv keeps its input and the value shift its visibility cast. In one process the input
    # is a view that keeps the whole stacked projection output alive; under CP it is the halo steps and the
    # chunk, concatenated (C channels, lookback more steps per chunk). The PyTorch one also keeps the shifted
    # input it scales, both grouped-conv taps (bf16) and three visibility casts, under core_attn; the fused
    # kernel keeps nothing else (the visibility: outer_terms, or under CP each layer's own, below).
    if context_parallel == 1:
        terms = [Term("attention: segmented conv input (the stacked projection output, bf16) + value-shift "
                      "visibility", 2 * (hq + 2 * hkv) * dh + 2)]
    else:
        terms = [Term("attention: segmented conv input (halo steps + chunk, bf16) + value-shift visibility",
                      2 * c + 2),
                 Term("attention: segmented conv input's halo steps (bf16)", chunks * lookback * 2 * c,
                      per="sequence"),
                 Term("attention: segmented conv's lag visibility (bool, halo steps + chunk)", lookback,
                      kept_by=None if fused else "core_attn", tp="sequence"),
                 Term("attention: segmented conv's lag visibility of the halo steps (bool)",
                      chunks * lookback * lookback, kept_by=None if fused else "core_attn", tp="sequence",
                      per="sequence")]
    if not fused:
        internals = 3 * 2 * c + 3 * 2
        terms.append(Term("attention: segmented conv shifted input, 2 taps (bf16), visibility casts", internals,
                          "core_attn"))
        if context_parallel > 1:
            terms.append(Term("attention: segmented conv shifted input, taps, casts: the halo steps",
                              chunks * lookback * internals, "core_attn", per="sequence"))
    return terms


def core_terms(config: ModelConfig, seq_length: int, pol: StoragePolicy, context_parallel: int,
               packed_documents: bool) -> list[Term]:
    """The attention core (SDPA) and what it keeps; under CP per chunk (`chunk_reads`)."""
    hq, hkv, dh = config.num_attention_heads, config.num_query_groups, config.kv_channels
    chunk, reads = chunk_reads(seq_length, context_parallel)
    kv_heads = hq if pol.kv_repeated or (packed_documents and pol.mask_repeats_kv) else hkv
    if pol.attention == "flash":
        # K/V as gathered (the whole sequence), or repeated to the query heads (cca.kv_for_sdpa) once for the keys
        # of the later chunk (the whole sequence on rank 0): both chunks' calls read views of them.
        kv_rows = context_parallel
        # The flash output is laid out (B, S, H, dh), so the projection's input is a view of it: one tensor (the
        # output projection input term; under CP each chunk is projected on its own, from a view of its output).
        terms = [Term("attention: flash core (q, all-gathered k/v, lse; out = projection input)",
                      2 * hq * dh + 2 * 2 * kv_heads * dh * kv_rows + 4 * hq)]
        if context_parallel > 1 and pol.causal_mask_kept and not packed_documents:
            # Every chunk but the first of the sequence: (S/2CP) x its keys; the largest rank, 2CP + 1 chunks.
            terms.append(Term("attention: CP chunks' bottom-right causal masks (bf16, materialised by SDPA)",
                              2 * (2 * context_parallel + 1) * chunk ** 2, tp="gathered", per="once"))
        return terms
    return [
        Term("attention: math core q, k, v (fp32)", 4 * hq * dh + 2 * 4 * kv_heads * dh * reads, "core_attn"),
        Term("attention: math core S x S probabilities (fp32)", 4 * hq * chunk * reads, "core_attn"),
        Term("attention: recomputed math core's inputs q, k, v (bf16)",
             2 * hq * dh + 2 * 2 * hkv * dh * context_parallel, kept_by="core_attn"),
    ]


def halo_terms(config: ModelConfig, pol: StoragePolicy, packed_documents: bool) -> list[Term]:
    """CP's halo (parallel/context.py): the `lookback` hidden rows left of each of a rank's two chunks,
    projected with the stacked weights again (a second stacked weight kept per layer), their bf16 cast kept
    (whole D on every TP rank) and, where the fused conv takes them as its left context, their whole
    stacked projection output (the segmented conv concatenates them instead, and the reference conv too)."""
    hq, hkv, dh, lookback = config.num_attention_heads, config.num_query_groups, config.kv_channels, config.cca_lookback
    terms = [Term("CP halo: the stacked projection weight again (bf16)", projection_weight_bytes(config), per="once"),
             Term("CP halo: bf16 cast of the hidden rows left of each chunk", 2 * lookback * 2 * config.hidden_size,
                  tp="gathered", per="sequence")]
    if pol.kernels == "fused" and not packed_documents:
        terms.append(Term("CP halo: their stacked projection output (the fused conv's left context, bf16)",
                          2 * lookback * 2 * (hq + 2 * hkv) * dh, per="sequence"))
    return terms


def layer_terms(config: ModelConfig, seq_length: int, policy: str = "gpu", context_parallel: int = 1,
                routed_fraction: float = 1.0, padded_fraction: float | None = None,
                packed_documents: bool = False) -> list[Term]:
    pol = storage_policy(policy)
    d, hq, hkv, dh = config.hidden_size, config.num_attention_heads, config.num_query_groups, config.kv_channels
    r, k, f, rot = config.router_hidden_size, config.num_router_classes, config.moe_ffn_hidden_size, config.rotary_dim
    rho = routed_fraction
    # Expert rows per token after the CPU path's bucket padding (about rho * 17/16; a group pads to >= 16 rows).
    rows = rho if padded_fraction is None else padded_fraction
    fused = pol.kernels == "fused"
    # Both the Triton norms and the reference's autograd functions (kernels/reference.py): each RMSNorm
    # keeps its fp32 input and rstd, each residual merge its sublayer output (bf16) and its fp32 residual
    # input, which is also the input a norm keeps (the block's input norm, the merge's following norm).
    terms = [
        Term("block input residual (fp32) + rstd", 4 * d + 4, tp="sequence"),
        Term("attention merge: sublayer output (bf16) + rstd", 2 * d + 4, tp="sequence"),
        Term("MoE merge: merged residual (fp32) + MoE output (bf16)", 4 * d + 2 * d, tp="sequence"),
        Term("attention: bf16 input cast of the stacked projection (q, k, v_current, v_previous)", 2 * d,
             tp="sequence"),
        Term("attention: the stacked projection weight (bf16)", projection_weight_bytes(config), per="once"),
    ]
    terms += conv_terms(config, pol, context_parallel, packed_documents)
    terms += [
        Term("attention: q, k before QK-norm (bf16)", 2 * hq * dh + 2 * hkv * dh),
        # kernels.qk_norm keeps each head's fp32 norm (the factors are recomputed from it).
        Term("attention: QK-norm's fp32 norms", 4 * hq + 4 * hkv, "core_attn"),
    ]
    if not fused:   # the fused RoPE keeps the fp32 cos/sin tables, shared by every layer (see outer_terms)
        terms.append(Term("attention: RoPE cos/sin (bf16, for q and k)", 4 * 2 * rot, "core_attn", tp="sequence"))
    terms += core_terms(config, seq_length, pol, context_parallel, packed_documents)
    if context_parallel > 1:
        terms += halo_terms(config, pol, packed_documents)
    terms.append(Term("attention: output projection input (bf16)", 2 * hq * dh))
    # The MoE sublayer. Its input, the normed hidden (fp32), is the router's fp32 input (one storage).
    # The router is replicated on the TP ranks (whole without SP); the experts split their FFN.
    moe = [
        Term("router: fp32 input + norm input", 4 * d + 4 * r, tp="sequence"),
        Term("router: norm rstd", 4, tp="sequence"),
        Term("router: MLP (fc1 in, GELU ins, softmax, index, mask)", 3 * 4 * r + 4 * k + 8 + 1, tp="sequence"),
        Term("router: GELU outputs", 2 * 4 * r, "moe_act", tp="sequence"),
        Term("experts: SwiGLU input x (bf16)", rows * 2 * d, tp="gathered"),
        Term("experts: SwiGLU input gate_up (bf16)", rows * 4 * f),
    ]
    if fused:
        moe += [
            Term("experts: permute order, gate (fp32), expert outputs (bf16)", 4 + rho * (8 + 2 * d), tp="gathered"),
            Term("experts: SwiGLU output (bf16, the down projection's input)", rows * 2 * f, "moe_act"),
        ]
    else:
        moe += [
            # The reference un-permute is a gather (kernels/reference.py): it keeps the order, the bf16 gate
            # per row and the expert outputs (the gate product), not a scatter source.
            Term("experts: permute/unpermute (index, gate, expert outputs)", rho * (8 + 2 + 2 * d), tp="gathered"),
            Term("experts: SwiGLU output (bf16, the down projection's input)", rows * 2 * f, "moe_act"),
            Term("experts: SiLU output", rows * 2 * f, "moe_act"),
        ]
    if padded_fraction is not None:
        moe.append(Term("experts: row padding indices (int64, in and out)", 8 * (rho + rows), tp="gathered"))
    return terms + [dataclasses.replace(t, moe=True) for t in moe]


def outer_terms(config: ModelConfig, policy: str = "gpu", packed_documents: bool = False, seq_length: int = 0,
                context_parallel: int = 1) -> list[Term]:
    """Saved tensors outside the blocks, or shared by them: embedding, input scaling, final norm, LM head, loss,
    the RoPE tables and what the layers share under packed documents or CP."""
    d, v = config.hidden_size, config.vocab_size
    fused = storage_policy(policy).kernels == "fused"
    loss = Term("loss: bf16 logits + lse + labels (fused CE)", 2 * v + 4 + 8) if storage_policy(policy).loss == "fused" else \
        Term("loss: unscaled bf16 logits gradient + label mask (reference blocked CE)", 2 * v + 1)
    terms = [
        Term("embedding indices + input scaling (bf16)", 8 + 2 * d, tp="sequence"),
        Term("final norm: fp32 input", 4 * d, tp="sequence"),
        Term("final norm: rstd", 4, tp="sequence"),
        Term("LM head input (bf16)", 2 * d, tp="sequence"),
        loss,      # the logits: split by vocabulary
    ]
    # The fused RoPE keeps the fp32 tables; the reference one its bf16 casts per layer, unless recomputed.
    terms.append(Term("RoPE cos/sin tables (fp32, shared by all layers)", 2 * 4 * config.rotary_dim,
                      kept_by=None if fused else "core_attn", tp="sequence"))
    if packed_documents and context_parallel == 1:
        # The fused or recomputed segmented convs keep the boolean visibility all layers share (under CP each
        # layer's own: conv_terms).
        lags = config.cca_depthwise_kernel - 1 + config.cca_grouped_kernel - 1
        terms.append(Term("packed documents: conv lag visibility (bool, shared by all layers)", lags,
                          kept_by=None if fused else "core_attn", tp="sequence"))
    if context_parallel > 1:    # index_select keeps it; built once per length (context.gathered_sequence_order)
        terms.append(Term("CP: the gathered K/V's sequence order (int64, shared by all layers)", 8 * seq_length,
                          tp="gathered", per="once"))
    return terms


def projection_weight_bytes(config: ModelConfig) -> int:
    """Per layer: the bf16 stack of linear_q, linear_k, linear_v_current and linear_v_previous that CCA's
    one input matmul saves for its input gradient ((HQ + 2 HKV) dh rows of D)."""
    rows = (config.num_attention_heads + 2 * config.num_query_groups) * config.kv_channels
    return 2 * rows * config.hidden_size


def conv_padding_bytes_per_sequence(config: ModelConfig, policy="gpu", packed_documents: bool = False) -> int:
    """The conv inputs carry the causal left padding: (ctx + ctx - 1) extra steps of C bf16 channels
    (the two convolutions of the reference path; not the fused kernel's, nor the segmented conv's).
    Under CP, per chunk: the halo's left context takes the padding's place."""
    if storage_policy(policy).kernels == "fused" or packed_documents:
        return 0
    c = (config.num_attention_heads + config.num_query_groups) * config.kv_channels
    ctx = config.cca_depthwise_kernel - 1 + config.cca_grouped_kernel - 1
    return 2 * c * (2 * ctx - 1)


@dataclass
class ActivationMemory:
    stored_no_recompute: float        # bytes for one micro-batch without recomputation
    stored: float                     # bytes with the chosen recomputation (peak, one micro-batch)
    per_layer_no_recompute: float
    outer: float
    terms: list[Term]
    backward_transient: float = 0.0   # live on top at the start of the backward: the logits' gradient
    recompute_live: float = 0.0       # of `stored`: the unit being recomputed in the backward (full: a block;
                                      # --recompute-modules moe: an MoE sublayer); the forward keeps the rest


def document_bias_bytes(seq_length: int, micro_batch_size: int, context_parallel: int = 1) -> float:
    """Packed documents: the bf16 attention bias the model builds once per forward and every layer's
    attention keeps (model/documents.py): (B, 1, S, S), or under CP each rank's two chunk biases of
    (S/2CP) x (the keys up to the chunk's end), (2 CP + 1) (S/2CP)^2 per sequence on every rank."""
    if context_parallel == 1:
        return 2 * micro_batch_size * seq_length ** 2
    half = seq_length / (2 * context_parallel)
    return 2 * micro_batch_size * (2 * context_parallel + 1) * half ** 2


def measured_routing(routing) -> tuple[float, float]:
    """(routed_fraction, padded_fraction) of a forward's routing (ModelOutput.routing, one per MoE layer): the
    share of tokens sent to an expert, and the expert rows per token after the CPU path's bucket padding."""
    tokens = sum(int(r.counts.sum()) for r in routing)
    routed = sum(int(r.counts[:-1].sum()) for r in routing)
    padded = sum(bucketed_rows(c) for r in routing for c in r.counts[:-1].tolist())
    return routed / tokens, padded / tokens


def activation_memory(config: ModelConfig, seq_length: int, micro_batch_size: int, recompute: str = "none",
                      policy: str = "gpu", tensor_parallel: int = 1, context_parallel: int = 1,
                      routed_fraction: float = 1.0, padded_fraction: float | None = None,
                      recompute_modules=None, packed_documents: bool = False,
                      sequence_parallel: bool = True) -> ActivationMemory:
    """Peak saved-for-backward bytes of one micro-batch on one GPU. `recompute_modules` (with "selective"):
    the pieces recomputed, by Megatron's --recompute-modules names (default: the three cheap ones).
    `packed_documents` (--reset-attention-mask): the segmented convolution and the shared attention bias
    (a math-path core adds the bias without keeping it). `sequence_parallel` (--sequence-parallel): under
    TP > 1, whether the terms of `tp="sequence"` are split too."""
    local_tokens = micro_batch_size * seq_length / context_parallel
    config = tp_rank_config(config, tensor_parallel)       # TP > KV heads: a whole KV head on each rank
    terms = layer_terms(config, seq_length, policy, context_parallel, routed_fraction, padded_fraction,
                        packed_documents)
    outer_list = outer_terms(config, policy, packed_documents, seq_length, context_parallel)
    if recompute == "selective":
        modules = check_modules(DEFAULT_MODULES if recompute_modules is None else recompute_modules)
    elif recompute_modules:
        raise ValueError(f"--recompute-modules goes with --recompute selective, not {recompute}")
    else:
        modules = ()
    # The ranks a term is split over, by its Term.tp, and how many of its units a micro-batch has (Term.per).
    share = {"split": tensor_parallel, "sequence": tensor_parallel if sequence_parallel else 1, "gathered": 1}
    count = {"token": local_tokens, "sequence": micro_batch_size, "once": 1}

    def per_rank(chosen_terms) -> float:
        return sum(t.bytes * count[t.per] / share[t.tp] for t in chosen_terms)

    def per_layer(chosen) -> float:
        return per_rank(t for t in terms if t.stored(chosen))

    def outer(chosen) -> float:
        return per_rank(t for t in outer_list if t.stored(chosen))

    layers = config.num_layers
    layer_full, outer_all = per_layer(()), outer(())
    # A recomputed unit keeps only its inputs: a block its fp32 residual, an MoE sublayer its fp32 normed
    # hidden (the same size), and after the first block the fp32 router state (EDA). The peak adds the
    # one unit being recomputed in the backward (`recompute_live`).
    checkpoint_inputs = (4 * config.hidden_size * layers + 4 * config.router_hidden_size * (layers - 1)) * local_tokens
    live = 0.0
    if recompute == "none":
        kept = layers * layer_full + outer_all
    elif recompute == "selective":
        kept = layers * per_layer(modules) + outer(modules)
        if "moe" in modules:
            # The rerun sublayer keeps what it saves: "moe_act" is off inside it (ZayaModel.set_recompute).
            inner = tuple(m for m in modules if m not in ("moe", "moe_act"))
            kept += checkpoint_inputs / share["sequence"]
            live = per_rank(t for t in terms if t.moe and t.stored(inner))
    elif recompute == "full":
        kept, live = checkpoint_inputs / share["sequence"] + outer_all, layer_full
    else:
        raise ValueError(f"--recompute={recompute}: choose one of none, selective, full")
    # The fused cross-entropy's backward starts with the bf16 d(logits) over the whole vocabulary while
    # every saved tensor is still alive; the reference one scales the gradient it saved, in place.
    per_token_grad = 2 * config.vocab_size if storage_policy(policy).loss == "fused" else 0
    transient = per_token_grad * local_tokens / tensor_parallel
    bias = 0.0
    if packed_documents and storage_policy(policy).attention == "flash":
        bias = document_bias_bytes(seq_length, micro_batch_size, context_parallel)
    return ActivationMemory(layers * layer_full + outer_all + bias, kept + live + bias, layer_full, outer_all,
                            terms + outer_list, transient, live)
