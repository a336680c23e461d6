"""pretrain_zaya.py under torchrun (2 gloo processes) computes the single-process losses step by step.

Same global batch, fp32: DP=2 with --eod-mask-loss (uneven loss tokens per rank; against the one-process
run with that flag), DP=2 with the ZeRO-1 optimizer (AdamW shards + distributed Muon),
CP=2 (each rank holds half of every sequence) and TP=2 (Muon on whole matrices, --muon-tp-mode duplicated). Tolerance: 1e-5 relative on the first two steps'
losses (the second one already follows an optimizer step). Later steps get 1e-3: top-1 routing is an
argmax, so float reassociation (sums over ranks instead of micro-batches) can flip a near-tie token
to another expert once the weights have moved, which changes the loss by ~1e-4 without any bug."""
import os
import re
import subprocess
import sys

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.parallel.parallel_launcher import free_port
from tests.training.helpers import tiny_run_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def losses(logdir, tag: str = "lm loss") -> list[float]:
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars(tag)]


def train(corpus, tmp_path, name, nproc, *extra) -> list[float]:
    tb = tmp_path / name
    argv = tiny_run_flags(corpus, tmp_path, **{"--tensorboard-dir": tb, "--train-iters": 4, "--eval-iters": 0,
                                                "--micro-batch-size": 1, "--global-batch-size": 4}) + list(extra)
    env = dict(os.environ, OMP_NUM_THREADS="1", MEGATRON_ZAYA_KERNELS="torch")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    if nproc == 1:
        cmd = [sys.executable, "pretrain_zaya.py", *argv]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
               "127.0.0.1", "--master-port", str(free_port()), "pretrain_zaya.py", *argv]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # torch's renamed collectives are called by their current names (the old ones warn on every call)
    assert "FutureWarning" not in result.stderr, result.stderr[-3000:]
    if "--use-distributed-optimizer" in extra:   # the memory report, logged once by rank 0
        assert result.stdout.count("ZeRO-1 on rank 0: ") == 1, result.stdout[-3000:]
        assert "adamw: ZeRO-1 master+optimizer state" in result.stdout and "MiB on any rank" in result.stdout
    return losses(tb)


@pytest.fixture(scope="module")
def shared_train(tiny_corpus, tmp_path_factory):
    """train(), each command run once in this module: a run two tests make (the same processes and flags, in
    the same order) gives both the same losses."""
    runs = {}

    def run(nproc, *extra):
        if (nproc, extra) not in runs:
            runs[nproc, extra] = train(tiny_corpus, tmp_path_factory.mktemp("shared"), "run", nproc, *extra)
        return runs[nproc, extra]
    return run


@pytest.fixture(scope="module")
def reference_run(tiny_corpus, tmp_path_factory):
    """The single-process run: (its losses, its TensorBoard folder)."""
    folder = tmp_path_factory.mktemp("single")
    return train(tiny_corpus, folder, "single", 1), folder / "single"


@pytest.fixture(scope="module")
def reference_losses(reference_run):
    return reference_run[0]


@pytest.fixture(scope="module")
def eod_reference_run(tiny_corpus, tmp_path_factory):
    """The single-process run with --eod-mask-loss (micro-batches with uneven loss-mask token counts, so a loss
    averaged per micro-batch or per rank differs from the per-token one): (its losses, its TensorBoard folder)."""
    folder = tmp_path_factory.mktemp("single-eod")
    return train(tiny_corpus, folder, "single-eod", 1, "--eod-mask-loss"), folder / "single-eod"


