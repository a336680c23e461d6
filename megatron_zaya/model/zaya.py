"""The ZAYA1 language model: embedding, input scaling, blocks, final norm, tied head, causal LM loss.

Initialisation (the transformers reference's placeholder inits are not all trainable):
- linear and embedding weights ~ N(0, init_method_std), except the router's (below) and, when
  embedding_init_method_std is set (Megatron's --embedding-init-method-std), the embedding's ~ N(0, that);
  output projections of each sublayer
  (attention linear_proj, expert down) ~ N(0, init_method_std / sqrt(2 * num_layers)) as in Megatron;
- expert weights ~ N(0, init_method_std); linear biases 0; norm weights 1; residual/input scales 1, biases 0;
- CCA convolutions keep PyTorch's default (kaiming-uniform) init, so the conv path starts at the
  scale of its inputs;
- key temperature T = key_temperature_init (1.0; the reference's 0 would make every logit zero);
- router linears (down_proj, fc1, fc2, out_proj) ~ N(0, 1 / fan_in): their logits then vary across
  tokens by O(1) from the start. With N(0, 0.02) the softmax is uniform to ~1e-3, so the balancing
  biases alone would pick the expert and move every token at once from one expert to the next;
- EDA gamma 1; balancing biases 0 with skip_class_bias_init (-1) for the skip class.

Activation recomputation (Megatron's --recompute-granularity) is a memory policy, not part of the math
or of the config: `set_recompute("full", ...)` makes training forwards keep only the inputs of each
checkpointed unit of blocks and run it again during the backward; `set_recompute("selective")` makes
the blocks and the final norm recompute their cheap elementwise pieces, or the pieces Megatron's
--recompute-modules names, the whole MoE sublayer among them (model/recompute.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from megatron_zaya import kernels
from megatron_zaya.config import ModelConfig
from megatron_zaya.model import recompute
from megatron_zaya.model.block import ZayaBlock
from megatron_zaya.model.documents import PackedDocuments
from megatron_zaya.model.norm import InputScaling, RMSNorm
from megatron_zaya.model.rope import rope_cos_sin
from megatron_zaya.model.router import Routing
from megatron_zaya.model.weight_casts import WeightCasts


@dataclass
class ModelOutput:
    logits: torch.Tensor | None          # (B, S, V) when no labels were given
    token_losses: torch.Tensor | None    # (B, S) fp32 per-token cross-entropy when labels were given
    routing: list[Routing]               # one per MoE layer


class TokenEmbedding(nn.Embedding):
    """nn.Embedding whose weight gradient is summed in fp32 when the weight is stored in bf16 (ZeRO-1;
    kernels.embedding)."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return kernels.embedding(tokens, self.weight)


class ZayaModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config.validate()
        self.embedding = TokenEmbedding(config.vocab_size, config.hidden_size)
        self.input_scaling = InputScaling(config.hidden_size)
        self.layers = nn.ModuleList(ZayaBlock(config, i) for i in range(config.num_layers))
        self.final_norm = RMSNorm(config.hidden_size, config.norm_epsilon)
        self.output_layer = (nn.Linear(config.hidden_size, config.vocab_size, bias=False)
                             if config.untie_embeddings_and_output_weights else None)
        self.recompute_granularity: str | None = None   # set_recompute
        self.recompute_units: list[range] = []      # runs of blocks recomputed in the backward (full)
        self.recompute_modules: tuple[str, ...] = ()  # the pieces recomputed (selective; recompute.MODULES)
        self.weight_casts = WeightCasts()   # bf16 copies of the experts' and LM head's weights (weight_casts.py)
        for block in self.layers:
            block.moe.experts.weight_casts = self.weight_casts
        self.reset_parameters()

    def set_force_load_balancing(self, enabled: bool) -> None:
        """Megatron-LM's --moe-router-force-load-balancing, for benchmarks only: every router sends
        token i of its batch to expert i mod E (an exactly balanced load, no skip), whatever it
        learned; the gate is still its probability of that expert. Not for training a model."""
        for block in self.layers:
            block.moe.router.force_balanced = enabled

    def set_recompute(self, granularity: str | None, method: str | None = None, num_layers: int | None = None,
                      modules=None) -> None:
        """Megatron's activation recomputation; None: off.

        "full": runs of blocks keep only their inputs and run again in the backward. method "uniform"
        (the default): the blocks in consecutive runs of `num_layers` (default 1 = every block alone),
        each run one unit; "block": the first `num_layers` blocks (default all), each alone.
        "selective": every block and the final norm recompute their cheap elementwise pieces (norm
        internals, QK-norm and RoPE, the router's GELU and the experts' SwiGLU outputs, a math-path
        attention core; model/recompute.py); method and num_layers do not apply. `modules` (Megatron's
        --recompute-modules names, recompute.MODULES; default recompute.DEFAULT_MODULES) chooses the
        pieces; "moe" reruns each whole MoE sublayer."""
        n = len(self.layers)
        units = []
        if granularity == "full":
            method = method or "uniform"
            if num_layers is None:
                num_layers = 1 if method == "uniform" else n
            if method == "uniform":
                units = [range(i, min(i + num_layers, n)) for i in range(0, n, num_layers)]
            elif method == "block":
                units = [range(i, i + 1) for i in range(min(num_layers, n))]
            else:
                raise ValueError(f"--recompute-method={method}: choose uniform or block")
        elif granularity == "selective":
            if method is not None or num_layers is not None:
                raise ValueError("--recompute-method and --recompute-num-layers go with --recompute-granularity full")
            modules = recompute.check_modules(recompute.DEFAULT_MODULES if modules is None else modules)
        elif granularity is not None:
            raise ValueError(f"--recompute-granularity={granularity}: choose full or selective")
        if granularity != "selective" and modules:
            raise ValueError("--recompute-modules goes with --recompute-granularity selective")
        self.recompute_granularity, self.recompute_units = granularity, units
        self.recompute_modules = tuple(modules or ())
        for module in self.modules():
            if hasattr(module, "recompute_module"):
                module.recompute_selective = module.recompute_module in self.recompute_modules
        if "moe" in self.recompute_modules:
            # The rerun MoE sublayer keeps nothing inside it: "moe_act"'s pieces (router GELUs, expert SwiGLU,
            # inside it) have nothing to drop, and their own saved-tensor hooks (recompute.feed) would take
            # the tensors from the rerun's checkpoint and keep them alive instead.
            for block in self.layers:
                for module in block.moe.modules():
                    if getattr(module, "recompute_module", None) == "moe_act":
                        module.recompute_selective = False

    def store_weights_in(self, dtype: torch.dtype) -> None:
        """Keep the weights in `dtype` (bf16 under ZeRO-1, whose optimizer holds the fp32 masters),
        except the routers': the router runs in fp32 with autocast off. Parameter objects are kept
        (their .data changes), so references to them stay valid."""
        routers = {p for block in self.layers for p in block.moe.router.parameters()}
        for p in self.parameters():
            if p not in routers:
                p.data = p.data.to(dtype)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        std = self.config.init_method_std
        output_std = std / math.sqrt(2 * self.config.num_layers)
        embedding_std = std if self.config.embedding_init_method_std is None else self.config.embedding_init_method_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, embedding_std if module is self.embedding else std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Conv1d):
                module.reset_parameters()
        for block in self.layers:
            router = block.moe.router
            for linear in (router.down_proj, router.fc1, router.fc2, router.out_proj):
                nn.init.normal_(linear.weight, 0.0, linear.in_features ** -0.5)
            nn.init.normal_(block.attention.linear_proj.weight, 0.0, output_std)
            nn.init.normal_(block.moe.experts.gate_up_weight, 0.0, std)
            nn.init.normal_(block.moe.experts.down_weight, 0.0, output_std)

    def output_weight(self) -> torch.Tensor:
        return self.embedding.weight if self.output_layer is None else self.output_layer.weight

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                document_ids: torch.Tensor | None = None) -> ModelOutput:
        """tokens (B, S) -> logits, or per-token fp32 losses when labels (B, S) are given.

        attention_mask, when given, is a boolean (B, 1, S, S) mask (True = attend) replacing the
        causal default; CCA's convolutions and value shift then restart where it does too (model/cca.py
        lag_visibility). document_ids (B, S), the packed documents' form (--reset-attention-mask), keeps
        each document apart the same way without an S x S mask in the batch (model/documents.py)."""
        if document_ids is not None:
            if attention_mask is not None:
                raise ValueError("give attention_mask or document_ids, not both")
            attention_mask = PackedDocuments(document_ids)
        b, s = tokens.shape
        if position_ids is None:
            position_ids = torch.arange(s, device=tokens.device).unsqueeze(0).expand(b, s)
        cos, sin = rope_cos_sin(position_ids, self.config.rotary_dim, self.config.rotary_base)
        residual = self.input_scaling(self.embedding(tokens))
        router_state = None
        routing = []
        recomputing = self.training and torch.is_grad_enabled()
        for unit in self.units():
            if recomputing and unit in self.recompute_units:
                # Early stop off: the recomputation runs the whole unit, so every collective inside it
                # (CP halo, EP all-to-all) runs again on every rank, in the same order.
                with torch.utils.checkpoint.set_checkpoint_early_stop(False):
                    residual, router_state, unit_routing = torch.utils.checkpoint.checkpoint(
                        self.run_blocks, unit, residual, router_state, cos, sin, attention_mask, use_reentrant=False)
            else:
                residual, router_state, unit_routing = self.run_blocks(unit, residual, router_state, cos, sin,
                                                                       attention_mask)
            routing.extend(unit_routing)
        logits, losses = self.head_and_loss(self.final_norm(residual), labels)
        return ModelOutput(logits, losses, routing)

    def units(self) -> list[range]:
        """The blocks in forward order, grouped as the recomputation policy groups them."""
        covered = {i for unit in self.recompute_units for i in unit}
        return sorted(self.recompute_units + [range(i, i + 1) for i in range(len(self.layers)) if i not in covered],
                      key=lambda unit: unit.start)

    def run_blocks(self, unit: range, residual, router_state, cos, sin, attention_mask):
        """Blocks unit.start .. unit.stop - 1; (residual, router state, their routings)."""
        routing = []
        for i in unit:
            residual, router_state, layer_routing = self.layers[i](residual, router_state, cos, sin, attention_mask)
            routing.append(layer_routing)
        return residual, router_state, routing

    def head_and_loss(self, hidden: torch.Tensor, labels: torch.Tensor | None):
        """LM head and per-token loss: (logits, None) without labels, (None, losses (B, S)) with them.
        Tensor parallelism replaces this with its vocab-parallel form."""
        if labels is None:
            return F.linear(hidden, self.output_weight()), None
        b, s = labels.shape
        weight = self.output_weight()
        if torch.is_autocast_enabled(hidden.device.type):
            weight = self.weight_casts(weight, torch.get_autocast_dtype(hidden.device.type))
        losses = kernels.lm_head_cross_entropy(hidden.reshape(b * s, -1), weight, labels.reshape(b * s))
        return None, losses.view(b, s)
