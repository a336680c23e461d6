"""The changes tools/estimate.py prints for a layout that does not fit run as printed: each one's flags, added
to the run's command line (and its --config file changed as the text says), are accepted and the layout fits.
Full recomputation, which training refuses beside selective settings (--recompute-activations,
--moe-layer-recompute, --recompute-modules), names the settings to take away where the run gave them."""
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

ZAYA1_36K = ["--preset", "zaya1-base", "--gpus", "1024", "--cluster", "mi300x", "--global-batch-size", "1024",
             "--use-distributed-optimizer", "--optimizer", "adamw"]
SEQ_36K = ["--seq-length", "36864"]


def run(cli, capsys, argv):
    """(exit status, the JSON plan) of estimate.py `argv`."""
    code = cli.main(argv + ["--json"])
    out = capsys.readouterr().out
    assert code in (0, 1), out
    return code, json.loads(out)


def without_flag(argv: list[str], flag: str) -> list[str]:
    """`argv` with `flag` and the values after it left out."""
    out, skipping = [], False
    for word in argv:
        if word.startswith("--"):
            skipping = word == flag
        if not skipping:
            out.append(word)
    return out


def apply_fix(description: str, argv: list[str], config: Path | None, tmp_path: Path) -> list[str]:
    """The run's command line with the printed change made literally: the flags in its parentheses added, the
    flags after "without" left out, a key "taken out of" the --config file removed (from a copy of it)."""
    inside = re.search(r"\((--[^;)]*)", description).group(1)
    first, *rest = inside.split(", ")
    argv = list(argv)
    for part in rest:
        taken_out = re.fullmatch(r"with the (\S+) key taken out of (\S+)", part)
        if part.startswith("without "):
            for flag in part[len("without "):].split(" or "):
                assert flag in argv, (flag, description)
                argv = without_flag(argv, flag)
        elif taken_out:
            assert config is not None and taken_out.group(2) == str(config), description
            keys = yaml.safe_load(config.read_text())
            del keys[taken_out.group(1)]
            changed = tmp_path / f"changed_{len(list(tmp_path.iterdir()))}.yaml"
            changed.write_text(yaml.safe_dump(keys))
            argv[argv.index("--config") + 1] = str(changed)
        else:
            pytest.fail(f"unreadable part {part!r} of {description!r}")
    return argv + shlex.split(first)


CASES = {
    "recompute-activations": (ZAYA1_36K + SEQ_36K + ["--recompute-activations"], None),
    "recompute-modules": (ZAYA1_36K + SEQ_36K + ["--recompute-granularity", "selective", "--recompute-modules",
                                                 "core_attn", "moe_act"], None),
    "moe-layer-recompute": (ZAYA1_36K + ["--seq-length", "49152", "--moe-layer-recompute"], None),
    "config recompute-modules": (ZAYA1_36K + SEQ_36K,
                                 {"recompute-granularity": "selective", "recompute-modules": ["core_attn"]}),
    "config recompute-activations": (ZAYA1_36K + SEQ_36K, {"recompute-activations": True, "bf16": True}),
    "config and command line": (ZAYA1_36K + SEQ_36K + ["--recompute-modules", "core_attn", "moe_act"],
                                {"recompute-granularity": "selective", "recompute-modules": ["core_attn"]}),
    "config switch and flag": (ZAYA1_36K + SEQ_36K + ["--recompute-activations"], {"recompute-activations": True}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_printed_change_runs_as_printed_and_fits(cli, capsys, tmp_path, case):
    argv, keys = CASES[case]
    config = None
    if keys is not None:
        config = tmp_path / "run.yaml"
        config.write_text(yaml.safe_dump(keys))
        argv = argv + ["--config", str(config)]
    code, plan = run(cli, capsys, argv)
    assert code == 1 and any(d.startswith("recompute full") for d in plan["fixes"]), plan["fixes"]
    for description in plan["fixes"]:
        code, fixed = run(cli, capsys, apply_fix(description, argv, config, tmp_path))
        assert code == 0 and fixed["fits"], description


def test_zero1_with_another_change_names_both_flags(cli, capsys, tmp_path):
    """No single change fits ZAYA1-base on 64 GPUs of 20 GiB: ZeRO-1 with TP is offered, with both its flags."""
    argv = ["--preset", "zaya1-base", "--gpus", "64", "--gpu-memory-gb", "20", "--global-batch-size", "64",
            "--recompute-activations", "--optimizer", "adamw"]
    code, plan = run(cli, capsys, argv)
    assert code == 1 and plan["fixes"] and plan["fixes"][0].startswith("enable ZeRO-1 and"), plan["fixes"]
    for description in plan["fixes"]:
        assert "(--use-distributed-optimizer " in description
        assert run(cli, capsys, apply_fix(description, argv, None, tmp_path))[0] == 0, description


def test_context_parallelism_over_every_gpu_is_offered(cli, capsys, tmp_path):
    """ZAYA1-base at 32K on 2 MI300X does not fit; CP over both GPUs (CP = the GPU count) does, and is the first
    change offered (it runs as printed)."""
    argv = ["--preset", "zaya1-base", "--gpus", "2", "--cluster", "mi300x", "--seq-length", "32768",
            "--global-batch-size", "16", "--use-distributed-optimizer"]
    code, plan = run(cli, capsys, argv)
    assert code == 1 and plan["fixes"][0] == "raise CP to 2 (--context-parallel-size 2)", plan["fixes"]
    code, fixed = run(cli, capsys, apply_fix(plan["fixes"][0], argv, None, tmp_path))
    assert code == 0 and fixed["fits"]
