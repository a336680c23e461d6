"""The lines the main rank prints before the first step: what is being trained, on how many processes,
with which batch, and how often each dataset will be read (data/blend_report.py), so that a wrong preset,
layout or blend shows at once instead of in the loss curve."""
from __future__ import annotations

from megatron_zaya.data.blend_report import passes_lines, training_passes
from megatron_zaya.model.accounting import count_parameters
from megatron_zaya.training.data_phase import train_data_position


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def startup_lines(run, tokenizer_vocab_size: int, datasets: dict, run_samples: int) -> list[str]:
    """Model, layout and batch lines of the run `run` (RunConfig), then the passes over each dataset
    (`datasets`: loaders.open_datasets) that its `run_samples` training samples make."""
    model, train, p = run.model, run.train, run.parallel
    counts = count_parameters(model)
    active_non_embedding = counts.active_non_embedding(model.num_experts)   # ZAYA1's published 760M
    active = active_non_embedding + counts.embedding
    dp = p.data_parallel_size
    accumulation = train.global_batch_size // (train.micro_batch_size * dp)
    layout = (f"DP {dp} x TP {p.tensor_model_parallel_size} x CP {p.context_parallel_size}, "
              f"EP {p.expert_model_parallel_size}")
    extras = [name for name, on in (("ZeRO-1", p.use_distributed_optimizer), ("sequence parallel", p.sequence_parallel))
              if on]
    recompute = f", recompute {train.recompute_granularity}" if train.recompute_granularity else ""
    rampup = (f"; ramped up from {train.rampup_batch_size[0]} sequences" if train.rampup_batch_size else "")
    run_tokens = run_samples * model.seq_length
    return [
        f"model: {model.num_layers} layers, hidden {model.hidden_size}, {model.num_attention_heads} heads "
        f"({model.num_query_groups} query groups, head size {model.kv_channels}, rotary {model.rotary_percent:g}), "
        f"{model.num_experts} experts + skip (FFN {model.moe_ffn_hidden_size}); {_count(counts.total)} parameters, "
        f"{_count(active)} active per token "
        f"({_count(active_non_embedding)} without the embedding); "
        f"vocabulary {model.vocab_size:,} (tokenizer {tokenizer_vocab_size:,})",
        f"layout: {p.world_size} process{'es' * (p.world_size > 1)}: {layout}{''.join(', ' + e for e in extras)}; "
        f"{'bf16' if train.bf16 else 'fp32'}, {run.optim.optimizer}{recompute}",
        f"batch: {train.global_batch_size} sequences of {model.seq_length} tokens per iteration "
        f"({train.global_batch_size * model.seq_length:,} tokens) = micro-batch {train.micro_batch_size} x "
        f"{accumulation} accumulation x DP {dp}{rampup}",
    ] + passes_lines(training_passes(run.data, datasets, run_tokens, model.seq_length), run_tokens)


def job_end_lines(run, state, schedule, total_iters: int) -> list[str]:
    """Where a job that --exit-interval ends before the run's end stops, and which samples of the data phase it
    reads (the data line counts the whole run, whose index all its jobs share). A job that resumes where the
    interval ended the one before also says that it trains on: like Megatron-LM, the interval is checked
    after each step, so re-running a finished recipe phase's command would train into the next phase's
    iterations on this phase's data."""
    interval = run.train.exit_interval
    if not interval or run.train.skip_train:
        return []
    it = state.iteration
    job_end = (it // interval + 1) * interval
    lines = []
    if it and it % interval == 0 and it < total_iters:
        lines.append(f"note: this job resumes at iteration {it:,}, where --exit-interval {interval:,} ended the one "
                     f"before, and trains on to iteration {min(job_end, total_iters):,}; a run that had to end at "
                     f"{it:,} (a recipe's phase) is complete (run_mi300x.sh's END_ITER starts no training there)")
    if job_end >= total_iters:
        return lines
    consumed, upto = train_data_position(state, schedule, job_end)
    samples = upto - consumed
    return lines + [f"this job stops at iteration {job_end:,} (--exit-interval {interval:,}) of {total_iters:,}: "
                    f"its {samples:,} samples ({samples * run.model.seq_length:,} tokens) start at the phase's sample "
                    f"{consumed:,}"]
