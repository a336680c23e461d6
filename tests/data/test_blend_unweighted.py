"""`--data-path A B` without weights: Megatron-LM weighs such a list by its datasets' lengths, one epoch of
each (its datasets are built without a sample count), against a literal reference of Megatron's indices.

    python -m pytest -q tests/data/test_blend_unweighted.py
"""
import numpy as np
import pytest

import data_megatron_reference as ref
from megatron_zaya.data import DataConfig, build_train_valid_test_datasets
from megatron_zaya.data.indexed import write_dataset
from megatron_zaya.data.loaders import open_datasets, unread_dataset_warnings
from megatron_zaya.data.tokenizer import build_tokenizer
from megatron_zaya.data.train_blocks import train_blocks
from megatron_zaya.errors import UserInputError

EOD = 1000
SEQ = 8


def two_corpora(tmp_path):
    """Corpus a (tokens 0..49) is about a quarter of corpus b's size (tokens 500..549)."""
    out = []
    for name, base, n_docs, seed in (("a", 0, 40, 3), ("b", 500, 150, 4)):
        rng = np.random.default_rng(seed)
        seqs = [[base + (i % 50)] * int(rng.integers(2, 20)) + [EOD] for i in range(n_docs)]
        write_dataset(str(tmp_path / name), seqs, dtype=np.uint16)
        out.append((str(tmp_path / name), seqs))
    return out


def build(tmp_path, paths, size):
    cfg = DataConfig(data_path=paths, split="100,0,0", num_workers=0, data_cache_path=str(tmp_path / "cache"))
    return cfg, build_train_valid_test_datasets(cfg, SEQ, [size, 0, 0], build_tokenizer("NullTokenizer", EOD))[0]


def test_a_run_of_one_epoch_of_each_reads_every_sample_once_in_megatrons_order(tmp_path):
    (a, seqs_a), (b, seqs_b) = two_corpora(tmp_path)
    seed = DataConfig(data_path=["x"]).seed
    # Megatron-LM: each dataset one epoch (no sample count: ref's num_samples 0 gives one epoch), the blend's
    # weights their lengths normalized once in float64, and the blend at most as long as both together.
    epochs = [ref.gpt_samples(seqs, list(range(len(seqs))), SEQ, 0, seed) for seqs in (seqs_a, seqs_b)]
    lengths = np.array([len(e) for e in epochs], dtype=np.float64)
    size = int(lengths.sum())
    di, dsi = ref.blending((lengths / lengths.sum()).tolist(), size)
    expected = [epochs[d][i][:-1] for d, i in zip(di, dsi)]
    _, train = build(tmp_path, [a, b], size)
    assert len(train) == size
    got = [train[i]["tokens"].tolist() for i in range(size)]
    assert got == expected
    # (equal shares would read a, the smaller, about twice over in the same number of samples)
    assert sum(min(t) < 500 for t in got) == len(epochs[0])


def test_a_longer_run_keeps_the_shares_by_length(tmp_path):
    (a, seqs_a), (b, seqs_b) = two_corpora(tmp_path)
    one_epoch = [(sum(map(len, seqs)) - 1) // SEQ for seqs in (seqs_a, seqs_b)]
    size = 2 * sum(one_epoch) + 7      # past one epoch of each: read again, in the same proportion
    _, train = build(tmp_path, [a, b], size)
    from_a = sum(min(train[i]["tokens"].tolist()) < 500 for i in range(size))
    assert abs(from_a - size * one_epoch[0] / sum(one_epoch)) <= 1


def test_a_resumed_run_needing_more_grows_in_place_while_each_dataset_stays_within_one_epoch(tmp_path):
    (a, seqs_a), (b, seqs_b) = two_corpora(tmp_path)
    cfg, _ = build(tmp_path, [a, b], 1)
    datasets = open_datasets(cfg)
    total = sum((sum(map(len, seqs)) - 1) // SEQ for seqs in (seqs_a, seqs_b))
    assert train_blocks(cfg, SEQ, [total // 2], total, datasets) == [total]         # one epoch of each still
    assert train_blocks(cfg, SEQ, [total], total + 5, datasets) == [total, 5]       # past it: a block of its own


def test_a_split_where_no_dataset_of_the_list_holds_a_sample_is_named(tmp_path):
    (a, _), (b, _) = two_corpora(tmp_path)
    tokenizer = build_tokenizer("NullTokenizer", EOD)
    cfg = DataConfig(data_path=[a, b], split="50,0,50", num_workers=0, data_cache_path=str(tmp_path / "cache"))
    with pytest.raises(UserInputError, match=rf"--split 50,0,50: no dataset of {a} {b} holds a sample \(10001 tokens\) "
                                             "in the train split"):
        build_train_valid_test_datasets(cfg, 10000, [5, 0, 0], tokenizer)
    # the test split gets no evaluation then, as when its share holds no document
    assert build_train_valid_test_datasets(cfg, 10000, [0, 0, 5], tokenizer)[2] is None


def test_a_dataset_of_the_list_with_no_sample_in_a_split_is_warned_of(tmp_path):
    (a, seqs_a), (b, seqs_b) = two_corpora(tmp_path)
    seq = sum(map(len, seqs_a))       # a holds seq tokens: no sample of seq + 1; b holds more than twice as many
    cfg, _ = build(tmp_path, [a, b], 1)
    datasets = open_datasets(cfg)
    assert unread_dataset_warnings(cfg, seq, datasets) == [
        f"{a}: its train split holds no sample of {seq + 1} tokens, so the blend {a} {b} (no weights: shares by "
        f"length) never reads it"]
    assert unread_dataset_warnings(cfg, SEQ, datasets) == []
    weighted = DataConfig(data_path=["1", a, "1", b], split="100,0,0")
    assert unread_dataset_warnings(weighted, seq, open_datasets(weighted)) == []     # read over several epochs
