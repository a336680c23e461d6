"""--mock-data: random-token GPT samples without files, the same sample for the same index wherever
and whenever it is read, documents separated by EOD."""
import numpy as np
import pytest

from megatron_zaya.data import DataConfig, build_train_valid_test_datasets, build_train_valid_test_loaders
from megatron_zaya.data.tokenizer import build_tokenizer


def test_mock_samples_are_random_deterministic_and_end_documents_with_eod():
    cfg = DataConfig(mock_data=True, seed=3, num_workers=0, reset_position_ids=True, eod_mask_loss=True)
    tokenizer = build_tokenizer("NullTokenizer", 500)
    train, valid, test = build_train_valid_test_datasets(cfg, 1024, [40, 8, 0], tokenizer)
    assert test is None and len(train) == 40 and len(valid) == 8
    again, _, _ = build_train_valid_test_datasets(cfg, 1024, [40, 8, 0], tokenizer)
    a, b = train[7], again[7]
    assert all(np.array_equal(a[k], b[k]) for k in a)                      # a function of the index
    assert not np.array_equal(train[7]["tokens"], train[8]["tokens"])
    assert not np.array_equal(train[0]["tokens"], valid[0]["tokens"])     # splits differ
    tokens = np.concatenate([train[i]["tokens"] for i in range(40)])
    assert tokens.min() >= 0 and tokens.max() <= tokenizer.eod < tokenizer.vocab_size
    eods = int((tokens == tokenizer.eod).sum())
    assert 0.5 * len(tokens) / 256 < eods < 2 * len(tokens) / 256         # documents of ~256 tokens
    s = train[3]
    assert np.array_equal(s["labels"][:-1], s["tokens"][1:])
    first_eod = int(np.nonzero(s["tokens"] == tokenizer.eod)[0][0])
    assert s["position_ids"][first_eod + 1] == 0 and s["loss_mask"][first_eod] == 0   # the options apply
    with pytest.raises(IndexError):
        train[40]


def test_mock_data_excludes_data_paths_and_loads_through_the_loaders():
    with pytest.raises(ValueError, match="--mock-data and --data-path"):
        DataConfig(mock_data=True, data_path=["corpus"])
    train_loader, valid_sets, _ = build_train_valid_test_loaders(
        DataConfig(mock_data=True, num_workers=0), 8, 2, 16, 0, 2, train_samples=32, valid_samples=8,
        tokenizer=build_tokenizer("NullTokenizer", 100))
    batch = next(iter(train_loader))
    assert batch["tokens"].shape == (2, 16)
    assert [name for name, _ in valid_sets] == [""] and len(valid_sets[0][1]) == 2    # 8 samples, 2 x 2 per rank
    with pytest.raises(ValueError, match="need datasets, not --mock-data"):
        DataConfig(mock_data=True, full_validation=True)


def test_mock_samples_follow_the_seed_only_and_eod_only_ends_documents(monkeypatch):
    """Sample i is a function of (--seed, split, i) only: another process rank (RANK, LOCAL_RANK: a tensor- or
    context-parallel peer must read the same tokens) gives the same sample, another --seed another one. Random
    ids never draw the EOD id: with a 4-id vocabulary (EOD = 3) EODs stay near the 1/256 document rate
    (binomial: 160 expected in 40,960 tokens, sd 13; a drawn EOD would give a quarter of all tokens)."""
    tokenizer = build_tokenizer("NullTokenizer", 500)

    def train(seed):
        cfg = DataConfig(mock_data=True, seed=seed, num_workers=0)
        return build_train_valid_test_datasets(cfg, 1024, [40, 0, 0], tokenizer)[0]

    here = train(3)[5]["tokens"]
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert np.array_equal(train(3)[5]["tokens"], here)
    assert not np.array_equal(train(4)[5]["tokens"], here)
    small = build_tokenizer("NullTokenizer", 3)
    cfg = DataConfig(mock_data=True, seed=3, num_workers=0)
    data = build_train_valid_test_datasets(cfg, 1024, [40, 0, 0], small)[0]
    tokens = np.concatenate([data[i]["tokens"] for i in range(40)])
    assert 100 < int((tokens == small.eod).sum()) < 220


def test_mock_data_builds_no_set_for_a_split_of_no_share():
    """As Megatron-LM's mock data (and real data here): --split 100,0,0 builds no validation or test set, and warns
    when --eval-iters asks for validation; a positive share builds its set."""
    from megatron_zaya.data.split_checks import evaluation_warnings
    tokenizer = build_tokenizer("NullTokenizer", 500)
    cfg = DataConfig(mock_data=True, num_workers=0, split="100,0,0")
    assert build_train_valid_test_datasets(cfg, 64, [40, 8, 8], tokenizer)[1:] == (None, None)
    assert evaluation_warnings(cfg, 2) == ["--eval-iters 2: --split 100,0,0 gives the validation split no share, "
                                           "so no validation runs"]
    cfg = DataConfig(mock_data=True, num_workers=0, split="99,1,0")
    _, valid, test = build_train_valid_test_datasets(cfg, 64, [40, 8, 8], tokenizer)
    assert len(valid) == 8 and test is None and evaluation_warnings(cfg, 2) == []
