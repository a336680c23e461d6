"""tools/estimate.py reads training's names for what it plans: --recompute-activations and
--moe-layer-recompute (selective; the latter adding the moe module), --untie-embeddings-and-output-weights
(a separate output layer's weights), a --seq-length past the preset's max_position_embeddings."""
import json

import pytest

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model.recompute import DEFAULT_MODULES

BASE = ["--preset", "zaya1-tiny", "--gpus", "1", "--global-batch-size", "8", "--micro-batch-size", "4", "--json"]


def plan(cli, capsys, *flags):
    code = cli.main(BASE + list(flags))
    out = capsys.readouterr().out
    assert code in (0, 1), out
    return json.loads(out)


def test_training_recompute_names_plan_as_their_selective_equivalents(cli, capsys):
    none = plan(cli, capsys)
    selective = plan(cli, capsys, "--recompute", "selective")
    with_moe = plan(cli, capsys, "--recompute", "selective", "--recompute-modules", *DEFAULT_MODULES, "moe")
    assert with_moe["activations_gb"] < selective["activations_gb"] < none["activations_gb"]
    assert plan(cli, capsys, "--recompute-activations") == selective
    assert plan(cli, capsys, "--moe-layer-recompute") == with_moe
    assert plan(cli, capsys, "--recompute-activations", "--moe-layer-recompute") == with_moe
    for flag in ("--recompute-activations", "--moe-layer-recompute"):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(BASE + [flag, "--recompute", "full"])
        assert exit_info.value.code == 2 and "mean --recompute selective, not full" in capsys.readouterr().err


def test_untied_output_layer_adds_its_weights(cli, capsys):
    config = model_config_from_preset("zaya1-tiny")
    assert not config.untie_embeddings_and_output_weights
    tied = plan(cli, capsys)
    untied = plan(cli, capsys, "--untie-embeddings-and-output-weights")
    output_layer_fp32_gb = config.vocab_size * config.hidden_size * 4 / 1e9       # without ZeRO-1: fp32 weights
    assert untied["weights_gb"] - tied["weights_gb"] == pytest.approx(output_layer_fp32_gb, rel=1e-6)
    tied, untied = (plan(cli, capsys, "--use-distributed-optimizer", *flags)
                    for flags in ((), ("--untie-embeddings-and-output-weights",)))
    assert untied["weights_gb"] - tied["weights_gb"] == pytest.approx(output_layer_fp32_gb / 2, rel=1e-6)   # bf16


def test_seq_length_past_the_presets_positions_is_planned(cli, capsys):
    config = model_config_from_preset("zaya1-tiny")
    longer = 2 * config.max_position_embeddings
    at_max = plan(cli, capsys, "--seq-length", str(config.max_position_embeddings), "--global-batch-size", "4",
                  "--micro-batch-size", "1")
    past = plan(cli, capsys, "--seq-length", str(longer), "--global-batch-size", "4", "--micro-batch-size", "1")
    assert past["activations_gb"] > 1.9 * at_max["activations_gb"]     # twice the tokens per micro batch


def test_a_typed_wrong_preset_is_named_before_the_missing_batch_size(cli, capsys):
    """--preset zaya1-bse without --global-batch-size: the preset is the mistake named (it said only that the
    batch size is required, and the preset's typo came after the user added one)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--preset", "zaya1-bse", "--gpus", "8"])
    assert exit_info.value.code == 2
    assert "--preset=zaya1-bse: choose one of" in capsys.readouterr().err


def test_sequence_parallel_without_tensor_parallelism_is_turned_off_with_trainings_warning(cli, capsys):
    """pretrain_zaya.py turns --sequence-parallel off at TP 1 with a warning (Megatron-LM's rule): the planner
    says the same, and plans the run without it."""
    base = ["--preset", "zaya1-tiny", "--gpus", "8", "--global-batch-size", "8", "--cluster", "h100"]
    cli.main(base + ["--sequence-parallel"])
    captured = capsys.readouterr()
    assert "--sequence-parallel is off: it splits sequences over tensor-parallel ranks" in captured.err
    cli.main(base)
    assert capsys.readouterr().out == captured.out