@pytest.mark.parametrize("name, extra", [
    # --eod-mask-loss: the ranks hold different numbers of loss tokens; the loss and the gradient are per token of
    # the GLOBAL batch (the token count summed over the data-parallel ranks), as on one process
    ("dp2-eod-mask-loss", ["--eod-mask-loss"]),
    ("dp2-zero1", ["--use-distributed-optimizer"]),
    ("cp2", ["--context-parallel-size", "2"]),
    ("cp2-recompute", ["--context-parallel-size", "2", "--recompute-granularity", "full"]),   # halo p2p rerun
    ("cp2-selective", ["--context-parallel-size", "2", "--recompute-granularity", "selective"]),
    ("tp2-muon", ["--tensor-model-parallel-size", "2"]),    # Muon orthogonalises whole matrices under TP
    # the whole MoE sublayer runs again in the backward, its EP all-to-all included
    ("ep2-moe-recompute", ["--expert-model-parallel-size", "2", "--moe-layer-recompute"]),
])
def test_two_processes_match_one(shared_train, reference_losses, name, extra, request):
    if "--eod-mask-loss" in extra:
        reference_losses = request.getfixturevalue("eod_reference_run")[0]
    got = shared_train(2, *extra)
    assert len(got) == len(reference_losses) == 4
    assert got[:2] == pytest.approx(reference_losses[:2], rel=1e-5), (got, reference_losses)
    assert got == pytest.approx(reference_losses, rel=1e-3), (got, reference_losses)


def test_one_process_zero1_runs_the_distributed_optimizer(tiny_corpus, tmp_path, reference_run):
    """--use-distributed-optimizer on one process is Megatron's distributed optimizer at DP 1 (its memory
    report is logged: train() checks), not silently the plain one; the same losses, and the same gradient
    norm at every step (the distributed runtime's clip and the single-process one's: both clip, at the
    default --clip-grad 1.0, these norms being above it)."""
    reference_losses, reference_folder = reference_run
    got = train(tiny_corpus, tmp_path, "zero1-one-process", 1, "--use-distributed-optimizer")
    assert got[:2] == pytest.approx(reference_losses[:2], rel=1e-5), (got, reference_losses)
    assert got == pytest.approx(reference_losses, rel=1e-3), (got, reference_losses)
    norms, reference_norms = losses(tmp_path / "zero1-one-process", "grad-norm"), losses(reference_folder, "grad-norm")
    assert len(norms) == 4 and norms[0] > 1.0
    assert norms[:2] == pytest.approx(reference_norms[:2], rel=1e-5), (norms, reference_norms)
    assert norms == pytest.approx(reference_norms, rel=1e-3), (norms, reference_norms)


def test_the_micro_batch_size_changes_neither_the_loss_nor_the_gradient(tiny_corpus, tmp_path, eod_reference_run):
    """One process, --eod-mask-loss (micro-batches with different numbers of loss tokens): the global batch of 4 as
    one micro-batch of 4 or as 4 accumulated micro-batches of 1 has the same loss and gradient norm (both are per
    loss token of the global batch: neither a mean of per-micro-batch means nor scaled by the micro-batch count).
    Reference: the micro-batch-1 run; 1e-5 relative on the losses, 1e-4 on the norms, first two steps (float sums
    in another order)."""
    reference_losses, reference_folder = eod_reference_run
    got = train(tiny_corpus, tmp_path, "mb4", 1, "--eod-mask-loss", "--micro-batch-size", "4")
    assert got[:2] == pytest.approx(reference_losses[:2], rel=1e-5), (got, reference_losses)
    norms, reference_norms = losses(tmp_path / "mb4", "grad-norm"), losses(reference_folder, "grad-norm")
    assert norms[:2] == pytest.approx(reference_norms[:2], rel=1e-4), (norms, reference_norms)


