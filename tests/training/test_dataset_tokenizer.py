"""A dataset records the tokenizer that wrote it (PREFIX.tokenizer.json, data/dataset_tokenizer.py): a run,
tools/evaluate.py and tools/merge_datasets.py with another tokenizer stop naming both, even where every token
id fits the other vocabulary (the token-id check sees nothing there)."""
import json
import os
import shutil

import numpy as np
import pytest

from megatron_zaya.data.dataset_tokenizer import record_path, tokenizer_identity
from megatron_zaya.data.indexed import IndexedDataset
from megatron_zaya.data.tokenizer import build_tokenizer
from tests.training.conftest import run_tool
from tests.training.helpers import tiny_run_flags


@pytest.fixture(scope="module")
def other_tokenizer(tiny_corpus, tmp_path_factory):
    """A second SentencePiece model of the same corpus, larger (600 pieces against 500): every id of the
    corpus fits its vocabulary."""
    folder = tmp_path_factory.mktemp("other_tokenizer")
    docs = tiny_corpus[0].rsplit("/", 1)[0] + "/docs.jsonl"
    assert run_tool("train_tokenizer", ["--input", docs, "--vocab-size", "600", "--output-prefix",
                                        str(folder / "sp600"), "--num-threads", "1"]) == 0
    return str(folder / "sp600.model")


def test_the_identity_follows_the_encoding_not_the_file(tiny_corpus, other_tokenizer, tmp_path):
    shutil.copy(tiny_corpus[1], tmp_path / "copy.model")
    same = tokenizer_identity(build_tokenizer("GPTSentencePieceTokenizer", tiny_corpus[1]))
    assert tokenizer_identity(build_tokenizer("GPTSentencePieceTokenizer", str(tmp_path / "copy.model"))) == same
    other = tokenizer_identity(build_tokenizer("GPTSentencePieceTokenizer", other_tokenizer))
    assert other["probe_sha256"] != same["probe_sha256"] and other["vocab_size"] != same["vocab_size"]
    assert tokenizer_identity(build_tokenizer("NullTokenizer", "100")) == {"vocab_size": 101, "eod": 100,
                                                                             "probe_sha256": None}


def test_preprocessing_records_the_tokenizer(tiny_corpus):
    prefix, model = tiny_corpus
    record = json.loads(open(record_path(prefix)).read())
    assert record["tokenizer_flags"] == {"--tokenizer-type": "GPTSentencePieceTokenizer", "--tokenizer-model": model}
    assert {k: record[k] for k in ("vocab_size", "eod", "probe_sha256")} == tokenizer_identity(
        build_tokenizer("GPTSentencePieceTokenizer", model))


def test_a_run_with_another_tokenizer_stops_before_the_model(tiny_corpus, other_tokenizer, tmp_path, capsys):
    from pretrain_zaya import main
    prefix = tiny_corpus[0]
    assert int(IndexedDataset(prefix).get(0).max()) < 600        # the token-id check would pass
    save = tmp_path / "ckpt"
    assert main(tiny_run_flags((prefix, other_tokenizer), tmp_path, **{"--save": save})) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert (f"--data-path {prefix} was preprocessed with --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model "
            f"{tiny_corpus[1]} ({prefix}.tokenizer.json), not this run's --tokenizer-type GPTSentencePieceTokenizer "
            f"--tokenizer-model {other_tokenizer}: the dataset's vocabulary size is 500, this run's 600; a test text "
            f"encodes to other ids") in line, line
    assert not save.exists()


def test_merging_keeps_one_tokenizers_record_and_refuses_two(tiny_corpus, other_tokenizer, tmp_path, capsys):
    docs = tiny_corpus[0].rsplit("/", 1)[0] + "/docs.jsonl"
    for name, model in (("a", tiny_corpus[1]), ("b", tiny_corpus[1]), ("other", other_tokenizer)):
        assert run_tool("preprocess_data", ["--input", docs, "--output-prefix", str(tmp_path / name), "--tokenizer-type",
                                            "GPTSentencePieceTokenizer", "--tokenizer-model", model, "--append-eod",
                                            "--no-progress"]) == 0
    a, b, other = (str(tmp_path / f"{name}_text_document") for name in ("a", "b", "other"))
    assert run_tool("merge_datasets", ["--input", a, b, "--output-prefix", str(tmp_path / "ab")]) == 0
    assert open(record_path(str(tmp_path / "ab"))).read() == open(record_path(a)).read()

    assert run_tool("merge_datasets", ["--input", a, other, "--output-prefix", str(tmp_path / "mixed")]) == 2
    err = capsys.readouterr().err
    assert (f"--input {other} and {a} were preprocessed with different tokenizers" in err
            and f"{other}'s vocabulary size is 600, {a}'s 500" in err), err
    assert not any(name.startswith("mixed") for name in os.listdir(tmp_path))

    os.remove(record_path(b))         # preprocessed elsewhere: no record, so none for the output either
    assert run_tool("merge_datasets", ["--input", a, b, "--output-prefix", str(tmp_path / "ab2")]) == 0
    assert not os.path.exists(record_path(str(tmp_path / "ab2")))
    assert "1 of the 2 inputs have no .tokenizer.json" in capsys.readouterr().err


