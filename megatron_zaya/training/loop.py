"""The training loop: one step reads top to bottom.

    micro-batches of the global batch -> forward (bf16 autocast, fp32 loss) -> backward, gradients
    reduced across data-parallel ranks -> clip -> optimizer (Muon + AdamW, or their ZeRO-1 form)
    -> balancing-bias update from global routing counts -> metrics -> maybe evaluate / checkpoint.

Loss normalisation: the loss of a step is sum(token_loss * loss_mask) over the whole global batch
divided by the number of loss tokens in it (all micro-batches, all data-parallel ranks), so a run on
N ranks computes exactly what one process computes on the same global batch.
"""
from __future__ import annotations

import contextlib
import copy
import gc
import math
import time
from dataclasses import dataclass, field

import torch

from megatron_zaya.model.weight_casts import WeightCasts
from megatron_zaya.optim.balancing import BalancingBiasUpdater
from megatron_zaya.optim.schedules import (SCHEDULE_FLAGS, decoupled_lr_schedule, flag_value_text,
                                           lr_schedule_from_flags, weight_decay_schedule_from_flags)
from megatron_zaya.training.batch_schedule import run_length
from megatron_zaya.training.logger import TrainingLogger
from megatron_zaya.training.train_state import TrainState
from megatron_zaya.training.metrics import (IntervalMeter, device_peak_tflops, empty_unused_memory,
                                           megatron_memory_scalars, peak_memory_bytes, routing_statistics,
                                           synchronize)
from megatron_zaya.training.nonfinite import diagnose
from megatron_zaya.training.profiling import StepProfiler
from megatron_zaya.training.stragglers import StragglerMeter
from megatron_zaya.training.validation_report import evaluation_line, evaluation_scalars, perplexity
from megatron_zaya.units import format_duration


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    num_tokens: int
    routing_counts: torch.Tensor    # (L, E + 1) global counts
    skipped: bool
    diagnosis: str = ""             # when skipped: which rank(s) and layer produced the non-finite values
    num_zeros: int | None = None    # --log-num-zeros-in-grad: exact zeros in the reduced gradient
    seconds: dict[str, float] = field(default_factory=dict)   # Megatron's timers: forward-backward, optimizer
    no_loss_tokens: bool = False    # skipped: every loss mask of the global batch was 0


class NonFiniteLossError(RuntimeError):
    pass


class EvaluationInterrupted(Exception):
    """A stop signal (Ctrl-C, SIGTERM, SIGUSR1) reached a rank during an evaluation: the checkpoint comes
    first (torchrun gives its ranks 30 s after a Ctrl-C, a long validation used them up)."""


def batch_to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def model_inputs(batch: dict) -> dict:
    """Keyword arguments for the model from a data-loader micro-batch."""
    inputs = dict(tokens=batch["tokens"], labels=batch["labels"], position_ids=batch["position_ids"])
    if "document_ids" in batch:        # --reset-attention-mask: packed documents kept apart
        inputs["document_ids"] = batch["document_ids"]
    return inputs


