"""One planner evaluation (memory + time) and the single changes that make a layout fit."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from megatron_zaya.config import ModelConfig
from megatron_zaya.model.recompute import DEFAULT_MODULES
from megatron_zaya.planner.activations import ActivationMemory, activation_memory
from megatron_zaya.planner.hardware import ClusterSpec, Efficiency
from megatron_zaya.planner.layout import LayoutError, ParallelLayout
from megatron_zaya.planner.memory import StateMemory, state_memory
from megatron_zaya.planner.time import StepTime, step_time


@dataclass(frozen=True)
class PlanOptions:
    optimizer: str = "adamw"
    grad_dtype: str = "fp32"
    activation_policy: str = "gpu"
    reserve_fraction: float = 0.10      # HBM kept free for allocator fragmentation, comm buffers, workspaces
    overlap: bool = True
    hierarchical: bool = False
    routed_fraction: float = 1.0
    packed_documents: bool = False      # --reset-attention-mask: segmented convolution + attention bias

    def validate(self) -> "PlanOptions":
        if not 0 <= self.reserve_fraction < 1:
            raise ValueError(f"--memory-reserve-fraction={self.reserve_fraction}: must be in [0, 1)")
        if not 0 <= self.routed_fraction <= 1:
            raise ValueError(f"--routed-fraction={self.routed_fraction}: must be in [0, 1]")
        return self


@dataclass
class Plan:
    config: ModelConfig
    layout: ParallelLayout
    cluster: ClusterSpec
    efficiency: Efficiency
    options: PlanOptions
    state: StateMemory
    activations: ActivationMemory
    time: StepTime

    @property
    def memory_total(self) -> float:
        return (self.state.total + self.state.autocast_copies + self.activations.stored
                + self.activations.backward_transient)

    @property
    def memory_usable(self) -> float:
        return self.cluster.memory_bytes * (1 - self.options.reserve_fraction)

    @property
    def fits(self) -> bool:
        return self.memory_total <= self.memory_usable

    @property
    def tokens_per_second(self) -> float:
        return self.layout.global_batch_size * self.layout.seq_length / self.time.total

    @property
    def mfu(self) -> float:
        return self.time.model_flops_per_gpu / (self.time.total * self.cluster.peak_flops)


def make_plan(config: ModelConfig, layout: ParallelLayout, cluster: ClusterSpec, efficiency: Efficiency | None = None,
              options: PlanOptions | None = None) -> Plan:
    efficiency = (efficiency or Efficiency()).validate()
    options = (options or PlanOptions()).validate()
    layout.validate(config)
    state = state_memory(config, layout, options.optimizer, options.grad_dtype)
    acts = activation_memory(config, layout.seq_length, layout.micro_batch_size, layout.recompute,
                             options.activation_policy, layout.tensor_parallel, layout.context_parallel,
                             options.routed_fraction, recompute_modules=layout.recompute_modules or None,
                             packed_documents=options.packed_documents,
                             sequence_parallel=layout.sequence_parallel)
    t = step_time(config, layout, cluster, efficiency, options.optimizer, options.grad_dtype, options.overlap,
                  options.hierarchical)
    return Plan(config, layout, cluster, efficiency, options, state, acts, t)


# What a change to full recomputation must take away from a selective layout: training refuses
# --recompute-granularity full beside these (arguments._check_recompute), and so does the planner.
LEAVE_SELECTIVE = ", without --recompute-activations, --moe-layer-recompute or --recompute-modules"


def full_recompute_flags(layout: ParallelLayout, leave_selective: str = LEAVE_SELECTIVE) -> str:
    """The flags of the change to full recomputation: --recompute full, and for a selective layout what must go
    (`leave_selective`: the caller names the settings its user gave, and where)."""
    return "--recompute full" + (leave_selective if layout.recompute == "selective" else "")


def _candidates(layout: ParallelLayout, leave_selective: str = LEAVE_SELECTIVE):
    """Single changes, most preferred first: (kind, what changes, its flags, new layout)."""
    if not layout.zero1:
        yield "zero1", "enable ZeRO-1", "--use-distributed-optimizer", dataclasses.replace(layout, zero1=True)
    if layout.tensor_parallel > 1 and not layout.sequence_parallel:
        yield "sp", "split the residuals, norms and router over TP too", "--sequence-parallel", \
            dataclasses.replace(layout, sequence_parallel=True)
    if layout.micro_batch_size > 1:
        mbs = layout.micro_batch_size // 2
        while mbs >= 1:
            yield ("micro", "smaller micro batch", f"--micro-batch-size {mbs}",
                   dataclasses.replace(layout, micro_batch_size=mbs))
            mbs //= 2
    if layout.recompute == "none":
        yield "selective", "recompute selective", \
            "--recompute selective; in training: --recompute-granularity selective", \
            dataclasses.replace(layout, recompute="selective")
    cp = layout.context_parallel * 2
    while cp <= layout.gpus:
        yield "cp", f"raise CP to {cp}", f"--context-parallel-size {cp}", \
            dataclasses.replace(layout, context_parallel=cp)
        cp *= 2
    if not layout.recomputes_moe and layout.recompute != "full":
        modules = tuple(dict.fromkeys((layout.recompute_modules or DEFAULT_MODULES) + ("moe",)))
        names = " ".join(modules)
        yield ("moe", "recompute the MoE sublayers", f"--recompute selective --recompute-modules {names}; in training "
               "the same modules with --recompute-granularity selective",
               dataclasses.replace(layout, recompute="selective", recompute_modules=modules))
    if layout.recompute != "full":
        yield ("full", "recompute full", f"{full_recompute_flags(layout, leave_selective)}; in training: "
               "--recompute-granularity full", dataclasses.replace(layout, recompute="full", recompute_modules=()))
    ep = layout.expert_parallel * 2
    while ep <= layout.gpus:
        yield "ep", f"raise EP to {ep}", f"--expert-model-parallel-size {ep}", \
            dataclasses.replace(layout, expert_parallel=ep)
        ep *= 2
    tp = layout.tensor_parallel * 2
    while tp <= 8:
        yield "tp", f"raise TP to {tp}", f"--tensor-model-parallel-size {tp} --sequence-parallel", \
            dataclasses.replace(layout, tensor_parallel=tp, sequence_parallel=True)
        tp *= 2


def fixes(plan: Plan, limit: int = 4, leave_selective: str = LEAVE_SELECTIVE) -> list[tuple[str, Plan]]:
    """Single changes to the layout that make it fit, cheapest kind first; one per kind of change
    (the smallest that suffices), and ZeRO-1 combined with another change if no single change fits. Each
    description names the flags that, added to the run's, make the change; `leave_selective` says what the
    change to full recomputation takes away from a selective layout (full_recompute_flags)."""
    found, kinds = [], set()

    def attempt(layout):
        try:
            candidate = make_plan(plan.config, layout, plan.cluster, plan.efficiency, plan.options)
        except (LayoutError, ValueError):
            return None
        return candidate if candidate.fits else None

    for kind, what, flags, layout in _candidates(plan.layout, leave_selective):
        if kind in kinds:
            continue
        candidate = attempt(layout)
        if candidate is not None:
            found.append((f"{what} ({flags})", candidate))
            kinds.add(kind)
        if len(found) >= limit:
            break
    if not found and not plan.layout.zero1:
        zero = dataclasses.replace(plan.layout, zero1=True)
        for _, what, flags, layout in _candidates(zero, leave_selective):
            candidate = attempt(layout)
            if candidate is not None:
                found.append((f"enable ZeRO-1 and {what} (--use-distributed-optimizer {flags})", candidate))
                break
    return found
