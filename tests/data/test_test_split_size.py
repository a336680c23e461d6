"""A --split test share that holds documents but not one sample of --seq-length + 1 tokens has no test
evaluation, as tools/evaluate.py refuses that split (training evaluated one short text repeated)."""
import numpy as np
import pytest

from megatron_zaya.data import DataConfig, IndexedDatasetWriter, build_tokenizer, build_train_valid_test_datasets

EOD = 1000       # NullTokenizer(1000): ids below it, its EOD 1000


def _dataset(tmp_path, tokens_per_document: int, ids=(1, 500)) -> str:
    prefix = str(tmp_path / f"docs{tokens_per_document}_text_document")
    rng = np.random.default_rng(1)
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for _ in range(100):
            writer.add_document(rng.integers(*ids, size=tokens_per_document - 1).tolist() + [EOD])
    return prefix


@pytest.mark.parametrize("tokens_per_document, has_test", [(20, False), (40, True)])
def test_a_test_share_without_one_sample_is_skipped(tmp_path, tokens_per_document, has_test):
    """--split 98,1,1 over 100 documents: the test share is one document. At 20 tokens it cannot hold a sample
    of 33 (seq 32 + 1): no test set; at 40 it can, and the test set is built as before."""
    cfg = DataConfig(data_path=[_dataset(tmp_path, tokens_per_document)], split="98,1,1",
                     data_cache_path=str(tmp_path / "cache"), num_workers=0)
    _, _, test = build_train_valid_test_datasets(cfg, 32, [8, 0, 4], build_tokenizer("NullTokenizer", EOD))
    assert (test is not None) == has_test
    if has_test:
        assert len(test) == 4


@pytest.mark.parametrize("weighted", [True, False])
def test_a_dataset_without_a_test_sample_has_no_part_in_the_test_blend(tmp_path, weighted):
    """A blend of a dataset of 40-token documents (ids below 500) and one of 20-token documents (ids 500 and up):
    the second's one test document holds no sample of 33 tokens, so every test sample is the first's, weighted
    blend or not (a weighted blend once built the second's part from its one document, repeated)."""
    long, short = _dataset(tmp_path, 40), _dataset(tmp_path, 20, ids=(500, 1000))
    data_path = ["0.5", long, "0.5", short] if weighted else [long, short]
    cfg = DataConfig(data_path=data_path, split="98,1,1", data_cache_path=str(tmp_path / "cache"), num_workers=0)
    _, _, test = build_train_valid_test_datasets(cfg, 32, [8, 0, 8], build_tokenizer("NullTokenizer", EOD))
    tokens = np.concatenate([np.asarray(test[i]["tokens"]) for i in range(len(test))])
    assert len(test) == 8 and tokens[tokens != EOD].max() < 500

