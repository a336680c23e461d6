"""A run without a GPU whose model cannot fit this machine's memory stops with the flags, before anything is
built (a GPU config started on a CPU machine allocated its 8B-parameter model until the OOM killer came)."""
import pytest
import torch

from megatron_zaya.arguments import parse_args
from megatron_zaya.config import model_config_from_preset
from megatron_zaya.errors import UserInputError
from megatron_zaya.model.accounting import count_parameters
from megatron_zaya.training import host_memory

GIB = 2 ** 30


@pytest.mark.parametrize("preset", ["zaya1-tiny", "zaya1-100m", "zaya1-base"])
def test_the_bound_is_below_the_models_own_count(preset):
    """The config-only count (attention projections and experts) never exceeds the model's parameters outside
    the embedding, so no run that fits is refused; for ZAYA1-base it is within 1% of them."""
    config = model_config_from_preset(preset)
    counts = count_parameters(config)
    bound = host_memory.parameters_per_rank(config, 1, 1)
    assert bound <= counts.total - counts.embedding
    if preset == "zaya1-base":
        assert bound > 0.99 * (counts.total - counts.embedding)
    assert host_memory.parameters_per_rank(config, 2, 2) <= bound // 2


def test_a_model_too_large_for_the_machine_names_the_flag_and_the_sizes():
    config = model_config_from_preset("zaya1-base")
    with pytest.raises(UserInputError, match=r"^--preset zaya1-base: torch sees no GPU, and 8 rank\(s\) of 8\.26B "
                                             r"parameters each .* need at least 492 GiB .* this machine's 24 GiB"):
        host_memory.check_host_memory(config, 1, 1, 8, "--preset zaya1-base", limit=24 * GIB)
    host_memory.check_host_memory(config, 1, 1, 1, "--preset zaya1-base", limit=80 * GIB)       # fits: no error
    host_memory.check_host_memory(model_config_from_preset("zaya1-tiny"), 1, 1, 8, "--preset zaya1-tiny",
                                  limit=1 * GIB)
    # --bf16 under ZeRO-1: bf16 weights (their fp32 masters sharded), 6 bytes a parameter: 8.26B fits 48 GiB
    host_memory.check_host_memory(config, 1, 1, 1, "--preset zaya1-base", bf16_weights=True, limit=48 * GIB)
    with pytest.raises(UserInputError, match="need at least 62 GiB"):
        host_memory.check_host_memory(config, 1, 1, 1, "--preset zaya1-base", limit=48 * GIB)


def test_ranks_on_this_machine_from_the_launchers():
    assert host_memory.ranks_on_this_machine({"LOCAL_WORLD_SIZE": "8"}) == 8
    assert host_memory.ranks_on_this_machine({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}) == 4
    assert host_memory.ranks_on_this_machine({"LOCAL_WORLD_SIZE": ""}) == 1


def test_pretrain_refuses_a_gpu_config_on_a_cpu_machine_but_a_dry_run_checks_it(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(host_memory, "physical_memory_bytes", lambda: 24 * GIB)
    argv = ["--config", "examples/single_node_8gpu.yaml", "--mock-data", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", "512"]
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert "--config examples/single_node_8gpu.yaml: torch sees no GPU" in capsys.readouterr().err
    parse_args(argv + ["--dry-run"])          # a login node checks a GPU job's flags