@pytest.mark.parametrize("nproc, layout", [
    (2, []),
    # sequence-parallel parameters are sharded over TP x DP: every TP rank writes its pieces; bf16
    # weights (TP slices) with fp32 masters, and fp32 routers reduced over the world group
    (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--optimizer", "adamw", "--bf16"]),
    # bf16 weights: the fp32 masters (AdamW pieces, Muon matrices) must come back; the replicas' weights are
    # compared after every step (the run of test_zero1_with_bf16_weights_trains_like_one_process, shared with it)
    (2, ["--bf16", "--check-weight-hash-across-dp-replicas-interval", "1"]),
    (1, ["--bf16"]),     # the same on one process (DP 1)
], ids=["dp2", "tp2-sp-adamw-bf16", "dp2-bf16", "dp1-bf16"])
def test_zero1_stop_and_resume_is_exact(tiny_corpus, tmp_path, shared_train, nproc, layout):
    """Under ZeRO-1 (sharded AdamW masters + distributed Muon momentum), stopping after 2 steps and
    resuming from the checkpoint gives bit-identical losses to the uninterrupted run."""
    straight = shared_train(nproc, "--use-distributed-optimizer", *layout)
    save = ["--use-distributed-optimizer", *layout, "--save", str(tmp_path / "ckpt"), "--load", str(tmp_path / "ckpt")]
    first = train(tiny_corpus, tmp_path, "first", nproc, *save, "--exit-interval", "2")
    second = train(tiny_corpus, tmp_path, "second", nproc, *save)
    assert len(first) == 2 and len(second) == 2
    assert first + second == straight
    if "--bf16" in layout:
        check_bf16_weights_with_fp32_masters(tmp_path / "ckpt" / "iter_0000004")
    else:      # fp32 weights are their own masters: the checkpoint holds them once
        from megatron_zaya.checkpoint.format import CheckpointFolder
        assert not [k for k in CheckpointFolder(str(tmp_path / "ckpt" / "iter_0000004")).keys("optim/")
                    if k.endswith("/master")]


def check_bf16_weights_with_fp32_masters(folder):
    """A --bf16 ZeRO-1 checkpoint: bf16 weights (fp32 router), an fp32 master for every weight that is
    not fp32 (AdamW pieces and Muon matrices alike), equal to the weight up to bf16 rounding. The
    offline loader (HF export, generation) takes the masters."""
    from megatron_zaya.checkpoint.format import CheckpointFolder
    from megatron_zaya.checkpoint.inspection import load_full_model_state
    ckpt = CheckpointFolder(str(folder))
    state, _, info = load_full_model_state(str(folder))
    names = [k[len("model/"):] for k in ckpt.keys("model/")]
    masters = {k[len("optim/"):-len("/master")] for k in ckpt.keys("optim/") if k.endswith("/master")}
    for name in names:
        weight = ckpt.full("model/" + name)
        if ".router." in name:
            assert weight.dtype == torch.float32, name
            continue
        assert weight.dtype == torch.bfloat16 and name in masters, name
        master = ckpt.full(f"optim/{name}/master").reshape(weight.shape)
        assert master.dtype == torch.float32 and torch.equal(master.to(torch.bfloat16), weight), name
        assert torch.equal(state[name], master), name
    assert info["masters"] == len(masters) > 0
    assert any(".experts." in name for name in masters)      # Muon's (DistributedMuon) or AdamW's


def scalar(logdir, tag) -> list[float]:
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars(tag)]


@pytest.mark.parametrize("packing", [[], ["--reset-attention-mask", "--reset-position-ids"]],
                         ids=["causal", "packed-documents"])
def test_tensor_parallel_with_shared_kv_heads_logs_single_process_norms(tiny_corpus, tmp_path, packing):
    """TP=2 over a 1-KV-head model (the KV head is replicated on both ranks): the logged loss,
    gradient norm and parameter norm count every element once, as one process does; also with
    packed documents (CCA's convolutions and value shift restart at each document on both ranks)."""
    flags = ["--num-query-groups", "1", "--train-iters", "1", *packing]
    single = train(tiny_corpus, tmp_path, "tp1", 1, *flags)
    tp2 = train(tiny_corpus, tmp_path, "tp2", 2, *flags, "--tensor-model-parallel-size", "2")
    assert tp2 == pytest.approx(single, rel=1e-5)
    for tag in ("params-norm", "grad-norm"):
        assert scalar(tmp_path / "tp2", tag) == pytest.approx(scalar(tmp_path / "tp1", tag), rel=1e-5), tag


