"""Single-process checks of the rank grid, layout validation, launcher detection and the CP split."""
import pytest
import torch

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.parallel.context import cp_chunk_indices, slice_batch_for_cp
from megatron_zaya.parallel.data import owners_of_bucket, shard_range
from megatron_zaya.parallel.launch import detect_launcher, expand_slurm_nodelist
from megatron_zaya.parallel.state import LayoutError, ParallelState, check_layout, rank_grid


def test_rank_grid_megatron_order():
    g = rank_grid(16, tp=2, cp=2, ep=4)
    assert g["tp"][0] == [0, 1] and g["tp"][1] == [2, 3]            # tensor ranks adjacent
    assert g["cp"][0] == [0, 2]
    assert g["dp"][0] == [0, 4, 8, 12]                                # data parallel varies slowest
    assert g["dp_cp"][0] == [0, 2, 4, 6, 8, 10, 12, 14]
    assert g["ep"][0] == [0, 2, 4, 6] and g["expert_dp"][0] == [0, 8]  # EP folded inside DP x CP
    for kind, groups in g.items():                                   # every kind partitions the world
        assert sorted(r for grp in groups for r in grp) == list(range(16)), kind


def test_parallel_state_without_process_group():
    ps = ParallelState(1, 1, 1)
    assert (ps.world_size, ps.dp_size, ps.dp_rank, ps.tp_size, ps.expert_dp_size) == (1, 1, 0, 1, 1)


@pytest.mark.parametrize("world,tp,cp,ep,message", [
    (6, 4, 1, 1, "not divisible by --tensor-model-parallel-size=4"),
    (8, 2, 1, 3, "--expert-model-parallel-size=3 must divide"),
    (8, 8, 1, 1, "must divide --num-attention-heads=4"),
    (2, 2, 1, 1, "must divide or be a multiple of --num-query-groups=3"),
    (16, 1, 1, 16, "must divide --num-experts=4"),
])
def test_layout_errors_name_the_flag(world, tp, cp, ep, message):
    cfg = model_config_from_preset("zaya1-tiny", num_attention_heads=6 if world == 2 else 4,
                                   num_query_groups=3 if world == 2 else 2)
    with pytest.raises(LayoutError, match=message):
        check_layout(world, tp, cp, ep, cfg)


