"""docs/PLANNER.md's ZAYA1 tables are the planner's numbers: the sensitivity table at 4K (1024 MI300X, micro
batch 1, global batch 4096, ZeRO-1, AdamW) and the 32K variants (global batch 1024), every row recomputed with
the settings its label names and compared as printed (the doc's rounding). A number left stale by a change to
the planner fails here."""
import dataclasses
import re
from pathlib import Path

import pytest

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.planner import CLUSTERS, Efficiency, ParallelLayout
from megatron_zaya.planner.plan import PlanOptions, make_plan

DOC = Path(__file__).resolve().parents[2] / "docs" / "PLANNER.md"
BASE = model_config_from_preset("zaya1-base", max_position_embeddings=131072)
AT_4K = ParallelLayout(1024, 4096, 1, 4096, zero1=True)
AT_32K = ParallelLayout(1024, 32768, 1, 1024, zero1=True)
MOE_MODULES = ("layernorm", "core_attn", "moe_act", "moe")

# label's start -> (layout changes, PlanOptions changes, Efficiency changes)
SENSITIVITY = {
    "defaults": ({}, {}, {}),
    "Muon": ({}, {"optimizer": "muon"}, {}),
    "bf16 gradients": ({}, {"grad_dtype": "bf16"}, {}),
    "hierarchical collectives": ({}, {"hierarchical": True}, {}),
    "no overlap": ({}, {"overlap": False}, {}),
    "network at 50%": ({}, {}, {"inter_node": 0.5}),
    "network at 90%": ({}, {}, {"inter_node": 0.9}),
    "compute at 20%": ({}, {}, {"compute": 0.2}),
    "compute at 50%": ({}, {}, {"compute": 0.5}),
    "ZeRO-1 off": ({"zero1": False}, {}, {}),
}
VARIANTS_32K = {
    "CP=1": {},
    "CP=2": {"context_parallel": 2},
    "CP=1, selective recompute": {"recompute": "selective"},
    "CP=1, full recompute": {"recompute": "full"},
    "CP=1, `--recompute selective --recompute-modules layernorm core_attn moe_act moe`":
        {"recompute": "selective", "recompute_modules": MOE_MODULES},
}


def table(header: str) -> dict[str, list[str]]:
    """The rows of the docs table whose header's first cell starts with `header`: {first cell: the other cells}."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith(f"| {header} ") and lines[i + 1].startswith("|---"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def plan(layout: ParallelLayout, layout_changes=None, options=None, efficiency=None):
    return make_plan(BASE, dataclasses.replace(layout, **(layout_changes or {})), CLUSTERS["mi300x"],
                     Efficiency(**(efficiency or {})), PlanOptions(**(options or {})))


def test_every_table_row_is_named_here():
    sensitivity, variants = table("variant"), table("32K variant")
    assert [next(k for k in SENSITIVITY if row.startswith(k)) for row in sensitivity] == list(SENSITIVITY)
    assert list(variants) == list(VARIANTS_32K)


@pytest.mark.parametrize("label", list(SENSITIVITY))
def test_sensitivity_row_is_the_planners(label):
    row = next(cells for name, cells in table("variant").items() if name.startswith(label))
    p = plan(AT_4K, *SENSITIVITY[label])
    t = p.time
    printed = [f"{p.memory_total / 1e9:.1f}", "yes" if p.fits else "no", f"{t.compute:.2f}",
               f"{t.dp_comm:.2f} / {t.dp_comm_exposed:.2f}", f"{t.total:.2f}", f"{p.tokens_per_second / 1e6:.2f}M",
               f"{p.mfu:.1%}"]
    assert row == printed, label


@pytest.mark.parametrize("label", list(VARIANTS_32K))
def test_32k_variant_row_is_the_planners(label):
    gb, fits, step = table("32K variant")[label]
    p = plan(AT_32K, VARIANTS_32K[label])
    assert (gb, fits, re.match(r"[\d.]+", step).group()) == \
        (f"{p.memory_total / 1e9:.1f}", "yes" if p.fits else "no", f"{p.time.total:.2f}"), label
