"""Megatron's GPT-2 and tiktoken tokenizer flags from the command line to a training run:
--tokenizer-type GPT2BPETokenizer --vocab-file --merge-file, and --tokenizer-type TikTokenizer
--tiktoken-pattern --vocab-size (tokenizer math: tests/data/test_gpt2_tokenizer.py and
tests/data/test_tiktoken_tokenizer.py)."""
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
    assert "iteration        3/       3" in capsys.readouterr().out


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


@pytest.fixture(scope="module")
def tiktoken_corpus(tiny_corpus, tmp_path_factory):
    """(data prefix, vocabulary file, ranks): the training test corpus tokenized with a TikTokenizer
    vocabulary trained on it by tools/train_tokenizer.py."""
    pytest.importorskip("tiktoken")
    folder = tmp_path_factory.mktemp("tiktoken_corpus")
    docs = tiny_corpus[0].rsplit("/", 1)[0] + "/docs.jsonl"
    assert run_tool("train_tokenizer", ["--input", docs, "--vocab-size", "600", "--output-prefix", str(folder / "tt"),
                                        "--model-type", "tiktoken"]) == 0
    ranks = len(json.loads((folder / "tt.json").read_text()))
    assert run_tool("preprocess_data", ["--input", docs, "--output-prefix", str(folder / "corpus"), "--tokenizer-type",
                                        "TikTokenizer", "--tokenizer-model", str(folder / "tt.json"),
                                        "--tiktoken-pattern", "v2", "--vocab-size", str(ranks + 100),
                                        "--tiktoken-num-special-tokens", "100", "--append-eod", "--no-progress"]) == 0
    return str(folder / "corpus_text_document"), str(folder / "tt.json"), ranks


def tiktoken_flags(tiktoken_corpus, tmp_path, **extra):
    prefix, vocab, ranks = tiktoken_corpus
    return tiny_run_flags((prefix, vocab), tmp_path, **{"--tokenizer-type": "TikTokenizer", "--tiktoken-pattern": "v2",
                                                        "--vocab-size": ranks + 100,
                                                        "--tiktoken-num-special-tokens": 100, **extra})


def test_a_run_trains_on_tiktoken_data_and_exports_its_tokenizer(tiny_corpus, tiktoken_corpus, tmp_path, capsys):
    """As in Megatron-LM, --vocab-size is the TikTokenizer's size (special tokens and ranks); the
    model's vocabulary is that size padded to --make-vocab-size-divisible-by. The checkpoint then goes
    to a Hugging Face folder with the same tokenizer flags: transformers' AutoTokenizer of that folder
    gives the ids the run trained on."""
    transformers = pytest.importorskip("transformers")
    prefix, vocab, ranks = tiktoken_corpus
    save = tmp_path / "ckpt"
    run = parse_args(tiktoken_flags(tiktoken_corpus, tmp_path, **{"--train-iters": 3, "--eval-iters": 0,
                                                                  "--save": save}))
    assert run.data.tokenizer_vocab_size == ranks + 100 and run.args.vocab_size is None
    assert build_and_train(run) == 0
    assert run.model.vocab_size == -(-(ranks + 100) // 128) * 128
    document = IndexedDataset(prefix).document(0)
    assert document[-1] == 2      # EOD = </s>, id 2
    assert "iteration        3/       3" in capsys.readouterr().out
    tokenizer_flags = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", vocab, "--tiktoken-pattern", "v2",
                       "--vocab-size", str(ranks + 100), "--tiktoken-num-special-tokens", "100"]
    assert run_tool("convert_checkpoint", ["to-hf", str(save), str(tmp_path / "hf"), *tokenizer_flags]) == 0
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    first = json.loads(open(tiny_corpus[0].rsplit("/", 1)[0] + "/docs.jsonl").readline())["text"]
    assert theirs.encode(first, add_special_tokens=False) + [theirs.eos_token_id] == document.tolist()
    # another tokenizer, larger than the embedding: refused from the metadata, before any weight is read
    bigger = tokenizer_flags[:-4] + ["--vocab-size", str(ranks + 1100), "--tiktoken-num-special-tokens", "1100"]
    assert run_tool("convert_checkpoint", ["to-hf", str(save), str(tmp_path / "hf2"), *bigger]) == 1
    assert f"tokenizer's {ranks + 1100} tokens do not fit the checkpoint's" in capsys.readouterr().err
    assert not (tmp_path / "hf2").exists()


@pytest.mark.parametrize("extra, expected", [
    ({"--tiktoken-pattern": None}, "--tokenizer-type TikTokenizer needs --tiktoken-pattern v1 or v2"),
    ({"--tokenizer-special-tokens": ["<s>", "</s>"]}, "--tokenizer-special-tokens must include <unk> <s> </s>"),
    # Megatron-LM's older name for the same flag
    ({"--tiktoken-special-tokens": ["<s>", "</s>"]}, "--tokenizer-special-tokens must include <unk> <s> </s>"),
    ({"--tokenizer-type": "GPTSentencePieceTokenizer", "--vocab-size": None},
     "--tiktoken-pattern is read only by --tokenizer-type TikTokenizer"),
])
def test_tiktoken_flag_errors_stop_the_run_naming_the_flag(tiktoken_corpus, tmp_path, capsys, extra, expected):
    with pytest.raises(SystemExit) as exc:
        parse_args(tiktoken_flags(tiktoken_corpus, tmp_path, **extra))
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and expected in line, line


def test_a_vocabulary_file_smaller_than_vocab_size_stops_the_run_before_the_model(tiktoken_corpus, tmp_path, capsys):
    """The file's length is read when the tokenizer is built, the first step of pretrain_zaya.main
    after the flags: one error line naming the file and the sizes, exit status 2, nothing written."""
    from pretrain_zaya import main
    prefix, vocab, ranks = tiktoken_corpus
    save = tmp_path / "ckpt"
    assert main(tiktoken_flags(tiktoken_corpus, tmp_path, **{"--vocab-size": 5000, "--save": save})) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--tokenizer-model {vocab}: holds {ranks} tokens" in line and "ask for 4900" in line, line
    assert not save.exists()