def test_launcher_detection():
    assert detect_launcher({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "h",
                            "MASTER_PORT": "1234"}) .__dict__ == dict(
        launcher="torchrun", rank=3, world_size=8, local_rank=1, master_addr="h", master_port=1234)
    info = detect_launcher({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "16",
                            "OMPI_COMM_WORLD_LOCAL_RANK": "5"})
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.master_addr) == ("openmpi", 5, 16, 5, None)
    info = detect_launcher({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0"})
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("mpich", 2, 4, 0)
    info = detect_launcher({"SLURM_PROCID": "9", "SLURM_NTASKS": "1024", "SLURM_LOCALID": "1",
                            "SLURM_JOB_NODELIST": "mi300x-[007-010,042]", "SLURM_JOB_ID": "123",
                            "SLURM_STEP_ID": "0"})
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.master_addr) == \
        ("slurm", 9, 1024, 1, "mi300x-007")
    assert info.master_port == 15123
    assert detect_launcher({}).launcher == "none"


def test_slurm_nodelist():
    assert expand_slurm_nodelist("gpu[001-003,7],login1") == ["gpu001", "gpu002", "gpu003", "gpu7", "login1"]
    assert expand_slurm_nodelist("n5") == ["n5"]
    # several ranges in a name, text after a range: scontrol show hostnames' order (the first host was "rack1")
    assert expand_slurm_nodelist("rack[1-2]-n[01-02],x") == ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02", "x"]
    assert expand_slurm_nodelist("node[1-2]-ib") == ["node1-ib", "node2-ib"]


def test_concurrent_srun_steps_of_a_job_rendezvous_on_different_ports():
    """The port derived from the job id alone was the same for two steps running at once (EADDRINUSE)."""
    step = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "0",
            "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "4242"}
    ports = {detect_launcher({**step, "SLURM_STEP_ID": s}).master_port for s in ("0", "1", "2")}
    assert len(ports) == 3 and all(15000 <= p < 32000 for p in ports)


def test_flags_count_the_processes_the_launcher_will_start(monkeypatch):
    """An sbatch script or salloc shell has SLURM_NTASKS of the job but runs one process: the batch arithmetic
    (data-parallel size) counts 1, as detect_launcher does (it counted SLURM_NTASKS)."""
    from megatron_zaya.arguments import world_size_from_env

    for name in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_STEP_ID", "4294967291")      # the batch script
    assert world_size_from_env() == 1
    monkeypatch.setenv("SLURM_STEP_ID", "0")                # a task of an srun step
    assert world_size_from_env() == 4


def test_cp_split_is_load_balanced_and_complete():
    parts = [cp_chunk_indices(32, 4, r) for r in range(4)]
    assert parts[0].tolist() == [0, 1, 2, 3, 28, 29, 30, 31]
    assert sorted(torch.cat(parts).tolist()) == list(range(32))
    with pytest.raises(ValueError, match="divisible by 2 x --context-parallel-size"):
        cp_chunk_indices(30, 4, 0)

    class PS:
        cp_size, cp_rank = 2, 1

    batch = {"tokens": torch.arange(16).view(2, 8), "labels": torch.arange(16).view(2, 8), "other": 3}
    local = slice_batch_for_cp(batch, PS)
    assert local["tokens"].tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]
    assert local["position_ids"].tolist() == [[2, 3, 4, 5], [2, 3, 4, 5]] and local["other"] == 3


def test_zero_ownership_is_balanced():
    assert [shard_range(12, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 12)]
    owners = owners_of_bucket([100, 60, 50, 40, 10], 2)
    loads = [sum(n for n, o in zip([100, 60, 50, 40, 10], owners) if o == r) for r in range(2)]
    assert sorted(loads) == [120, 140]        # greedy largest-first


def test_single_process_without_launcher(tmp_path):
    """No launcher variables: init_distributed makes a 1-process gloo group, and the parallel form of
    a model with the trivial layout computes exactly what the plain model computes."""
    import os
    import subprocess
    import sys

    script = tmp_path / "single.py"
    script.write_text(
        "import torch\n"
        "from megatron_zaya.config import model_config_from_preset\n"
        "from megatron_zaya.model import ZayaModel\n"
        "from megatron_zaya.parallel.apply import gather_full_state_dict, parallelize_model\n"
        "from megatron_zaya.parallel.launch import init_distributed\n"
        "from megatron_zaya.parallel.state import ParallelState\n"
        "env = init_distributed()\n"
        "assert (env.rank, env.world_size, env.backend, env.launcher) == (0, 1, 'gloo', 'none'), env\n"
        "cfg = model_config_from_preset('zaya1-tiny', num_layers=2, vocab_size=256, seq_length=16)\n"
        "torch.manual_seed(0); ref = ZayaModel(cfg)\n"
        "torch.manual_seed(0); par = parallelize_model(ZayaModel(cfg), ParallelState(1, 1, 1))\n"
        "tokens = torch.randint(0, 256, (2, 16))\n"
        "a, b = ref(tokens, labels=tokens), par(tokens, labels=tokens)\n"
        "assert torch.equal(a.token_losses, b.token_losses)\n"
        "sd = gather_full_state_dict(par, ParallelState(1, 1, 1))\n"
        "assert all(torch.equal(sd[k], v) for k, v in ref.state_dict().items())\n"
        "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                                            "SLURM_PROCID")}
    env.update(OMP_NUM_THREADS="1", MEGATRON_ZAYA_KERNELS="torch")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout + result.stderr
