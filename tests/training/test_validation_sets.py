"""--multiple-validation-sets and --full-validation (Megatron-LM's flags): one loss per validation
dataset, each over every sample of its documents once, equal to tools/evaluate.py's one pass over
the saved model (an independent evaluation path), in one process and under expert parallelism
across two processes (where a set's last micro-batch group is padded with masked samples)."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from megatron_zaya.arguments import parse_args
from megatron_zaya.data.validation import PaddedToGroups, validation_set_names
from megatron_zaya.data.sampler import PretrainingBatchSampler
from megatron_zaya.errors import UserInputError
from megatron_zaya.training.setup import build_and_train
from tests.parallel.parallel_launcher import free_port
from tests.training.conftest import ROOT, run_tool
from tests.training.helpers import tiny_run_flags
from tests.training.test_training_run import scalars


def subset(tiny_corpus, folder, name, first, last) -> str:
    """A dataset of the tiny corpus's documents [first, last), tokenized the same way."""
    prefix, tokenizer = tiny_corpus
    with open(os.path.join(os.path.dirname(prefix), "docs.jsonl"), encoding="utf-8") as f:
        (folder / f"{name}.jsonl").write_text("".join(f.readlines()[first:last]), encoding="utf-8")
    assert run_tool("preprocess_data", ["--input", str(folder / f"{name}.jsonl"), "--output-prefix", str(folder / name),
                                        "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", tokenizer,
                                        "--append-eod", "--workers", "1"]) == 0
    return str(folder / f"{name}_text_document")


@pytest.fixture(scope="module")
def valid_sets(tiny_corpus, tmp_path_factory):
    """Two validation datasets of different sizes: 15 and 30 documents."""
    folder = tmp_path_factory.mktemp("valid_sets")
    return subset(tiny_corpus, folder, "small", 0, 15), subset(tiny_corpus, folder, "other", 15, 45)


def tool_loss(save, prefix, tokenizer, tmp_path, micro_batches=None) -> dict:
    """tools/evaluate.py over `prefix`'s first `micro_batches` micro-batches of 4 samples (None:
    every sample once)."""
    report = tmp_path / f"{os.path.basename(prefix)}.json"
    limit = [] if micro_batches is None else ["--eval-iters", str(micro_batches)]
    assert run_tool("evaluate", ["--load", str(save), "--data-path", prefix, "--split", "0,100,0",
                                 "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", tokenizer,
                                 "--micro-batch-size", "4", "--data-cache-path", str(tmp_path / "evalcache"),
                                 "--output-json", str(report), "--log-interval", "0", *limit]) == 0
    return json.loads(report.read_text())


def validation_flags(tiny_corpus, valid_sets, tmp_path, **extra) -> list[str]:
    return tiny_run_flags(tiny_corpus, tmp_path, **{
        "--data-path": None, "--train-data-path": tiny_corpus[0], "--valid-data-path": list(valid_sets),
        "--multiple-validation-sets": "", "--full-validation": "", "--train-iters": 2, "--eval-interval": 2,
        "--tensorboard-dir": tmp_path / "tb", "--save": tmp_path / "ckpt", **extra})


