"""End-to-end training throughput: full iterations (forward, backward, optimizer, balancing update)
through the real Trainer.train_step and runtime, on synthetic token batches (no dataset needed).

    # one process (CPU: 2 threads)
    python bench/train_throughput.py --preset zaya1-100m --micro-batch-size 4 --global-batch-size 8 --bf16
    # the same, plus transformers' ZayaForCausalLM trained with the same optimizer and batches
    python bench/train_throughput.py --preset zaya1-100m --micro-batch-size 4 --global-batch-size 8 --bf16 \
        --compare-reference
    # two processes (CPU: 1 thread each): data parallel, then expert parallel
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 bench/train_throughput.py --preset zaya1-tiny --bf16
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 bench/train_throughput.py --preset zaya1-tiny --bf16 \
        --expert-model-parallel-size 2
    # one GPU (see bench/gpu_train_throughput.sh)
    python bench/train_throughput.py --preset zaya1-base-4l --seq-length 4096 --micro-batch-size 1 --bf16

Prints tokens/s (all ranks), model TFLOP/s (accounting.training_flops_per_token: only the active
expert counts), MFU against this machine's MEASURED bf16 and fp32 matmul peaks (CPU; on a GPU the
vendor bf16 table of training.metrics and a measured 8192^2 matmul), the time split of a step and
the peak memory. Timing: `--warmup` untimed steps, then `--iters` timed steps; step time = median.

Time split, per step (exclusive, they add up to the step time):
  data           fetching the micro-batches (synthetic: random tokens)
  forward        the model's forward (hooks on the model), collectives inside it excluded
  backward       from the end of a forward to the next forward / the gradient-reduction wait
  communication  time inside torch.distributed collectives (and waiting on their async handles)
  optimizer      gradient clipping (norm) + Muon/AdamW step
  balancing      the router balancing-bias update
  other          the rest of train_step (zero_grad, token counting, loss bookkeeping)
Peak memory: CPU: the process's peak resident set (VmHWM, reset before the timed steps);
GPU: torch.cuda.max_memory_allocated.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from megatron_zaya.arguments import ParallelSizes, RunConfig  # noqa: E402
from megatron_zaya.config import model_config_from_preset  # noqa: E402
from megatron_zaya.model import ZayaModel  # noqa: E402
from megatron_zaya.model.accounting import count_parameters, training_flops_per_token  # noqa: E402
from megatron_zaya.optim.builder import OptimizerConfig, build_optimizer  # noqa: E402
from megatron_zaya.training.config import TrainConfig  # noqa: E402
from megatron_zaya.training.loop import Trainer  # noqa: E402
from megatron_zaya.training.setup import build_runtime  # noqa: E402
from megatron_zaya.training.metrics import measure_matmul_tflops, rated_peak_tflops  # noqa: E402
from megatron_zaya.parallel.launch import exit_process  # noqa: E402
from bench.step_phases import PHASES, PhaseClock, instrument, time_collectives  # noqa: E402


# ------------------------------------------------------------------------------------------- memory
def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        reset_peak_rss()


def peak_memory(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else peak_rss_bytes()


# ------------------------------------------------------------------------------------------- peaks
def matmul_peaks(device: torch.device, sizes=(1024, 2048), repeats: int = 10) -> dict[str, float]:
    """Best measured square-matmul TFLOP/s in bf16 and fp32 (the MFU denominators)."""
    peaks = {}
    for dtype, key in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        if device.type == "cuda":
            peaks[key] = measure_matmul_tflops(dtype, 8192, repeats, device="cuda")
        else:
            peaks[key] = max(measure_matmul_tflops(dtype, s, repeats) for s in sizes)
    rated = rated_peak_tflops(device) if device.type == "cuda" else None
    if rated is not None:
        peaks["bf16_table"] = rated[0]
    return peaks


# ------------------------------------------------------------------------------------------- data
def synthetic_batches(vocab: int, micro_batch: int, seq: int, seed: int, document_length: int | None = None):
    """Endless micro-batches shaped like the GPT dataset's (tokens, labels, loss_mask, position_ids); with
    `document_length`, packed documents of that many tokens as --reset-attention-mask --reset-position-ids
    give them (document ids, positions restarting at each document)."""
    gen = torch.Generator().manual_seed(seed)
    steps = torch.arange(seq)
    positions = (steps if document_length is None else steps % document_length).unsqueeze(0).expand(micro_batch, seq)
    extra = {} if document_length is None else {
        "document_ids": (steps // document_length).unsqueeze(0).expand(micro_batch, seq).contiguous()}
    while True:
        text = torch.randint(0, vocab, (micro_batch, seq + 1), generator=gen)
        yield {"tokens": text[:, :-1].contiguous(), "labels": text[:, 1:].contiguous(),
               "loss_mask": torch.ones(micro_batch, seq), "position_ids": positions.contiguous(), **extra}


# ------------------------------------------------------------------------------------------- runs
def load_average() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def build_run(args, world_size: int) -> RunConfig:
    overrides = {"seq_length": args.seq_length} if args.seq_length else {}
    if args.num_layers:
        overrides["num_layers"] = args.num_layers
    model = model_config_from_preset(args.preset, **overrides)
    if model.max_position_embeddings < model.seq_length:
        model = model.replace(max_position_embeddings=model.seq_length)
    total = args.warmup + args.iters
    train = TrainConfig(micro_batch_size=args.micro_batch_size, global_batch_size=args.global_batch_size,
                        train_iters=total, lr_warmup_iters=0, lr_decay_iters=total, lr_decay_style="constant",
                        bf16=args.bf16, seed=args.seed, log_interval=1, eval_interval=10 ** 9, eval_iters=0,
                        peak_tflops=1.0)   # the real peaks are measured here, not by the Trainer
    optim = OptimizerConfig(optimizer=args.optimizer, lr=args.lr)
    parallel = ParallelSizes(world_size, args.tensor_model_parallel_size, args.context_parallel_size,
                             args.expert_model_parallel_size, args.sequence_parallel, args.use_distributed_optimizer)
    ns = argparse.Namespace(distributed_backend=args.distributed_backend)
    return RunConfig(model, train, optim, parallel, None, ns)


def run_ours(args, run, runtime, peaks) -> dict:
    torch.manual_seed(run.train.seed)
    model = ZayaModel(run.model)
    model.set_force_load_balancing(args.moe_router_force_load_balancing)
    model.set_recompute(args.recompute_granularity, modules=args.recompute_modules)
    model = runtime.prepare_model(model)
    optimizer = runtime.build_optimizer(model, run.optim)
    trainer = Trainer(run, model, optimizer, runtime, None, None, logger=None)
    trainer.train_iterator = synthetic_batches(run.model.vocab_size, run.train.micro_batch_size,
                                               run.model.seq_length, args.seed + 1000 * runtime.dp_rank,
                                               args.document_length)
    sync = (lambda: torch.cuda.synchronize(runtime.device)) if runtime.device.type == "cuda" else None
    clock = PhaseClock(sync)
    time_collectives(clock)
    instrument(trainer, clock)
    model.train()

    def step():
        clock.switch("data")
        batches = trainer.next_micro_batches()
        clock.switch("other")
        result = trainer.train_step(batches)
        clock.switch(None)
        trainer.state.iteration += 1
        trainer.state.consumed_samples += run.train.global_batch_size
        return result

    losses, times = [], []
    for i in range(args.warmup + args.iters):
        if i == args.warmup:
            clock.reset()
            reset_peak_memory(runtime.device)
        start = time.perf_counter()
        result = step()
        times.append(time.perf_counter() - start)
        losses.append(result.loss)
    timed = times[args.warmup:]
    split = {k: clock.totals.get(k, 0.0) / args.iters for k in PHASES}
    out = dict(step_s=statistics.median(timed), mean_step_s=statistics.fmean(timed), split_s=split,
               peak_memory_bytes=peak_memory(runtime.device), losses=losses, tokens_per_step=result.num_tokens)
    if args.profile and runtime.is_main:
        profile_steps(step, args.profile, args.profile_steps)
    out["step"], out["trainer"] = step, trainer
    return out


def compare_weight_casts(trainer, step, iters: int) -> dict:
    """Steps alternating with the per-step bf16 weight copies (model/weight_casts.py) on and off: the
    trainer's WeightCasts is the model's (on) or a detached one the model never sees (off)."""
    from megatron_zaya.model.weight_casts import WeightCasts

    shared, detached = trainer.weight_casts, WeightCasts()
    times: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(iters + 1):
        for name, casts in (("on", shared), ("off", detached)):
            trainer.weight_casts = casts
            start = time.perf_counter()
            step()
            if i:
                times[name].append(time.perf_counter() - start)
    trainer.weight_casts = shared
    ratios = [off / on for on, off in zip(times["on"], times["off"])]
    return dict(on_s=statistics.median(times["on"]), off_s=statistics.median(times["off"]),
                pair_speedup=statistics.median(ratios))


def profile_steps(step, path: str, steps: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            step()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "ops.txt"), "w") as f:
        f.write(table)
    prof.export_chrome_trace(os.path.join(path, "trace.json"))
    print(table)
    print(f"profile of {steps} step(s) written to {path}/ops.txt and {path}/trace.json")


def run_reference(args, run, device):
    """transformers.ZayaForCausalLM with our initial weights, trained on the same batches with the same
    optimizer split (Muon matrices / AdamW rest, by our parameter names), bf16 autocast, clipping."""
    import transformers

    from megatron_zaya.checkpoint.hf_format import hf_to_ours_name, save_hf_folder

    torch.manual_seed(run.train.seed)
    ours = ZayaModel(run.model)
    with tempfile.TemporaryDirectory() as tmp:
        save_hf_folder(ours.state_dict(), run.model, os.path.join(tmp, "hf"))
        del ours
        reference = transformers.ZayaForCausalLM.from_pretrained(os.path.join(tmp, "hf"), attn_implementation="sdpa")
    reference.to(device).train()

    class Named:
        def named_parameters(self):
            return [(hf_to_ours_name(n), p) for n, p in reference.named_parameters()]

    optimizer = build_optimizer(Named(), run.optim)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=run.train.bf16)
    batches = synthetic_batches(run.model.vocab_size, run.train.micro_batch_size, run.model.seq_length, args.seed)
    per_step = run.train.global_batch_size // run.train.micro_batch_size
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def step():
        optimizer.zero_grad()
        micro = [next(batches) for _ in range(per_step)]
        n_tokens = sum(float(mb["loss_mask"].sum()) for mb in micro)
        total = 0.0
        for mb in micro:
            mb = {k: v.to(device) for k, v in mb.items()}
            with autocast:
                logits = reference(input_ids=mb["tokens"], position_ids=mb["position_ids"]).logits
            losses = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), mb["labels"].flatten(),
                                                       reduction="none")
            loss = (losses * mb["loss_mask"].flatten()).sum() / n_tokens
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_([p for p in reference.parameters() if p.grad is not None],
                                       run.optim.clip_grad)
        optimizer.set_lr(run.optim.lr)
        optimizer.step()
        sync()
        return total

    return step


def compare_reference(args, run, device, ours_step) -> dict:
    """The reference's warmup, then `--iters` steps of each, alternating (ours, reference, ...) so a
    change of machine load hits both alike. Speed-up = median reference step / median ours."""
    ref_step = run_reference(args, run, device)
    losses = [ref_step() for _ in range(args.warmup)]
    ours_times, ref_times = [], []
    for _ in range(args.iters):
        start = time.perf_counter()
        ours_step()
        ours_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        losses.append(ref_step())
        ref_times.append(time.perf_counter() - start)
    return dict(step_s=statistics.median(ref_times), ours_step_s=statistics.median(ours_times), losses=losses,
                tokens_per_step=run.train.global_batch_size * run.model.seq_length)


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="zaya1-tiny")
    parser.add_argument("--seq-length", type=int, default=None, help="default: the preset's")
    parser.add_argument("--num-layers", type=int, default=None, help="default: the preset's")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--global-batch-size", type=int, default=None, help="default: micro batch x DP")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (fp32 master weights)")
    parser.add_argument("--optimizer", choices=["muon", "adamw"], default="muon")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per process (default: CPUs / processes on this node)")
    parser.add_argument("--tensor-model-parallel-size", type=int, default=1)
    parser.add_argument("--context-parallel-size", type=int, default=1)
    parser.add_argument("--expert-model-parallel-size", type=int, default=1)
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--document-length", type=int, default=None,
                        help="packed documents of this many tokens (--reset-attention-mask): document ids in "
                             "every batch")
    parser.add_argument("--recompute-granularity", choices=["full", "selective"], default=None)
    parser.add_argument("--recompute-modules", nargs="+", default=None, metavar="MODULE",
                        help="with --recompute-granularity selective: layernorm, core_attn, moe_act, moe")
    parser.add_argument("--use-distributed-optimizer", action="store_true")
    parser.add_argument("--moe-router-force-load-balancing", action="store_true",
                        help="every router splits its tokens evenly over the experts (a balanced expert load "
                             "whatever the random init routes)")
    parser.add_argument("--distributed-backend", choices=["nccl", "gloo"], default=None)
    parser.add_argument("--kernels", choices=["auto", "triton", "torch"], default=None,
                        help="megatron_zaya.kernels backend (default: MEGATRON_ZAYA_KERNELS or auto)")
    parser.add_argument("--compile", action="store_true",
                        help="reference (CPU) kernels through torch.compile (kernels.set_reference_compile)")
    parser.add_argument("--compare-reference", action="store_true",
                        help="also train transformers' ZayaForCausalLM on the same batches (1 process only)")
    parser.add_argument("--weight-casts-ab", action="store_true",
                        help="after timing, --iters more steps of each, alternating: the micro-batches sharing one "
                             "bf16 copy of the weights per step (the trainer's default on CPU) and casting anew")
    parser.add_argument("--profile", default=None, help="after timing, profile --profile-steps steps into this dir")
    parser.add_argument("--profile-steps", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)

    from megatron_zaya import kernels
    if args.kernels:
        kernels.set_kernel_backend(args.kernels)
    if args.compile:
        kernels.set_reference_compile(True)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    cpus = os.cpu_count() or 1
    if args.compare_reference and world_size > 1:
        parser.error("--compare-reference runs in a single process")
    if args.compare_reference and args.document_length:
        parser.error("--compare-reference trains the reference on unpacked sequences: drop --document-length")
    if args.document_length is not None and args.document_length < 1:
        parser.error(f"--document-length={args.document_length}: must be >= 1")
    dp = world_size // (args.tensor_model_parallel_size * args.context_parallel_size)
    if args.global_batch_size is None:
        args.global_batch_size = args.micro_batch_size * dp
    run = build_run(args, world_size)
    load_before = load_average()

    runtime = build_runtime(run)
    device = runtime.device
    # The peaks: measured once, by one process using every CPU of the node while the others wait.
    if world_size > 1:
        runtime.barrier()
    peaks = None
    if runtime.rank == 0 or device.type == "cuda":
        torch.set_num_threads(cpus)
        peaks = matmul_peaks(device)
    if world_size > 1:
        holder = [peaks]
        dist.broadcast_object_list(holder, src=0)
        peaks = holder[0]
    threads = args.threads or max(1, cpus // max(1, local_world))
    torch.set_num_threads(threads)

    result = run_ours(args, run, runtime, peaks)
    trainer = result.pop("trainer")
    if args.weight_casts_ab:
        ab = compare_weight_casts(trainer, result["step"], args.iters)
        if runtime.is_main:
            print(f"per-step weight copies, steps alternating: on {ab['on_s']:.3f} s/step, off {ab['off_s']:.3f} "
                  f"s/step, per-pair speed-up median {ab['pair_speedup']:.3f}x", flush=True)
    reference = compare_reference(args, run, device, result.pop("step")) if args.compare_reference else None
    result.pop("step", None)
    load_after = load_average()

    if world_size > 1:
        stats = torch.tensor([result["step_s"], float(result["peak_memory_bytes"])], dtype=torch.float64)
        gathered = [torch.zeros_like(stats) for _ in range(world_size)]
        dist.all_gather(gathered, stats)
        result["step_s"] = max(float(g[0]) for g in gathered)       # the slowest rank sets the pace
        result["peak_memory_bytes_per_rank"] = [int(g[1]) for g in gathered]
        split_t = torch.tensor([result["split_s"][k] for k in PHASES], dtype=torch.float64)
        dist.all_reduce(split_t)
        result["split_s"] = {k: float(v) / world_size for k, v in zip(PHASES, split_t)}   # mean over ranks
    if not runtime.is_main:
        finish(runtime, world_size)
        return 0

    cfg = run.model
    flops_per_token = training_flops_per_token(cfg, cfg.seq_length)
    counts = count_parameters(cfg)
    tokens = result["tokens_per_step"]
    tokens_per_s = tokens / result["step_s"]
    tflops = tokens_per_s * flops_per_token / 1e12
    per_device_peaks = dict(peaks)
    n_devices = world_size if device.type == "cuda" else 1   # CPU: all processes share the one measured CPU
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": cpu_model_name() if device.type == "cpu"
        else torch.cuda.get_device_name(device), "cpus": cpus, "threads_per_process": threads,
        "torch": torch.__version__, "device": str(device), "world_size": world_size,
        "layout": dict(tp=args.tensor_model_parallel_size, cp=args.context_parallel_size, dp=dp,
                       ep=args.expert_model_parallel_size, distributed_optimizer=args.use_distributed_optimizer),
        "preset": args.preset, "num_layers": cfg.num_layers, "parameters": counts.total,
        "active_parameters": counts.active_non_embedding(cfg.num_experts) + counts.embedding,
        "seq_length": cfg.seq_length, "micro_batch_size": args.micro_batch_size,
        "global_batch_size": args.global_batch_size, "dtype": "bf16 autocast" if args.bf16 else "fp32",
        "optimizer": args.optimizer, "kernels": kernels.kernel_backend() + (" + compiled reference ops"
                                                                             if kernels.reference_compiled() else ""),
        "load_before": load_before, "load_after": load_after, "warmup": args.warmup, "iters": args.iters,
        "flops_per_token": flops_per_token, "tokens_per_step": tokens, "step_s": result["step_s"],
        "tokens_per_s": tokens_per_s, "model_tflops": tflops,
        "peak_tflops": per_device_peaks,
        "mfu_bf16": tflops / (per_device_peaks["bf16"] * n_devices),
        "mfu_fp32": tflops / (per_device_peaks["fp32"] * n_devices),
        "split_s": result["split_s"], "peak_memory_bytes": result["peak_memory_bytes"],
        "losses": result["losses"],
    }
    if "bf16_table" in per_device_peaks:
        report["mfu_bf16_table"] = tflops / (per_device_peaks["bf16_table"] * n_devices)
    if "peak_memory_bytes_per_rank" in result:
        report["peak_memory_bytes_per_rank"] = result["peak_memory_bytes_per_rank"]
    if reference is not None:
        report["reference"] = dict(step_s=reference["step_s"], ours_step_s=reference["ours_step_s"],
                                   tokens_per_s=reference["tokens_per_step"] / reference["step_s"],
                                   ours_tokens_per_s=tokens / reference["ours_step_s"], losses=reference["losses"])
        report["speedup_vs_reference"] = reference["step_s"] / reference["ours_step_s"]
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    finish(runtime, world_size)
    return 0


def finish(runtime, world_size: int) -> None:
    """Every rank waits for rank 0's report before any tears gloo down: a rank that destroyed its
    groups while rank 0 still wrote the report aborted at exit once in CI (gloo teardown)."""
    if world_size > 1:
        runtime.barrier()
    if hasattr(runtime, "shutdown"):
        runtime.shutdown()


def print_report(r: dict) -> None:
    gib = 2 ** 30
    lay = r["layout"]
    print(f"# train_throughput {r['date']} | {r['machine']} ({r['cpus']} CPUs) | torch {r['torch']} | "
          f"load before {r['load_before']} after {r['load_after']}")
    print(f"preset {r['preset']} ({r['num_layers']} layers, {r['parameters'] / 1e6:.1f}M params, "
          f"{r['active_parameters'] / 1e6:.1f}M active) | seq {r['seq_length']} | micro {r['micro_batch_size']} "
          f"global {r['global_batch_size']} | {r['dtype']} | optimizer {r['optimizer']} | kernels {r['kernels']}")
    print(f"layout: {r['world_size']} process(es), TP {lay['tp']} CP {lay['cp']} DP {lay['dp']} EP {lay['ep']}"
          f"{' ZeRO-1' if lay['distributed_optimizer'] else ''} | {r['threads_per_process']} thread(s)/process | "
          f"{r['warmup']} warmup + {r['iters']} timed steps")
    peaks = r["peak_tflops"]
    print(f"measured matmul peak: bf16 {peaks['bf16']:.3f} TFLOP/s, fp32 {peaks['fp32']:.3f} TFLOP/s"
          + (f" (vendor bf16 table {peaks['bf16_table']:.0f})" if "bf16_table" in peaks else ""))
    print(f"step {r['step_s']:.3f} s | {r['tokens_per_s']:,.0f} tokens/s | model {r['model_tflops']:.3f} TFLOP/s "
          f"({r['flops_per_token'] / 1e9:.3f} GFLOP/token) | MFU {100 * r['mfu_bf16']:.1f}% of bf16 peak, "
          f"{100 * r['mfu_fp32']:.1f}% of fp32 peak"
          + (f", {100 * r['mfu_bf16_table']:.1f}% of the vendor bf16 peak" if "mfu_bf16_table" in r else ""))
    split = r["split_s"]
    total = sum(split.values()) or 1.0
    print("time split per step: " + ", ".join(f"{k} {1000 * v:.1f} ms ({100 * v / total:.0f}%)"
                                              for k, v in split.items()))
    mem = f"peak memory {r['peak_memory_bytes'] / gib:.2f} GiB"
    if "peak_memory_bytes_per_rank" in r:
        mem += " (per rank: " + ", ".join(f"{b / gib:.2f}" for b in r["peak_memory_bytes_per_rank"]) + " GiB)"
    print(mem)
    print("losses: " + " ".join(f"{x:.4f}" for x in r["losses"]))
    if "reference" in r:
        ref = r["reference"]
        print(f"interleaved with transformers ZayaForCausalLM (same weights, batches, optimizer, dtype, threads): "
              f"ours {ref['ours_step_s']:.3f} s/step {ref['ours_tokens_per_s']:,.0f} tokens/s | reference "
              f"{ref['step_s']:.3f} s/step {ref['tokens_per_s']:,.0f} tokens/s")
        print("reference losses: " + " ".join(f"{x:.4f}" for x in ref["losses"]))
        print(f"speed-up (ours / reference tokens/s): {r['speedup_vs_reference']:.2f}x")


if __name__ == "__main__":
    exit_process(main())