@pytest.mark.parametrize("nproc, layout", [
    (2, ["--context-parallel-size", "2"]),
    # CP x TP with sequence parallelism (TP's replicated K/V in the chunks) and the segmented conv recomputed
    (4, ["--context-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
         "--recompute-granularity", "selective"]),
], ids=["cp2", "cp2-tp2-sp-selective"])
def test_context_parallel_packed_documents_match_one_process(tiny_corpus, tmp_path, nproc, layout):
    """--reset-attention-mask under CP=2: each rank holds two chunks of every packed sequence; the
    documents stay apart across the chunk boundaries (the gathered document ids, the chunk masks and the
    halo's own visibility), so the losses equal one process's, and the first step's gradient norm (the same
    weights on both sides; later ones drift by float reassociation, as the unpacked CP run's do). Sequences
    of 64 hold several documents: the packed run's losses differ from the unpacked one's."""
    flags = ["--seq-length", "64", "--train-iters", "2", "--reset-attention-mask", "--reset-position-ids"]
    single = train(tiny_corpus, tmp_path, "packed1", 1, *flags)
    parallel = train(tiny_corpus, tmp_path, "packed-cp", nproc, *flags, *layout)
    assert parallel == pytest.approx(single, rel=1e-5)
    assert scalar(tmp_path / "packed-cp", "grad-norm")[0] == pytest.approx(scalar(tmp_path / "packed1", "grad-norm")[0],
                                                                         rel=1e-5)
    if nproc == 2:
        unpacked = train(tiny_corpus, tmp_path, "unpacked1", 1, "--seq-length", "64", "--train-iters", "2")
        assert abs(unpacked[0] - single[0]) > 1e-4, (unpacked, single)


def test_log_straggler_names_the_slow_rank(tiny_corpus, tmp_path):
    """--log-straggler under DP=2 with rank 1 sleeping 0.25 s in each of its 2 forwards per step: the
    console names rank 1 as the slowest at every log line (each rank's own forward+backward is
    timed, so rank 0's wait for rank 1 does not count)."""
    argv = tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": 3, "--eval-iters": 0, "--micro-batch-size": 1,
                                                      "--global-batch-size": 4, "--log-straggler": ""})
    env = dict(os.environ, OMP_NUM_THREADS="1", MEGATRON_ZAYA_KERNELS="torch", FAULT_RANK="1", SLOW_SECONDS="0.25")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "tests/training/faulty_rank_pretrain.py", *argv]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if "stragglers (forward+backward per iteration)" in line]
    assert len(lines) == 3, result.stdout[-3000:]
    for line in lines:
        slowest, fastest, ratio = re.search(r"slowest rank (\d) [\d.]+ s \| fastest rank (\d) [\d.]+ s \| "
                                            r"slowest/fastest ([\d.]+)x", line).groups()
        assert (slowest, fastest) == ("1", "0") and float(ratio) > 1.5, line


def test_zero1_with_bf16_weights_trains_like_one_process(tiny_corpus, tmp_path, shared_train):
    """--bf16 under ZeRO-1 stores the weights in bf16 (masters in the optimizer shards); one process
    keeps fp32 weights under the same autocast, whose matmuls see the same bf16-rounded weights. The
    losses differ by the rounding of the rest (embedding, norms, scales) and of each update: 6e-6
    relative at step 1 and 5e-4 by step 4 when measured (2026-12-04); allowed: 1e-4 and 2e-3. Both
    ranks' weights are compared bit for bit after every step (--check-weight-hash-across-dp-replicas-
    interval 1): the shards' all-gathers and DistributedMuon's gathers leave identical replicas."""
    single = train(tiny_corpus, tmp_path, "single-bf16", 1, "--bf16")
    zero1 = shared_train(2, "--use-distributed-optimizer", "--bf16", "--check-weight-hash-across-dp-replicas-interval",
                         "1")
    assert zero1[0] == pytest.approx(single[0], rel=1e-4), (zero1, single)
    assert zero1 == pytest.approx(single, rel=2e-3), (zero1, single)


def test_zero1_keeps_the_decoupled_lr_and_the_weight_decay_schedule(tiny_corpus, tmp_path):
    """ZeRO-1 builds its own parameter groups (AdamW shards, distributed Muon): the output layer's and
    embedding's --decoupled-lr group and the weight-decay schedule must reach them as they reach the
    single-process optimizer. Large values so that a group on the wrong lr or decay moves the loss by far
    more than the tolerance (1e-5 relative on the first two steps, as above; 1e-3 after)."""
    flags = ["--untie-embeddings-and-output-weights", "--decoupled-lr", "3e-2", "--decoupled-min-lr", "3e-3",
             "--lr-decay-style", "cosine", "--min-lr", "3e-4", "--start-weight-decay", "0.5",
             "--end-weight-decay", "2.0", "--weight-decay-incr-style", "linear"]
    single = train(tiny_corpus, tmp_path, "single-decoupled", 1, *flags)
    zero1 = train(tiny_corpus, tmp_path, "zero1-decoupled", 2, "--use-distributed-optimizer", *flags)
    assert zero1[:2] == pytest.approx(single[:2], rel=1e-5), (zero1, single)
    assert zero1 == pytest.approx(single, rel=1e-3), (zero1, single)