@pytest.mark.parametrize("full", [True, False], ids=["full", "eval-iters"])
def test_each_validation_set_is_evaluated_and_logged_on_its_own(tiny_corpus, valid_sets, tmp_path, capsys, full,
                                                                monkeypatch):
    """Each set's loss is tools/evaluate.py's over the same samples: all of them (--full-validation),
    or the first --eval-iters 2 global batches of 4 (1e-5 relative); the overall 'lm loss validation' is the sets'
    mean and its ppl exp(mean). A long evaluation prints its progress."""
    from megatron_zaya.training.loop import Trainer
    monkeypatch.setattr(Trainer, "EVAL_PROGRESS_SECONDS", 0.0)      # every micro-batch counts as long
    extra = {} if full else {"--full-validation": None, "--eval-iters": 2}
    assert build_and_train(parse_args(validation_flags(tiny_corpus, valid_sets, tmp_path, **extra))) == 0
    out = capsys.readouterr().out
    total = 4 if not full else None
    progress = [line for line in out.splitlines() if "validation set other_text_document: " in line]
    assert progress and progress[0].split("validation set other_text_document: ")[1].startswith("0/")
    if total:
        assert all(f"/{total} micro-batches of this rank" in line for line in progress)
    values = scalars(tmp_path / "tb")
    small, big = (tool_loss(tmp_path / "ckpt", p, tiny_corpus[1], tmp_path, None if full else 2) for p in valid_sets)
    assert (small["samples"] < big["samples"]) if full else (small["samples"] == big["samples"] == 8)
    for name, expected in (("small_text_document", small), ("other_text_document", big)):
        assert [s for s, _ in values[f"lm loss validation {name}"]] == [2]
        assert values[f"lm loss validation {name}"][0][1] == pytest.approx(expected["loss"], rel=1e-5), name
        assert values[f"lm loss validation {name} ppl"][0][1] == pytest.approx(np.exp(expected["loss"]), rel=1e-5)
        assert f"{name} loss " in out
    mean = (small["loss"] + big["loss"]) / 2       # 'lm loss validation': the sets' mean
    assert values["lm loss validation"][0][1] == pytest.approx(mean, rel=1e-5)
    # its perplexity is exp of that mean (not of one set's loss), to the same tolerance
    assert values["lm loss validation ppl"][0][1] == pytest.approx(np.exp(mean), rel=1e-5)
    assert f"final validation loss {mean:.4f}" in out
    if full:      # tools/evaluate.py --per-dataset: the same per-set losses in one call
        report = tmp_path / "per_dataset.json"
        # (the first set also spelled with its .bin suffix: one dataset, evaluated once)
        assert run_tool("evaluate", ["--load", str(tmp_path / "ckpt"), "--data-path", *valid_sets,
                                     valid_sets[0] + ".bin", "--split", "0,100,0",
                                     "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", tiny_corpus[1],
                                     "--data-cache-path", str(tmp_path / "evalcache"), "--per-dataset",
                                     "--output-json", str(report), "--log-interval", "0"]) == 0
        datasets = json.loads(report.read_text())["datasets"]
        assert sorted(datasets) == ["other_text_document", "small_text_document"]
        for name, expected in (("small_text_document", small), ("other_text_document", big)):
            assert datasets[name]["loss"] == pytest.approx(expected["loss"], rel=1e-9)
            assert datasets[name]["samples"] == expected["samples"]
        assert "dataset" in capsys.readouterr().out


def test_expert_parallel_ranks_pad_a_set_to_whole_micro_batch_groups(tiny_corpus, valid_sets, tmp_path):
    """Two processes, --expert-model-parallel-size 2, micro-batch 3: a set whose sample count is not a
    multiple of 6 ends with masked padding, both ranks run the same number of micro-batches (else
    the experts' all-to-all would hang), and each set's loss is still tools/evaluate.py's."""
    argv = validation_flags(tiny_corpus, valid_sets, tmp_path, **{
        "--expert-model-parallel-size": 2, "--micro-batch-size": 3, "--global-batch-size": 6})
    env = dict(os.environ, OMP_NUM_THREADS="1", MEGATRON_ZAYA_KERNELS="torch")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "pretrain_zaya.py", *argv]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    values = scalars(tmp_path / "tb")
    reports = {os.path.basename(p): tool_loss(tmp_path / "ckpt", p, tiny_corpus[1], tmp_path) for p in valid_sets}
    assert any(r["samples"] % 6 for r in reports.values()), {n: r["samples"] for n, r in reports.items()}
    for name, expected in reports.items():
        assert values[f"lm loss validation {name}"][0][1] == pytest.approx(expected["loss"], rel=1e-5), name


def test_padding_gives_every_rank_the_same_micro_batches_and_adds_no_loss():
    class Samples:
        def __len__(self):
            return 7

        def __getitem__(self, i):
            return {"tokens": np.full(4, i), "loss_mask": np.ones(4, np.float32)}

    padded = PaddedToGroups(Samples(), group=3 * 2)          # micro-batch 3 x 2 data-parallel ranks
    assert len(padded) == 12 and padded.real_samples == 7
    per_rank = [list(PretrainingBatchSampler(len(padded), 0, 3, rank, 2)) for rank in range(2)]
    assert [len(batches) for batches in per_rank] == [2, 2]
    read = sorted(i for batches in per_rank for batch in batches for i in batch)
    assert read == list(range(12))
    assert [padded[i]["loss_mask"].sum() for i in range(12)] == [4] * 7 + [0] * 5
    with pytest.raises(IndexError):
        padded[12]