class Trainer:
    def __init__(self, run, model, optimizer, parallel, train_iterator, valid_loaders, logger: TrainingLogger,
                 checkpointer=None, state: TrainState | None = None):
        self.run, self.model, self.optimizer, self.parallel = run, model, optimizer, parallel
        self.cfg = run.train
        self.train_iterator = train_iterator
        # (name, loader) per validation set: the same samples at every evaluation (data/validation.py)
        self.valid_loaders = list(valid_loaders or [])
        self.test_loader = None            # the test split's first eval_iters global batches (end of training)
        self.logger = logger
        self.checkpointer = checkpointer
        self.state = state or TrainState()
        self.device = parallel.device
        self.batch_schedule, self.total_iters = run_length(self.cfg, parallel.dp_size)
        self.lr_schedule = lr_schedule_from_flags(run.optim.lr, self.cfg, self.total_iters)
        self.decoupled_schedule = decoupled_lr_schedule(self.lr_schedule, self.cfg)   # --decoupled-lr
        self.wd_schedule = weight_decay_schedule_from_flags(self.cfg, self.total_iters)
        self.schedule_flags = self.schedule_flag_values()    # what the schedules are built from (checkpoints keep it)
        self.last_lr = float("nan")       # the lr of the last step (set by train() and every update)
        self.last_decoupled_lr = float("nan")
        biases = [block.moe.router.balancing_bias for block in model.layers]
        self.balancer = BalancingBiasUpdater(biases, self.cfg.moe_router_bias_lr, self.cfg.moe_router_bias_beta1,
                                             self.cfg.moe_router_bias_beta2, self.cfg.moe_router_bias_eps,
                                             self.cfg.moe_router_skip_target)
        self.autocast = (torch.autocast(self.device.type, dtype=torch.bfloat16) if self.cfg.bf16
                         else contextlib.nullcontext())
        self.weight_casts = getattr(model, "weight_casts", None) or WeightCasts()
        from megatron_zaya.model.accounting import training_flops_per_token
        self.flops_per_token = training_flops_per_token(run.model, run.model.seq_length)
        if self.cfg.peak_tflops:
            self.peak_tflops, self.peak_source = self.cfg.peak_tflops, "--peak-tflops"
        else:
            self.peak_tflops, self.peak_source = device_peak_tflops(
                self.device, torch.bfloat16 if self.cfg.bf16 else torch.float32)
        self.iterations_to_skip = frozenset(self.cfg.iterations_to_skip or ())   # completed counts, as Megatron-LM
        self.stop_requested: str | None = None
        self.exit_reason: str | None = None   # why the loop stopped before --train-iters (a signal, an exit flag)
        # --exit-duration-in-mins counts from here; setup moves it to its own start (Megatron-LM counts from
        # the process's: loading a checkpoint and building indices spend the job's time too).
        self.run_started = time.time()
        self.last_validation: dict[str, float] | None = None
        self.evaluation_interrupted = False      # a stop signal cut an evaluation short
        self.interval = IntervalMeter()
        self.last_result: StepResult | None = None     # the last step logged, and its global batch size
        self.last_batch_size = 0
        self.norm_at: tuple[int, float] = (-1, 0.0)      # (iteration, params norm): params_norm's last
        self.stragglers = (StragglerMeter(self.device, self.cfg.straggler_minmax_count) if self.cfg.log_straggler
                           else None)

    # ---------------------------------------------------------------------------------------------
    def train_step(self, micro_batches: list[dict]) -> StepResult:
        model, parallel = self.model, self.parallel
        started = time.time()
        self.optimizer.zero_grad()
        parallel.zero_grad()
        micro_batches = [parallel.local_batch(batch_to_device(mb, self.device)) for mb in micro_batches]
        local_tokens = sum(mb["loss_mask"].sum() for mb in micro_batches)
        global_tokens = parallel.sum_over_data_ranks(torch.as_tensor(local_tokens, dtype=torch.float64)).item()
        loss_scale = parallel.gradient_average_factor / max(global_tokens, 1.0)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        finite_losses = []          # per micro-batch, on the device (read only for a skipped step)
        counts = None
        if self.stragglers is not None:
            self.stragglers.start()
        # On CPU the micro-batches share one bf16 copy of the experts' and LM head's weights (weight_casts.py),
        # except under full recomputation, where the copies would outlive the blocks that hold them.
        share_casts = (self.device.type == "cpu" and len(micro_batches) > 1
                       and getattr(model, "recompute_granularity", None) != "full")
        with self.weight_casts.caching(share_casts):
            for index, batch in enumerate(micro_batches):
                # Backward inside no_sync too: gradient hooks decide there whether buckets communicate.
                with parallel.no_sync(index < len(micro_batches) - 1):
                    with self.autocast:
                        out = model(**model_inputs(batch))
                    masked = (out.token_losses * batch["loss_mask"]).sum()
                    (masked * loss_scale).backward()
                loss_sum += masked.detach().double()
                finite_losses.append(torch.isfinite(masked.detach()))
                step_counts = torch.stack([r.counts for r in out.routing])
                counts = step_counts if counts is None else counts + step_counts
        if self.stragglers is not None:
            self.stragglers.stop()
        parallel.finish_gradient_reduction()
        synchronize(self.device)           # the forward-backward timer holds its device work
        forward_backward = time.time()
        empty_unused_memory(self.device, self.cfg.empty_unused_memory_level, 1)
        no_loss_tokens = global_tokens == 0     # Megatron-LM's 0/0: a NaN loss, the step not applied
        loss = parallel.sum_over_data_ranks(loss_sum).item() / global_tokens if global_tokens else math.nan
        counts = parallel.sum_routing_counts(counts)
        num_zeros = parallel.count_zero_grads() if self.cfg.log_num_zeros_in_grad else None
        grad_norm = parallel.clip_grad_norm(self.run.optim.clip_grad)
        skipped = not (math.isfinite(loss) and math.isfinite(grad_norm))
        diagnosis = ""
        if no_loss_tokens:
            self.optimizer.zero_grad()
            parallel.zero_grad()
        elif skipped:   # every rank: which rank and layer produced it (megatron_zaya/training/nonfinite.py)
            diagnosis = diagnose(self, micro_batches, loss_scale, loss_sum, finite_losses)
            self.optimizer.zero_grad()
            parallel.zero_grad()
        else:
            position, step = self.schedule_position(self.batch_schedule.batch_size(self.state.consumed_samples))
            self.last_lr = self.lr_schedule(position, step)
            if self.decoupled_schedule is not None:
                self.last_decoupled_lr = self.decoupled_schedule(position, step)
            self.optimizer.set_lr(self.last_lr, self.last_decoupled_lr if self.decoupled_schedule else None)
            if self.wd_schedule is not None:
                self.optimizer.set_weight_decay(self.wd_schedule(position))
            self.optimizer.step()
            empty_unused_memory(self.device, self.cfg.empty_unused_memory_level, 2)
            if self.cfg.moe_router_bias_update:
                self.balancer.update(counts)
        synchronize(self.device)           # the optimizer timer, and the step's time, hold its device work
        seconds = {"forward-backward": forward_backward - started, "optimizer": time.time() - forward_backward}
        return StepResult(loss, grad_norm, int(global_tokens), counts, skipped, diagnosis, num_zeros, seconds,
                          no_loss_tokens)

    def take_schedules_from(self, saved_flags: dict) -> list[str]:
        """--use-checkpoint-opt_param-scheduler: the LR and weight-decay schedules of the run that saved
        the checkpoint, built from the flags its schedules were built from (`saved_flags`) instead of this
        run's, and kept so in this run's checkpoints. Returns notes: the schedule flags the checkpoint does
        not hold (this run's value is used for those) and the values that differ from this run's."""
        flags = copy.copy(self.cfg)
        values = self.schedule_flag_values()
        missing = [name for name in SCHEDULE_FLAGS if name not in saved_flags]
        changed = [f"--{name.replace('_', '-')} {flag_value_text(saved)} (this run: {flag_value_text(current)})"
                   for name, saved, current in self.schedule_differences(saved_flags)]
        for name in SCHEDULE_FLAGS:
            if name in saved_flags:
                values[name] = saved_flags[name]
                if name not in ("lr", "weight_decay"):
                    setattr(flags, name, saved_flags[name])
        self.lr_schedule = lr_schedule_from_flags(values["lr"], flags, flags.train_iters or 0)
        self.decoupled_schedule = decoupled_lr_schedule(self.lr_schedule, flags)
        self.wd_schedule = weight_decay_schedule_from_flags(flags, flags.train_iters or 0)
        if self.wd_schedule is None:
            self.optimizer.set_weight_decay(values["weight_decay"])
        self.schedule_flags = values
        notes = []
        if changed:
            notes.append("--use-checkpoint-opt_param-scheduler: the schedules follow the checkpoint's "
                         + ", ".join(changed))
        if missing:
            notes.append("--use-checkpoint-opt_param-scheduler: the checkpoint holds no "
                         + ", ".join(f"--{n.replace('_', '-')}" for n in missing) + "; this run's value is used")
        return notes

    def schedule_flag_values(self) -> dict:
        """This run's value of every flag in SCHEDULE_FLAGS."""
        return {name: getattr(self.run.optim if name in ("lr", "weight_decay") else self.cfg, name)
                for name in SCHEDULE_FLAGS}

    def schedule_differences(self, saved_flags: dict) -> list[tuple[str, object, object]]:
        """(flag, checkpoint's value, this run's value) for each schedule flag the checkpoint holds
        with another value."""
        current = self.schedule_flag_values()
        return [(name, saved_flags[name], current[name]) for name in SCHEDULE_FLAGS
                if name in saved_flags and saved_flags[name] != current[name]]

    def schedule_position(self, batch_size: int) -> tuple[float, float]:
        """(position, step) of the schedules for a step of `batch_size` samples: where the successful
        steps so far have brought them, in global batches under --train-iters, samples under
        --train-samples, and how far this step moves them."""
        if self.lr_schedule.unit == "samples":
            return self.state.scheduled_samples, batch_size
        return self.state.scheduled_iterations, batch_size / self.cfg.global_batch_size

    def learning_rate(self, batch_size: int) -> float:
        """The LR schedule's lr for a step of `batch_size` samples."""
        return self.lr_schedule(*self.schedule_position(batch_size))

    def next_micro_batches(self) -> list[dict]:
        count = self.batch_schedule.num_micro_batches(self.state.consumed_samples)
        return [next(self.train_iterator) for _ in range(count)]

    @torch.no_grad()
    def evaluate(self, split: str = "valid") -> dict[str, float] | None:
        """The mean loss and perplexity over the first --eval-iters global batches of each validation
        set (all of it, once, with --full-validation), or of the test split (split="test":
        Megatron-LM's evaluation at the end of training). Several validation sets
        (--multiple-validation-sets) add "validation loss NAME" / "validation ppl NAME" per set;
        "validation loss" is then the mean of the sets' losses."""
        if split == "test":
            loaders = [("", self.test_loader)] if self.test_loader is not None else []
        else:
            loaders = self.valid_loaders
        full = split == "valid" and getattr(self.run.data, "full_validation", False)   # data None: synthetic
        per_iter = self.cfg.global_batch_size // (self.cfg.micro_batch_size * self.parallel.dp_size)
        losses = {}
        for name, loader in loaders:
            label = f"{'test' if split == 'test' else 'validation'}{' set ' + name if name else ''}"
            loss = self.mean_loss(loader, None if full else self.cfg.eval_iters * per_iter, label)
            if loss is not None:
                losses[name] = loss
            if split == "valid":
                self.state.consumed_valid_samples += (loader.dataset.real_samples if full
                                                      else self.cfg.eval_iters * self.cfg.global_batch_size)
        if not losses:
            return None
        mean = sum(losses.values()) / len(losses)
        metrics = {"validation loss": mean, "validation ppl": perplexity(mean)}
        for name, loss in losses.items():
            if name:
                metrics[f"validation loss {name}"], metrics[f"validation ppl {name}"] = loss, perplexity(loss)
        return metrics

    EVAL_PROGRESS_SECONDS = 30.0     # a long evaluation (e.g. --full-validation) prints progress this often

    def mean_loss(self, loader, micro_batches: int | None, label: str = "validation") -> float | None:
        """The loss per loss-mask token over this rank's first `micro_batches` micro-batches of
        `loader` (None: all of them), summed over the data-parallel ranks; None without a token.
        An evaluation running longer than EVAL_PROGRESS_SECONDS prints its progress that often."""
        self.model.eval()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        tokens = torch.zeros((), dtype=torch.float64, device=self.device)
        total = len(loader) if micro_batches is None else min(micro_batches, len(loader))
        started = last_report = time.time()
        for count, batch in enumerate(loader):
            if micro_batches is not None and count == micro_batches:
                break
            if self.checkpointer is not None and self.checkpointer.stop_signal_on_any_rank():   # (agreed)
                self.model.train()
                raise EvaluationInterrupted
            if self.logger is not None and time.time() - last_report >= self.EVAL_PROGRESS_SECONDS:
                last_report = time.time()
                self.logger.print(f"{label}: {count}/{total} micro-batches of this rank, "
                                  f"{last_report - started:.0f} s")
            batch = self.parallel.local_batch(batch_to_device(batch, self.device))
            with self.autocast:
                out = self.model(**model_inputs(batch))
            loss_sum += (out.token_losses * batch["loss_mask"]).sum().double()
            tokens += batch["loss_mask"].sum().double()
        self.model.train()
        loss_sum, tokens = self.parallel.sum_over_data_ranks(loss_sum), self.parallel.sum_over_data_ranks(tokens)
        return None if tokens.item() == 0 else loss_sum.item() / tokens.item()

    # ---------------------------------------------------------------------------------------------
    def log_step(self, result: StepResult, step_seconds: float, batch_size: int, started: float) -> None:
        """TensorBoard every --tensorboard-log-interval iterations (this step's values), the console line
        every --log-interval (averages over the interval). Throughput counts every token processed."""
        it = self.state.iteration
        tokens = batch_size * self.run.model.seq_length
        self.interval.add(result.loss, step_seconds, tokens, result.skipped)
        self.last_result, self.last_batch_size = result, batch_size
        if self.cfg.tensorboard_dir and (it % self.cfg.tensorboard_log_interval == 0 or it == self.total_iters):
            self.write_scalars(result, step_seconds, tokens, batch_size)
        if it % self.cfg.log_interval == 0 or it == self.total_iters:
            self.end_interval(started)

    def end_interval(self, started: float) -> None:
        """The console line of the iterations since the last one (every rank: collectives), and the
        straggler report."""
        # --log-params-norm: on the console line too (a collective: every rank takes part)
        params_norm = self.params_norm() if self.cfg.log_params_norm else None
        self.print_interval(self.last_result, started, params_norm)
        self.interval = IntervalMeter()
        if self.stragglers is not None:      # every rank: the report gathers from all of them
            report = self.stragglers.report(self.parallel)
            self.logger.print(report.line())
            self.logger.scalars(report.scalars(), self.state.iteration)

    def params_norm(self) -> float:
        """The weights' norm at this iteration (their ZeRO-1 masters' where kept), computed once for TensorBoard
        and the console line alike: a collective, which every rank calls at the same iterations."""
        if self.norm_at[0] != self.state.iteration:
            self.norm_at = (self.state.iteration, self.parallel.params_norm(self.optimizer.owned_masters()))
        return self.norm_at[1]

    def throughput(self, tokens: int, seconds: float) -> tuple[float, float, float]:
        """(tokens/s per device, model TFLOP/s per device, MFU) of `tokens` processed in `seconds`."""
        tokens_per_device = tokens / max(seconds, 1e-9) / self.parallel.world_size
        tflops = tokens_per_device * self.flops_per_token / 1e12
        return tokens_per_device, tflops, tflops / self.peak_tflops

    def write_scalars(self, result: StepResult, step_seconds: float, tokens: int, batch_size: int) -> None:
        """This iteration's scalars. Every rank takes part in the parameter norm (a collective); only
        the writing rank computes the rest."""
        params_norm = self.params_norm()
        if not self.logger.writes_scalars:
            return
        it = self.state.iteration
        tokens_per_device, tflops, mfu = self.throughput(tokens, step_seconds)
        scalars = {"lm loss": result.loss, "learning-rate": self.last_lr, "grad-norm": result.grad_norm,
                   "batch-size": batch_size, "params-norm": params_norm, "iteration-time": step_seconds,
                   "skipped-iterations": self.state.skipped_iterations,
                   "consumed-samples": self.state.consumed_samples, "consumed-tokens": self.state.consumed_tokens,
                   "throughput/tokens-per-sec-per-device": tokens_per_device,
                   "throughput/tflops-per-device": tflops, "throughput/mfu": mfu,
                   "memory/peak-gb": peak_memory_bytes(self.device) / 2 ** 30, "world-size": self.parallel.world_size}
        # Megatron-LM's names for the same: its timers (seconds), `throughput` and the memory tags.
        scalars.update({f"{name}-time": seconds for name, seconds in result.seconds.items()})
        scalars.update({"throughput": tflops, **megatron_memory_scalars(self.device)})
        if result.num_zeros is not None:
            scalars["num-zeros"] = result.num_zeros
        if self.decoupled_schedule is not None:
            scalars["decoupled-learning-rate"] = self.last_decoupled_lr
        for layer, counts in enumerate(result.routing_counts):
            for name, value in routing_statistics(counts).items():
                scalars[f"moe/layer{layer:02d}/{name}"] = value
            router = self.model.layers[layer].moe.router
            for e, bias in enumerate(router.balancing_bias.tolist()):
                scalars[f"moe/layer{layer:02d}/balancing-bias/{e:02d}"] = bias
            if router.eda_gamma is not None:
                scalars[f"moe/layer{layer:02d}/eda-gamma-norm"] = router.eda_gamma.detach().norm().item()
        self.logger.scalars(scalars, it, self.state.consumed_samples)

    def print_interval(self, result: StepResult, started: float, params_norm: float | None = None) -> None:
        """The console line: loss, time per iteration and throughput averaged over the interval; lr, grad
        norm and routing of this iteration; the ETA from the whole run's pace in samples since it started."""
        if not self.logger.is_main:
            return
        it, m = self.state.iteration, self.interval
        tokens_per_device, tflops, mfu = self.throughput(m.tokens, m.seconds)
        counts = result.routing_counts
        entropy = sum(routing_statistics(c)["routing_entropy"] for c in counts) / max(1, len(counts))
        skip = counts[:, -1].sum().item() / max(1, counts.sum().item())
        # in samples: ramp-up iterations are smaller than the ones left (an ETA in iterations was 3-5x short)
        remaining = self.batch_schedule.samples_consumed(self.state.consumed_samples, self.total_iters - it)
        eta = remaining * (time.time() - started) / max(1, self.state.consumed_samples - self.start_samples)
        # Megatron-LM's fields, in its order and words (its log parsers read these lines), then this trainer's
        self.logger.print(
            f"{self.iteration_field()} | consumed samples: {self.state.consumed_samples:12d} | "
            f"elapsed time per iteration (ms): {1000 * m.seconds_per_iteration:.1f} | "
            f"throughput per GPU (TFLOP/s/GPU): {tflops:.3f} | learning rate: {self.last_lr:.6E} | "
            + (f"decoupled learning rate: {self.last_decoupled_lr:.6E} | " if self.decoupled_schedule else "") +
            f"global batch size: {self.last_batch_size:5d} | lm loss: {m.mean_loss:.6E} | loss scale: 1.0 | "
            f"grad norm: {result.grad_norm:.3f} | "
            + (f"num zeros: {result.num_zeros:.1f} | " if result.num_zeros is not None else "")
            + (f"params norm: {params_norm:.3f} | " if params_norm is not None else "") +
            f"number of skipped iterations: {m.skipped:3d} | number of nan iterations: {m.nan_losses:3d} | "
            f"tokens: {self.state.consumed_tokens} | tokens/s/device: {tokens_per_device:,.0f} | "
            f"MFU: {100 * mfu:.1f}% | routing entropy: {entropy:.3f} | skip: {skip:.3f} | "
            f"mem: {peak_memory_bytes(self.device) / 2 ** 30:.2f} GB | ETA: {format_duration(eta)} |")

    def iteration_field(self) -> str:
        """'iteration        7/     100', as Megatron-LM starts its console lines."""
        return f"iteration {self.state.iteration:8d}/{self.total_iters:8d}"

    def should_exit(self) -> str | None:
        it = self.state.iteration
        if self.stop_requested:
            return self.stop_requested
        if self.cfg.exit_interval and it % self.cfg.exit_interval == 0:
            return f"--exit-interval {self.cfg.exit_interval} reached"
        if self.cfg.exit_duration_in_mins:
            elapsed = torch.tensor(float(time.time() - self.run_started > self.cfg.exit_duration_in_mins * 60))
            if self.parallel.max_over_all_ranks(elapsed).item() > 0:
                return f"--exit-duration-in-mins {self.cfg.exit_duration_in_mins} reached"
        return None

    def train(self) -> TrainState:
        """Run the iterations. With --manual-gc Python's automatic garbage collection is off meanwhile
        (its pauses come at different moments on different ranks and stall the collectives)."""
        if not self.cfg.manual_gc:
            return self._train()
        gc.disable()
        gc.collect()
        try:
            return self._train()
        finally:
            gc.enable()

    def _train(self) -> TrainState:
        profiler = StepProfiler(self.cfg, self.parallel.rank, self.parallel.world_size, self.logger.print_any_rank)
        try:
            return self._train_iterations(profiler)
        finally:
            profiler.close(self.state.iteration)

    def _train_iterations(self, profiler: StepProfiler) -> TrainState:
        self.model.train()
        started = time.time()
        self.start_samples = self.state.consumed_samples
        if self.state.iteration >= self.total_iters:
            self.logger.print(f"nothing to train: the run is at iteration {self.state.iteration} of {self.total_iters} "
                              f"(raise --train-iters or --train-samples to train on)")
        else:
            self.logger.print(f"training from iteration {self.state.iteration} to {self.total_iters}; "
                              f"model FLOPs/token {self.flops_per_token:.3e} (training, active expert only); "
                              f"MFU peak {self.peak_tflops:.3g} TFLOP/s ({self.peak_source})")
        if self.checkpointer is not None:
            self.checkpointer.before_training(self)
        if self.watchdog is not None:
            self.watchdog.arm(self.cfg.watchdog_first_iteration_seconds)
        self.last_lr = self.learning_rate(self.batch_schedule.batch_size(self.state.consumed_samples))
        gc_interval = self.cfg.manual_gc_interval if self.cfg.manual_gc else 0
        while self.state.iteration < self.total_iters:
            batch_size = self.batch_schedule.batch_size(self.state.consumed_samples)
            trained = self.state.iteration not in self.iterations_to_skip
            if not trained:
                self.skip_iteration(batch_size)
            else:
                self.run_iteration(profiler, batch_size, gc_interval, started)
            if self.cfg.eval_interval and self.state.iteration % self.cfg.eval_interval == 0:
                self.run_evaluation()
            if self.checkpointer is not None:
                self.checkpointer.after_step(self, trained)
            reason = self.exit_reason = self.should_exit()
            if reason:
                if self.interval.iterations:     # the iterations since the last console line (every rank exits here)
                    self.end_interval(started)
                self.logger.print(f"exiting: {reason}")
                if self.checkpointer is not None:
                    self.checkpointer.on_exit(self)
                break
        return self.state

    def run_iteration(self, profiler: StepProfiler, batch_size: int, gc_interval: int, started: float) -> None:
        """One training step of `batch_size` samples, with its bookkeeping and logging."""
        profiler.before_step(self.state.iteration)
        step_start = time.time()
        micro_batches = self.next_micro_batches()
        fetched = time.time()
        result = self.train_step(micro_batches)     # (it waits for its device work: the step's time holds it)
        result.seconds["batch-generator"] = fetched - step_start
        self.state.iteration += 1
        profiler.after_step(self.state.iteration)
        self.state.consumed_samples += batch_size
        self.state.consumed_tokens += batch_size * self.run.model.seq_length
        self.state.floating_point_operations += batch_size * self.run.model.seq_length * self.flops_per_token
        self.state.train_seconds += time.time() - step_start
        if not result.skipped:
            self.state.scheduled_samples += batch_size
            self.state.scheduled_iterations += batch_size / self.cfg.global_batch_size
        if gc_interval and self.state.iteration % gc_interval == 0:
            gc.collect()
        self.handle_nonfinite(result)
        hash_interval = self.cfg.check_weight_hash_across_dp_replicas_interval
        if hash_interval and self.state.iteration % hash_interval == 0:
            self.parallel.check_replicas_equal()
        self.log_step(result, time.time() - step_start, batch_size, started)
        self.logger.advance(result.loss, batch_size)

    def skip_iteration(self, batch_size: int) -> None:
        """Megatron-LM's --iterations-to-skip: the iteration's global batch is read and dropped (no
        forward, backward or update), so the data order of every later iteration is unchanged; the
        iteration and sample counters advance, the LR schedule does not (no update was made)."""
        self.next_micro_batches()
        self.state.iteration += 1
        self.state.consumed_samples += batch_size
        self.state.consumed_tokens += batch_size * self.run.model.seq_length
        self.state.skipped_train_samples += batch_size
        self.logger.print(f"{self.iteration_field()} | SKIPPED (--iterations-to-skip): "
                          f"its {batch_size} samples dropped | consumed samples {self.state.consumed_samples:>9}")
        self.logger.scalars({"skipped-train-samples": self.state.skipped_train_samples,
                             "consumed-samples": self.state.consumed_samples}, self.state.iteration)
        self.logger.advance(None, batch_size)

    @property
    def watchdog(self):
        return getattr(self.checkpointer, "watchdog", None)

    def run_evaluation(self) -> dict[str, float] | None:
        # Megatron-LM's manual GC around each evaluation of the training loop (automatic collection off)
        collect = self.cfg.manual_gc and self.cfg.manual_gc_eval and self.cfg.eval_iters and not gc.isenabled()
        with self.watchdog.paused() if self.watchdog is not None else contextlib.nullcontext():
            if collect:
                gc.collect()
            try:
                metrics = self.evaluate()
            except EvaluationInterrupted:
                self.evaluation_interrupted = True
                self.logger.print(f"validation at iteration {self.state.iteration} stopped: a stop signal came")
                metrics = None
            if collect:
                gc.collect()
        self.last_validation = metrics
        if metrics:
            self.logger.evaluation_scalars("validation", evaluation_scalars(metrics), self.state.iteration,
                                           self.state.consumed_samples)
            self.logger.print(f"validation at iteration {self.state.iteration} | {evaluation_line(metrics)}")
        return metrics

    def run_test_evaluation(self) -> dict[str, float] | None:
        """The test split's loss at the end of training (TensorBoard 'lm loss test', 'lm loss test ppl')."""
        with self.watchdog.paused() if self.watchdog is not None else contextlib.nullcontext():
            try:
                metrics = self.evaluate("test")
            except EvaluationInterrupted:
                self.evaluation_interrupted = True
                self.logger.print("test evaluation stopped: a stop signal came")
                metrics = None
        if metrics:
            self.logger.evaluation_scalars("test", evaluation_scalars(metrics, "test"), self.state.iteration,
                                           self.state.consumed_samples)
            self.logger.print(f"test loss at iteration {self.state.iteration} | {evaluation_line(metrics)}")
        return metrics

    def handle_nonfinite(self, result: StepResult) -> None:
        if not result.skipped:
            self.state.consecutive_nonfinite = 0
            return
        self.state.skipped_iterations += 1
        if result.no_loss_tokens:      # the data's doing, not the model's: not counted towards the stop
            self.logger.print(f"{self.iteration_field()} | SKIPPED: no loss tokens in "
                              f"the global batch (every loss mask 0); no update")
            return
        self.state.consecutive_nonfinite += 1
        self.logger.print(f"{self.iteration_field()} | SKIPPED (non-finite) "
                          f"{result.diagnosis}")
        if self.state.consecutive_nonfinite >= self.cfg.max_consecutive_nonfinite:
            raise NonFiniteLossError(
                f"{self.state.consecutive_nonfinite} consecutive steps with a non-finite loss or gradient at iteration "
                f"{self.state.iteration} (--max-consecutive-nonfinite {self.cfg.max_consecutive_nonfinite}): "
                f"{result.diagnosis}")
