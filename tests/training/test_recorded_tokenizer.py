"""The tokenizer a training run records in its checkpoints serves the tools that read them without tokenizer
flags (convert_checkpoint.py to-hf, generate, evaluate) and --use-checkpoint-args, a relative tokenizer path
found from the run's own directory, which wins over another file of that path in the current folder
(checkpoint/recorded_tokenizer.py)."""
import json
import os
import shutil
import warnings

import pytest

from megatron_zaya.arguments import parse_args
from megatron_zaya.checkpoint.recorded_tokenizer import recorded_tokenizer
from megatron_zaya.config import ModelConfig
from megatron_zaya.data.tokenizer import build_tokenizer
from megatron_zaya.model.accounting import count_parameters
from megatron_zaya.training.setup import build_and_train
from tests.training.conftest import run_tool
from tests.training.helpers import tiny_run_flags

TEXT = "the quick brown fox jumps over the lazy dog"


def test_relative_paths_are_found_here_or_from_the_run_directory(tmp_path, monkeypatch):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tok.model").write_bytes(b"x")
    meta = {"args": {"tokenizer_type": "GPTSentencePieceTokenizer", "tokenizer_model": "tok.model",
                     "vocab_file": None, "tiktoken_pattern": None},
            "working_directory": str(tmp_path / "run")}
    monkeypatch.chdir(tmp_path)
    found = recorded_tokenizer(meta)
    assert found.flags == {"tokenizer_type": "GPTSentencePieceTokenizer",
                           "tokenizer_model": str(tmp_path / "run" / "tok.model")} and not found.missing
    assert found.command_line() == f"--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model {tmp_path}/run/tok.model"
    (tmp_path / "tok.model").write_bytes(b"x")          # the same file from here too: taken as given, said nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert recorded_tokenizer(meta).flags["tokenizer_model"] == "tok.model"
    # Another file from here: the run's own (the one it read; the current directory's was taken), with a warning
    (tmp_path / "tok.model").write_bytes(b"y")
    with pytest.warns(UserWarning) as said:
        assert recorded_tokenizer(meta).flags["tokenizer_model"] == str(tmp_path / "run" / "tok.model")
    assert str(said[0].message) == (
        f"the checkpoint's recorded --tokenizer-model tok.model names two different files: {tmp_path}/run/tok.model "
        f"(from the folder the training run was started in) and {tmp_path}/tok.model (from the current folder); "
        f"using {tmp_path}/run/tok.model, the one the run read (give the tokenizer flags to choose)")
    os.remove(tmp_path / "run" / "tok.model")           # the run's gone: the one from here, as before
    assert recorded_tokenizer(meta).flags["tokenizer_model"] == "tok.model"
    os.remove(tmp_path / "tok.model")
    (tmp_path / "run" / "tok.model").write_bytes(b"x")
    os.remove(tmp_path / "run" / "tok.model")
    gone = recorded_tokenizer(meta)
    assert gone.missing == ["tokenizer_model"]
    assert gone.missing_message() == "the run that saved it used --tokenizer-model tok.model, which is not found from here"
    assert recorded_tokenizer({"args": {}}) is None and recorded_tokenizer({}) is None
    assert not recorded_tokenizer({"args": {"tokenizer_type": "NullTokenizer", "tokenizer_vocab_size": 512}}).reads_text
    # A NullTokenizer's --tokenizer-model is its vocabulary size, not a file that could be missing.
    null = recorded_tokenizer({"args": {"tokenizer_type": "NullTokenizer", "tokenizer_model": "32000"}})
    assert not null.missing and null.flags["tokenizer_model"] == "32000"


@pytest.fixture(scope="module")
def run_with_relative_tokenizer(tiny_corpus, tmp_path_factory):
    """(--save folder, tokenizer copy) of a one-step run started in its own folder with --tokenizer-model
    given relative to it."""
    folder = tmp_path_factory.mktemp("relative_run")
    shutil.copy(tiny_corpus[1], folder / "sp.model")
    here = os.getcwd()
    os.chdir(folder)
    try:
        run = parse_args(tiny_run_flags((tiny_corpus[0], "sp.model"), folder,
                                        **{"--train-iters": 1, "--eval-iters": 0, "--save": "ckpt"}))
        assert build_and_train(run) == 0
    finally:
        os.chdir(here)
    return folder / "ckpt", folder / "sp.model"