def test_set_names_are_file_names_unless_two_share_one():
    assert validation_set_names(["a/web_text", "b/code_text"]) == ["web_text", "code_text"]
    assert validation_set_names(["a/web_text", "b/web_text", "c/x"]) == ["a/web_text", "b/web_text", "x"]


@pytest.mark.parametrize("extra, message", [
    ({"--valid-data-path": "WEIGHTED"}, "--valid-data-path .* has weights"),
    ({"--eval-iters": 0}, "--full-validation with --eval-iters 0"),
    ({"--valid-data-path": "TINY_DOC"}, r"one_doc \(valid split\): .* too few for one sample of 32\+1 tokens"),
])
def test_validation_flags_are_checked_before_training(tiny_corpus, valid_sets, tmp_path, capsys, extra, message):
    from megatron_zaya.data import IndexedDatasetWriter
    tiny_doc = str(tmp_path / "one_doc")
    with IndexedDatasetWriter(tiny_doc, np.uint16) as writer:
        writer.add_document([5, 6, 7, 1])
    swap = {"WEIGHTED": [1, valid_sets[0], 2, valid_sets[1]], "TINY_DOC": [valid_sets[0], tiny_doc]}
    argv = validation_flags(tiny_corpus, valid_sets, tmp_path, **{k: swap.get(v, v) for k, v in extra.items()})
    try:
        build_and_train(parse_args(argv))
    except SystemExit:      # a flag problem: parse_args's usage error
        error = capsys.readouterr().err
    except UserInputError as err:      # a data problem: found while the datasets are built, before any step
        error = str(err)
    else:
        pytest.fail("no error")
    assert re.search(message, error), error
    assert not (tmp_path / "tb").exists() or not scalars(tmp_path / "tb").get("lm loss")


def test_a_split_blend_gives_one_set_per_dataset_with_its_own_validation_documents(tiny_corpus, valid_sets, tmp_path):
    """--data-path A B --split 8,2,0 --multiple-validation-sets: set A holds exactly the samples a
    run on A alone validates on (the same documents, seed and size), likewise B."""
    from megatron_zaya.data import DataConfig, build_tokenizer
    from megatron_zaya.data.loaders import build_split_datasets
    tokenizer = build_tokenizer("GPTSentencePieceTokenizer", tiny_corpus[1])

    def valid(paths, **kw):
        cfg = DataConfig(data_path=list(paths), split="8,2,0", num_workers=0, data_cache_path=str(tmp_path), **kw)
        return build_split_datasets(cfg, 32, [8, 4, 0], tokenizer).valid

    both = valid(valid_sets, multiple_validation_sets=True)
    assert [s.name for s in both] == ["small_text_document", "other_text_document"]
    for prefix, got in zip(valid_sets, both):
        alone = valid([prefix])[0].dataset
        assert len(got.dataset) == len(alone) == 4
        for i in range(4):
            assert np.array_equal(got.dataset[i]["tokens"], alone[i]["tokens"]), (prefix, i)


def test_one_full_validation_set_of_a_blend_reads_every_sample_of_each_dataset_once(tiny_corpus, valid_sets, tmp_path):
    """--full-validation without --multiple-validation-sets over `--data-path A B`: the one set is A's
    validation samples then B's, each exactly the samples of a one-pass set over that dataset alone
    (the reference), token for token; no dataset is left out or read twice."""
    from megatron_zaya.data import DataConfig, build_tokenizer
    from megatron_zaya.data.loaders import build_split_datasets
    tokenizer = build_tokenizer("GPTSentencePieceTokenizer", tiny_corpus[1])

    def valid(paths):
        cfg = DataConfig(data_path=list(paths), split="8,2,0", num_workers=0, data_cache_path=str(tmp_path),
                         full_validation=True)
        sets = build_split_datasets(cfg, 32, [8, 4, 0], tokenizer).valid
        assert [s.name for s in sets] == [""]
        return sets[0].dataset

    both, alone = valid(valid_sets), [valid([p]) for p in valid_sets]
    expected = [alone[d][i]["tokens"] for d in range(2) for i in range(len(alone[d]))]
    assert min(len(a) for a in alone) > 0 and len(both) == len(expected)
    assert all(np.array_equal(both[i]["tokens"], t) for i, t in enumerate(expected))