def test_evaluate_checks_before_loading_the_checkpoint(tiny_corpus, other_tokenizer, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        run_tool("evaluate", ["--load", str(tmp_path / "not_read"), "--data-path", tiny_corpus[0], "--tokenizer-type",
                              "GPTSentencePieceTokenizer", "--tokenizer-model", other_tokenizer])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and f"--data-path {tiny_corpus[0]} was preprocessed with" in line, line


def test_inspect_dataset_reports_counts_ids_and_text_with_the_recorded_tokenizer(tiny_corpus, other_tokenizer, tmp_path,
                                                                                capsys):
    prefix, model = tiny_corpus
    data, ours = IndexedDataset(prefix), build_tokenizer("GPTSentencePieceTokenizer", model)
    assert run_tool("inspect_dataset", [prefix, "--json", "--documents", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    tokens = np.concatenate([data.document(d) for d in range(data.num_documents)])
    assert (report["documents"], report["tokens"], report["decoded_by"]) == (
        data.num_documents, tokens.size, "the dataset's tokenizer record")
    assert report["document_tokens"]["max"] == max(data.document(d).size for d in range(data.num_documents))
    assert (report["ids"]["min_id"], report["ids"]["max_id"]) == (tokens.min(), tokens.max())
    assert report["eod_endings"]["ending_with_eod"] == data.num_documents          # --append-eod
    assert report["documents_shown"][0]["text"] == ours.decode(data.document(0).tolist())[:600]
    assert run_tool("inspect_dataset", [prefix, "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model",
                                        other_tokenizer]) == 0
    out = capsys.readouterr().out
    assert "decoded by:  the tokenizer flags" in out and f"written by:  --tokenizer-type GPTSentencePieceTokenizer " \
                                                         f"--tokenizer-model {model}" in out
    # ids beyond the tokenizer (the wrong tokenizer: what the tool is for): said, and the text shown around them
    from megatron_zaya.data.indexed import write_dataset
    write_dataset(str(tmp_path / "big"), [[5, 600000, 6]])
    assert run_tool("inspect_dataset", [str(tmp_path / "big"), "--tokenizer-type", "GPTSentencePieceTokenizer",
                                        "--tokenizer-model", model, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ids"]["max_id"] == 600000 and "<id 600000>" in report["documents_shown"][0]["text"]
    shutil.copy(prefix + ".idx", tmp_path / "cut.idx")
    (tmp_path / "cut.bin").write_bytes(open(prefix + ".bin", "rb").read()[:-2])
    assert run_tool("inspect_dataset", [str(tmp_path / "cut")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"inspect_dataset.py: error: {tmp_path / 'cut.bin'}: size") and err.count("\n") == 1, err


def test_every_recorded_dataset_is_checked_and_the_eod_id_counts(tiny_corpus, tmp_path):
    """check_dataset_tokenizers over a blend: a dataset without a record (Megatron-LM's preprocessing) before
    one whose record names another tokenizer does not end the check; a record that differs from this run's
    tokenizer only in its EOD id (same vocabulary and probe digest: e.g. another eos_token declared beside
    the same tokenizer.json) is another tokenizer, since --reset-* / --eod-mask-loss act at EOD."""
    from megatron_zaya.data.dataset_tokenizer import check_dataset_tokenizers
    from megatron_zaya.errors import UserInputError
    prefix, model = tiny_corpus
    tokenizer = build_tokenizer("GPTSentencePieceTokenizer", model)
    record = json.loads(open(record_path(prefix)).read())
    paths = {}
    for name, eod in (("unrecorded", None), ("same", record["eod"]), ("other_eod", record["eod"] + 1)):
        paths[name] = str(tmp_path / name)
        for ext in (".bin", ".idx"):
            shutil.copy(prefix + ext, paths[name] + ext)
        if eod is not None:
            open(record_path(paths[name]), "w").write(json.dumps({**record, "eod": eod}))
    check_dataset_tokenizers([paths["unrecorded"], paths["same"]], tokenizer, "ours")
    for order in ([paths["other_eod"]], [paths["unrecorded"], paths["same"], paths["other_eod"]]):
        with pytest.raises(UserInputError, match=f"{paths['other_eod']} was preprocessed with .*EOD id is "
                                                 f"{record['eod'] + 1}, this run's {record['eod']}"):
            check_dataset_tokenizers(order, tokenizer, "ours")