def test_tools_take_the_training_runs_tokenizer(run_with_relative_tokenizer, tiny_corpus, tmp_path, monkeypatch, capsys):
    transformers = pytest.importorskip("transformers")
    save, model_file = run_with_relative_tokenizer
    monkeypatch.chdir(tmp_path)           # elsewhere: "sp.model" is found from the run's directory
    ours = build_tokenizer("GPTSentencePieceTokenizer", str(model_file))
    said = f"--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model {model_file}"

    assert run_tool("convert_checkpoint", ["to-hf", str(save), "hf", "--no-progress"]) == 0
    assert f"tokenizer: {said}, as the training run that saved the checkpoint" in capsys.readouterr().err
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert theirs.encode(TEXT, add_special_tokens=False) == ours.encode(TEXT)
    card = (tmp_path / "hf" / "README.md").read_text()       # the model card: the run's facts as it recorded them
    counts = count_parameters(ModelConfig(**json.loads((save / "iter_0000001" / "metadata.json").read_text())[
        "model_config"]))
    for row in (f"| trained | iteration 1, {4 * 32:,} tokens seen |", "| weights | fp32, exported ",
                "| tokenizer | `--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model sp.model` |",   # as given
                f"| data | `--data-path {tiny_corpus[0]} --split 969,30,1 --seq-length 32` |",
                f"| parameters | {counts.total / 1e6:.1f}M in total,", "library_name: transformers"):
        assert row in card, (row, card)

    generate = ["--load", str(save), "--prompt", TEXT, "--greedy", "--max-new-tokens", "2", "--output-json", "gen.json"]
    assert run_tool("generate", generate) == 0
    assert f"tokenizer: {said}, as the training run that saved --load" in capsys.readouterr().err
    assert json.loads((tmp_path / "gen.json").read_text())["samples"][0]["prompt_ids"] == ours.encode(TEXT)

    assert run_tool("evaluate", ["--load", str(save), "--data-path", tiny_corpus[0], "--seq-length", "32",
                                 "--eval-iters", "1", "--micro-batch-size", "1", "--log-interval", "0",
                                 "--data-cache-path", str(tmp_path / "cache")]) == 0
    assert f"tokenizer: {said}" in capsys.readouterr().err

    assert run_tool("inspect_checkpoint", [str(save)]) == 0
    assert f"tokenizer:   {said}\n" in capsys.readouterr().out

    # --use-checkpoint-args takes it too, with the path resolved
    flags = tiny_run_flags((tiny_corpus[0], None), tmp_path, **{"--load": save, "--preset": None, "--num-layers": None,
                                                                  "--use-checkpoint-args": ""})
    assert parse_args(flags).data.tokenizer_model == str(model_file)

    assert run_tool("convert_checkpoint", ["to-hf", str(save), "hf_none", "--no-tokenizer", "--no-progress"]) == 0
    assert not (tmp_path / "hf_none" / "tokenizer.json").exists() and "tokenizer" not in capsys.readouterr().err


def _other_sentencepiece_model(path) -> None:
    """A 60-piece SentencePiece BPE model of other text at `path` (another tokenizer than the run's)."""
    import sentencepiece as spm
    corpus = path.parent / f"{path.stem}.txt"
    corpus.write_text("\n".join(f"zebra quartz {i} violin ocean {i * 7}" for i in range(300)))
    spm.SentencePieceTrainer.Train(input=str(corpus), model_prefix=str(path.parent / path.stem), vocab_size=60,
                                   model_type="bpe", minloglevel=2)


def test_another_file_of_the_recorded_path_here_does_not_replace_the_runs_tokenizer(
        run_with_relative_tokenizer, tmp_path, monkeypatch, capsys):
    """to-hf run from a folder that holds another sp.model (the run recorded --tokenizer-model sp.model, relative):
    the run's own tokenizer is exported, with a warning naming both files (the one here was taken, silently)."""
    transformers = pytest.importorskip("transformers")
    save, model_file = run_with_relative_tokenizer
    monkeypatch.chdir(tmp_path)
    _other_sentencepiece_model(tmp_path / "sp.model")
    with pytest.warns(UserWarning, match=f"recorded --tokenizer-model sp.model names two different files: "
                                         f"{model_file} .* and {tmp_path}/sp.model .*; using {model_file}"):
        assert run_tool("convert_checkpoint", ["to-hf", str(save), "hf", "--no-progress"]) == 0
    said = f"--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model {model_file}"
    assert f"tokenizer: {said}, as the training run that saved the checkpoint" in capsys.readouterr().err
    ours = build_tokenizer("GPTSentencePieceTokenizer", str(model_file))
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert len(theirs) == ours.vocab_size and theirs.encode(TEXT, add_special_tokens=False) == ours.encode(TEXT)


def test_tokenizer_flags_naming_another_tokenizer_than_the_checkpoints_are_warned_of(
        run_with_relative_tokenizer, tmp_path, capsys):
    """generate --tokenizer-model OTHER on a checkpoint whose run recorded another tokenizer: a warning naming
    what differs (it ran on with other ids than the model learned, silently); the same tokenizer by another
    path says nothing."""
    save, model_file = run_with_relative_tokenizer
    _other_sentencepiece_model(tmp_path / "other.model")
    shutil.copy(model_file, tmp_path / "same.model")
    said = []
    for given in (tmp_path / "other.model", tmp_path / "same.model"):
        assert run_tool("generate", ["--load", str(save), "--tokenizer-type", "GPTSentencePieceTokenizer",
                                     "--tokenizer-model", str(given), "--prompt", TEXT, "--greedy",
                                     "--max-new-tokens", "1"]) == 0
        said.append([line for line in capsys.readouterr().err.splitlines() if line.startswith("WARNING")])
    assert said[1] == [] and len(said[0]) == 1, said
    assert said[0][0].startswith("WARNING the tokenizer flags name another tokenizer than the tokenizer the training "
                                 f"run that saved --load recorded (GPTSentencePieceTokenizer {model_file}): its "
                                 "vocabulary size is 500, the given one's 60"), said


def test_a_moved_tokenizer_is_named_and_nothing_is_guessed(run_with_relative_tokenizer, tmp_path, monkeypatch, capsys):
    save, model_file = run_with_relative_tokenizer
    monkeypatch.chdir(tmp_path)
    moved = tmp_path / "moved.model"
    shutil.move(model_file, moved)
    try:
        assert run_tool("convert_checkpoint", ["to-hf", str(save), "hf", "--no-progress"]) == 0
        assert not (tmp_path / "hf" / "tokenizer.json").exists() and (tmp_path / "hf" / "config.json").exists()
        assert ("no tokenizer files written (" + str(save) + ": the run that saved it used --tokenizer-model sp.model, "
                "which is not found from here); give the tokenizer flags") in capsys.readouterr().err
        with pytest.raises(SystemExit) as exc:
            run_tool("generate", ["--load", str(save), "--prompt", TEXT, "--max-new-tokens", "1"])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "--tokenizer-model sp.model, which is not found from here" in err
        assert "text prompts need --tokenizer-type and --tokenizer-model, unless --load brings its own" in err
    finally:
        shutil.move(moved, model_file)
