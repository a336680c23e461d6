"""Megatron's GPT-2 tokenizer flags from the command line to a training run: --tokenizer-type
GPT2BPETokenizer --vocab-file --merge-file (tokenizer math: tests/data/test_gpt2_tokenizer.py)."""
import json

import pytest

from megatron_zaya.arguments import parse_args
from megatron_zaya.data.indexed import IndexedDataset
from megatron_zaya.training.setup import build_and_train
from tests.data.data_test_utils import write_gpt2_bpe_files
from tests.training.conftest import run_tool
from tests.training.helpers import tiny_run_flags


@pytest.fixture(scope="module")
def gpt2_corpus(tiny_corpus, tmp_path_factory):
    """(data prefix, vocab.json, merges.txt): the training test corpus tokenized with a 700-token GPT-2 BPE."""
    folder = tmp_path_factory.mktemp("gpt2_corpus")
    docs = tiny_corpus[0].rsplit("/", 1)[0] + "/docs.jsonl"
    vocab, merges = write_gpt2_bpe_files([json.loads(line)["text"] for line in open(docs)], folder, 700)
    assert run_tool("preprocess_data", ["--input", docs, "--output-prefix", str(folder / "corpus"), "--tokenizer-type",
                                        "GPT2BPETokenizer", "--vocab-file", str(vocab), "--merge-file", str(merges),
                                        "--append-eod", "--no-progress"]) == 0
    return str(folder / "corpus_text_document"), str(vocab), str(merges)


def gpt2_flags(gpt2_corpus, tmp_path, **extra):
    prefix, vocab, merges = gpt2_corpus
    return tiny_run_flags((prefix, None), tmp_path, **{"--tokenizer-model": None, "--tokenizer-type": "GPT2BPETokenizer",
                                                       "--vocab-file": vocab, "--merge-file": merges, **extra})


def test_a_run_trains_on_gpt2_bpe_data(gpt2_corpus, tmp_path, capsys):
    run = parse_args(gpt2_flags(gpt2_corpus, tmp_path, **{"--train-iters": 3, "--eval-iters": 0}))
    assert (run.data.vocab_file, run.data.merge_file) == gpt2_corpus[1:]
    assert build_and_train(run) == 0
    assert run.model.vocab_size == 768                      # 700 tokens padded to a multiple of 128
    assert IndexedDataset(gpt2_corpus[0]).document(0)[-1] == 0   # EOD = <|endoftext|>, id 0 here
    assert "iteration       3/3" in capsys.readouterr().out


@pytest.mark.parametrize("extra, expected", [
    ({"--merge-file": None}, "--tokenizer-type GPT2BPETokenizer needs --merge-file"),
    ({"--vocab-file": "/nonexistent/vocab.json"}, "--vocab-file /nonexistent/vocab.json: file not found"),
    ({"--tokenizer-type": "GPTSentencePieceTokenizer"}, "--vocab-file is read only by --tokenizer-type GPT2BPETokenizer"),
])
def test_gpt2_flag_errors_stop_the_run_naming_the_flag(gpt2_corpus, tmp_path, capsys, extra, expected):
    with pytest.raises(SystemExit) as exc:
        parse_args(gpt2_flags(gpt2_corpus, tmp_path, **extra))
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and expected in line, line
