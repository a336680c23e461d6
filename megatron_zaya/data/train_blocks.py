"""How a data phase's train dataset is sized across the jobs of a run, so that a resumed job reads exactly the
samples the job before it would have read next.

Each job builds the phase's train split for the samples it needs: those read so far in the phase and those of
its remaining iterations. A GPTDataset's index depends on that number through its epoch count (and whether its
final epoch is shuffled apart: `gpt_dataset.index_shape`). A later job that needs more samples (a longer
--train-iters, a larger --global-batch-size) and rebuilt the split at its own size would, for a dataset read
more than once, shuffle every epoch anew: samples of the current epoch already trained on would come again and
others never.

So the train state keeps the phase's sizes (`TrainState.data_blocks`): the first job's, grown in place while
every dataset's index keeps its shape (the index a run planned that long from the start would have built), else
one more block after the samples already planned, shuffled with the next seed. A job that needs fewer samples
keeps the sizes. Mock data (each sample drawn from its own index) and a recipe's phases (--data-path per phase,
sized by their own train_samples) grow in place as before.
"""
from __future__ import annotations


from .blend import no_blending_index, plan_phases
from .config import DataConfig
from .gpt_dataset import index_shape, kept_request
from .loaders import blend_weights, dataset_prefixes, epoch_samples, split_documents, weighted


def train_blocks(cfg: DataConfig, seq_length: int, blocks: list[int], needed: int, datasets: dict,
                 starts: list[dict] | None = None, kept: list[dict] | None = None) -> list[int]:
    """The block sizes of the phase's train dataset for a job that needs `needed` samples of it in all, given the
    sizes the jobs before it used (`blocks`; empty: none recorded). `datasets`: the opened datasets
    (loaders.open_datasets); `starts`, `kept`: per block, where each dataset starts and the size its index was
    built for in the run's earlier data phases (loaders.build_train_valid_test_loaders)."""
    if not blocks or sum(blocks) == 0:     # (a job with nothing to train saved [0]: nothing planned yet)
        return [needed]
    total = sum(blocks)
    if needed <= total:
        return list(blocks)
    grown = blocks[-1] + needed - total
    last = len(blocks) - 1
    start = starts[last] if starts and last < len(starts) else None
    keep = kept[last] if kept and last < len(kept) else None
    if cfg.mock_data or cfg.phases or \
            index_shapes(cfg, seq_length, blocks[-1], datasets, start, keep) == \
            index_shapes(cfg, seq_length, grown, datasets, start, keep):
        return list(blocks[:-1]) + [grown]
    return list(blocks) + [needed - total]


def train_requests(cfg: DataConfig, seq_length: int, size: int, datasets: dict, start: dict | None = None,
                   keep: dict | None = None) -> dict[str, int]:
    """The samples each dataset of the train blend has its index built for when the split is sized for `size`
    samples (the requests loaders._build_split makes: after `start`, with `keep`, gpt_dataset.kept_request)."""
    return {prefix: request for prefix, _, request in _requests(cfg, seq_length, size, datasets, start, keep)}


def index_shapes(cfg: DataConfig, seq_length: int, size: int, datasets: dict, start: dict | None = None,
                 keep: dict | None = None) -> list:
    """The index shape (epochs, separate final epoch) of each dataset of the train blend when the split is sized
    for `size` samples (train_requests)."""
    return [index_shape(datasets[prefix], ids, request, seq_length) if request else None
            for prefix, ids, request in _requests(cfg, seq_length, size, datasets, start, keep)]


def _requests(cfg: DataConfig, seq_length: int, size: int, datasets: dict, start: dict | None, keep: dict | None):
    """(prefix, its train split's sequence ids, the samples its index is built for) of each dataset the train
    blend asks samples of (train_requests)."""
    blend = cfg.split_blends()[0]
    prefixes = dataset_prefixes(cfg)
    lengths = lambda p: epoch_samples(cfg, datasets[p], p, 0, seq_length)      # noqa: E731
    weights = blend_weights(blend, prefixes, lengths)
    if sum(weights) == 0:       # an unweighted list with no sample in the train split: the build names it
        return []
    plan = plan_phases([weights], [size], cfg.mid_level_dataset_surplus, no_blending_index, [weighted(cfg, blend)],
                       start=[(start or {}).get(p, 0) for p in prefixes])
    found = []
    for d, prefix in enumerate(prefixes):
        if plan.requests[d]:
            ids, _ = split_documents(cfg, datasets[prefix], prefix, 0)
            empty = ids is None or len(ids) == 0
            found.append((prefix, ids, 0 if empty else kept_request(datasets[prefix], ids, plan.requests[d],
                                                                    (keep or {}).get(prefix), seq_length)))
    return found