def test_fp32_zero1_ranks_all_start_from_a_bf16_checkpoints_masters(tiny_corpus, tmp_path):
    """A --bf16 ZeRO-1 checkpoint holds bf16 weights and their fp32 masters. An fp32 run takes the masters
    as its weights on every rank: under ZeRO-1 too, where each rank's optimizer holds only its own shard's
    masters (a rank kept the bf16 rounding of the others). The first step's loss is a forward of the
    loaded weights on the same batch: equal, bit for bit, to plain DP2's, with and without the optimizer."""
    ckpt = str(tmp_path / "bf16-zero1")
    train(tiny_corpus, tmp_path, "bf16-zero1", 2, "--bf16", "--use-distributed-optimizer", "--save", ckpt,
          "--train-iters", "3")
    plain = train(tiny_corpus, tmp_path, "dp2-fresh", 2, "--load", ckpt, "--no-load-optim")
    fresh = train(tiny_corpus, tmp_path, "zero1-fresh", 2, "--load", ckpt, "--no-load-optim",
                  "--use-distributed-optimizer")
    full = train(tiny_corpus, tmp_path, "zero1-full", 2, "--load", ckpt, "--use-distributed-optimizer")
    assert len(plain) == 1 and fresh == plain and full == plain, (plain, fresh, full)
    # The logged params norm is that of the fp32 masters (Megatron-LM's), each counted once over the two ranks'
    # shards, not of the bf16 weights: within 1e-6 of the float64 norm of the checkpoint's masters.
    from megatron_zaya.checkpoint import load_full_model_state
    from megatron_zaya.model import ZayaModel
    state, config, info = load_full_model_state(ckpt)
    with torch.device("meta"):
        names = [name for name, _ in ZayaModel(config).named_parameters()]
    assert info["iteration"] == 3 and info["masters"] > 0
    masters_norm = torch.cat([state[n].double().reshape(-1) for n in names]).norm().item()
    bf16_norm = torch.cat([state[n].to(torch.bfloat16).double().reshape(-1) for n in names]).norm().item()
    logged = scalar(tmp_path / "bf16-zero1", "params-norm")[-1]
    assert logged == pytest.approx(masters_norm, rel=1e-6) and bf16_norm != pytest.approx(masters_norm, rel=1e-5), (
        logged, masters_norm, bf16_norm)


def test_data_parallel_params_norm_counts_each_weight_once(tiny_corpus, tmp_path, reference_run):
    """Two data-parallel replicas hold the same weights: the logged parameter norm is one process's, not
    sqrt(2) times it (each element is counted on one rank only)."""
    train(tiny_corpus, tmp_path, "dp2-norm", 2, "--train-iters", "1")
    got, want = scalar(tmp_path / "dp2-norm", "params-norm"), scalar(reference_run[1], "params-norm")
    assert len(got) == 1 and got[0] == pytest.approx(want[0], rel=1e-5), (got, want)


def test_tensor_parallel_sequence_parallel_zero1_params_norm_counts_every_rank_s_masters(tiny_corpus, tmp_path):
    """bf16 + ZeRO-1 under TP=2 with sequence parallelism: the replicated weights' fp32 masters are sharded over
    the whole world, TP rank 1 owning half of them; the logged parameter norm counts those pieces too (it was
    18% low), as one process with the same flags logs it."""
    flags = ["--train-iters", "1", "--bf16", "--use-distributed-optimizer"]
    train(tiny_corpus, tmp_path, "zero1-single", 1, *flags)
    train(tiny_corpus, tmp_path, "zero1-tp2-sp", 2, *flags, "--tensor-model-parallel-size", "2", "--sequence-parallel")
    got, want = scalar(tmp_path / "zero1-tp2-sp", "params-norm"), scalar(tmp_path / "zero1-single", "params-norm")
    assert len(got) == 1 and got[0] == pytest.approx(want[0], rel=1e-5), (got, want)
