"""How often a run reads each dataset of its training blend, said at start (Megatron-LM prints each
dataset's epochs as it builds its indices).

A small dataset with a large weight is read many times over, which is easy to miss in a long blend;
`training_passes` gives, for each dataset of the train blend, its train-split tokens, its share and the
passes over them that the run's training tokens make (share x tokens / its tokens).
"""
from __future__ import annotations

from megatron_zaya.data.blend import normalize, parse_data_path
from megatron_zaya.data.config import DataConfig
from megatron_zaya.data.indexed import IndexedDataset
from megatron_zaya.data.loaders import blend_weights, epoch_samples, split_documents

SHOWN = 8       # datasets listed; a longer blend lists its most-read ones


def training_passes(cfg: DataConfig, datasets: dict[str, IndexedDataset], train_tokens: int,
                    seq_length: int) -> list[dict]:
    """[{prefix, weight, tokens, passes}] of the train blend, most passes first (weight: the dataset's share;
    an unweighted list shares by length); [] under data phases (each phase has its own blend and length) or
    --mock-data."""
    if cfg.phases or cfg.mock_data:
        return []
    blend = cfg.split_blends()[0]
    prefixes = list(dict.fromkeys(parse_data_path(blend)[1]))     # a prefix given twice: one share
    rows = []
    weights = blend_weights(blend, prefixes, lambda p: epoch_samples(cfg, datasets[p], p, 0, seq_length))
    if sum(weights) == 0:      # an unweighted list with no sample in the train split: the build names it
        return []
    for prefix, weight in zip(prefixes, normalize(weights)):
        data = datasets[prefix]
        ids = split_documents(cfg, data, prefix, 0)[0]
        tokens = 0 if ids is None else data.tokens_in(ids.start, ids.stop)
        rows.append({"prefix": prefix, "weight": weight, "tokens": tokens,
                     "passes": weight * train_tokens / tokens if tokens else float("inf")})
    return sorted(rows, key=lambda row: -row["passes"])


def passes_lines(rows: list[dict], train_tokens: int) -> list[str]:
    """The start-up lines of training_passes' rows."""
    if not rows:
        return []
    lines = [f"data: {train_tokens:,} training tokens over {len(rows)} dataset{'s' * (len(rows) > 1)}"
             + ("" if len(rows) <= SHOWN else f" (the {SHOWN} read most often:)")]
    for row in rows[:SHOWN]:
        lines.append(f"  {row['passes']:8.3g} passes over {row['tokens']:,} train-split tokens (weight "
                     f"{row['weight']:.3g}) of {row['prefix']}")
    return lines
