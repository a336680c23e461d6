"""Bad flags and damaged inputs of tools/generate.py, tools/evaluate.py and tools/inspect_checkpoint.py:
one `error:` line naming the flag or file (exit status 2, or 1 for a damaged checkpoint under
inspection), and for flags, before the checkpoint's tensors are loaded."""
import json
import os
import shutil
import struct

import numpy as np
import pytest
import torch

from megatron_zaya.checkpoint.format import CheckpointError
from megatron_zaya.data import IndexedDatasetWriter
from megatron_zaya.inference.loading import load_model_for_inference

from inference_helpers import hf_checkpoint, load_tool, one_cpu_thread, tiny_model  # noqa: F401 (fixtures)


def no_load(*args, **kwargs):
    raise AssertionError("the checkpoint was loaded before the flags were checked")


def error_line(tool, argv, capsys, monkeypatch=None):
    """(exit code, last stderr line) of tool.main(argv); loading the model fails the test when monkeypatch is given."""
    if monkeypatch is not None:
        monkeypatch.setattr(tool, "load_model_for_inference", no_load)
    with pytest.raises(SystemExit) as exc:
        tool.main(argv)
    return exc.value.code, capsys.readouterr().err.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def bad_utf8_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "bad.txt"
    path.write_bytes(b"fine\n\xff\xfe broken\n")
    return path


@pytest.mark.parametrize("extra, expected", [
    (["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", "nope.model"], "--tokenizer-model nope"),
    (["--tokenizer-type", "TikTokenizer", "--tokenizer-model", "8000"], "--tokenizer-model 8000: TikTokenizer vocabulary"),
    (["--tokenizer-type", "BertWordPieceCase", "--tokenizer-model", "v.txt"], "--tokenizer-type 'BertWordPieceCase'"),
    (["--tiktoken-pattern", "v2"], "--tiktoken-pattern needs --tokenizer-type"),
    (["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "nope.json"], "--vocab-file nope.json"),
    (["--vocab-file", "nope.json"], "--vocab-file needs --tokenizer-type"),
    (["--threads", "-1"], "--threads=-1"),
    (["--device", "gpu0"], "--device 'gpu0'"),
    (["--output-json", "/nonexistent_dir_zaya/x.json"], "--output-json /nonexistent_dir_zaya/x.json"),
    (["--eod-id", "999999"], "--eod-id=999999"),
    (["--prefill-chunk", "0"], "--prefill-chunk=0"),
    (["--prompt-ids", "999999"], "token ids [999999]"),
    (["--max-new-tokens", "100000"], "--max-new-tokens=100000"),
    (["--seed", str(2 ** 64)], "--seed=18446744073709551616 must be an integer in [0, 2**64)"),
    (["--temperature", "nan"], "--temperature=nan"),
    (["--prompt-ids", ""], "prompt 1 is empty"),
    (["--prompt-ids", "1_2"], "--prompt-ids '1_2': expected space-separated integers"),     # not token 12
    (["--prompt-ids", "-3"], "--prompt-ids '-3': expected space-separated integers"),
    (["--prompt-ids", "3 600", "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "500"],
     "prompt 1: token ids [600] outside the tokenizer's vocabulary [0, 501)"),
    # an EOD the tokenizer cannot give (its padded rows are never picked): generation would never stop there
    (["--eod-id", "600", "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "500"],
     "--eod-id=600 is outside the tokenizer's vocabulary [0, 501)"),
])
def test_generate_flags_are_checked_before_loading(hf_checkpoint, capsys, monkeypatch, extra, expected):
    code, line = error_line(load_tool("generate"), ["--load", str(hf_checkpoint), "--prompt-ids", "1 2"] + extra,
                            capsys, monkeypatch)
    assert code == 2 and "error:" in line and expected in line and "--load" not in line, line


def test_generate_cuda_without_cuda(hf_checkpoint, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, line = error_line(load_tool("generate"), ["--load", str(hf_checkpoint), "--prompt-ids", "1", "--device",
                                                    "cuda"], capsys, monkeypatch)
    assert code == 2 and "--device cuda: CUDA is not available" in line, line


def test_generate_prompt_file_not_utf8(hf_checkpoint, bad_utf8_file, capsys, monkeypatch):
    code, line = error_line(load_tool("generate"), ["--load", str(hf_checkpoint), "--prompt-file", str(bad_utf8_file),
                                                    "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "8000"],
                            capsys, monkeypatch)
    assert code == 2 and f"--prompt-file {bad_utf8_file}: not UTF-8" in line, line


@pytest.fixture(scope="module")
def damaged_folders(hf_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    bad_config, truncated = root / "bad_config", root / "truncated"
    shutil.copytree(hf_checkpoint, bad_config)
    shutil.copytree(hf_checkpoint, truncated)
    (bad_config / "config.json").write_text("{bad")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    return bad_config, truncated


def test_loader_names_the_damaged_file(damaged_folders, capsys):
    bad_config, truncated = damaged_folders
    with pytest.raises(CheckpointError, match=f"{bad_config / 'config.json'}: not valid JSON"):
        load_model_for_inference(bad_config)
    with pytest.raises(CheckpointError, match=f"{truncated / 'model.safetensors'}: unreadable safetensors"):
        load_model_for_inference(truncated)
    code, line = error_line(load_tool("generate"), ["--load", str(truncated), "--prompt-ids", "1"], capsys)
    assert code == 2 and "model.safetensors: unreadable" in line, line


def test_a_hub_name_is_not_downloaded_and_the_error_says_how_to_fetch_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)       # "Zyphra/ZAYA1-base" is not on disk here
    hint = ("Zyphra/ZAYA1-base looks like a Hugging Face Hub name, and nothing is downloaded at run time: fetch it "
            "first (hf download Zyphra/ZAYA1-base --local-dir DIR) and give DIR")
    code, line = error_line(load_tool("generate"), ["--load", "Zyphra/ZAYA1-base", "--prompt-ids", "1"], capsys)
    assert code == 2 and line.endswith(hint), line
    assert load_tool("convert_checkpoint").main(["from-hf", "Zyphra/ZAYA1-base", "out"]) == 1
    assert capsys.readouterr().err.strip().endswith(hint)
    (tmp_path / "Zyphra" / "ZAYA1-base").mkdir(parents=True)      # a real (empty) folder gets no hint
    code, line = error_line(load_tool("generate"), ["--load", "Zyphra/ZAYA1-base", "--prompt-ids", "1"], capsys)
    assert code == 2 and "Hub name" not in line, line


# --- evaluate.py -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def big_ids_prefix(tmp_path_factory):
    """A dataset whose ids reach 9000, beyond the tiny checkpoint's vocabulary."""
    prefix = str(tmp_path_factory.mktemp("bigids") / "big_text_document")
    rng = np.random.default_rng(0)
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for _ in range(20):
            writer.add_document(rng.integers(8500, 9000, size=50).tolist())
    return prefix


def eval_argv(hf_checkpoint, prefix, *extra):
    return ["--load", str(hf_checkpoint), "--data-path", prefix, "--tokenizer-type", "NullTokenizer",
            "--tokenizer-model", "8000", "--seq-length", "32", "--micro-batch-size", "2", *extra]


@pytest.mark.parametrize("extra, expected", [
    (["--split", "100,0,0", "--eval-iters", "1"], "--split 100,0,0: the valid split"),
    (["--split", "1,0"], "--split 1,0: the valid split"),
    (["--split", "1,1,0", "--split-name", "test"], "--split 1,1,0: the test split"),
    (["--split", "1,1", "--seq-length", "4000"], "fewer than --seq-length 4000"),
    (["--split", "1,1", "--threads", "-1"], "--threads=-1"),
    (["--split", "1,1", "--device", "gpu0"], "--device 'gpu0'"),
    (["--split", "1,1", "--output-json", "/nonexistent_dir_zaya/x.json"], "--output-json"),
    (["--split", "1,1", "--log-interval", "-1"], "--log-interval=-1"),
])
def test_evaluate_flags_are_checked_before_loading(hf_checkpoint, big_ids_prefix, capsys, monkeypatch, extra,
                                                   expected):
    code, line = error_line(load_tool("evaluate"), eval_argv(hf_checkpoint, big_ids_prefix, *extra), capsys,
                            monkeypatch)
    assert code == 2 and expected in line and "--load" not in line, line


def test_evaluate_tensorboard_dir_under_a_file(hf_checkpoint, big_ids_prefix, tmp_path, capsys, monkeypatch):
    (tmp_path / "f").write_text("x")
    code, line = error_line(load_tool("evaluate"), eval_argv(hf_checkpoint, big_ids_prefix, "--split", "1,1",
                                                             "--tensorboard-dir", str(tmp_path / "f" / "tb")),
                            capsys, monkeypatch)
    assert code == 2 and "--tensorboard-dir" in line and "is not a folder" in line, line


def test_evaluate_token_ids_beyond_the_vocabulary(hf_checkpoint, big_ids_prefix, tmp_path, capsys):
    code, line = error_line(load_tool("evaluate"), eval_argv(hf_checkpoint, big_ids_prefix, "--split", "1,1",
                                                             "--eval-iters", "1", "--no-index-cache"), capsys)
    assert code == 2 and f"{big_ids_prefix}: sample 0 holds token id" in line, line
    assert "outside the tokenizer's vocabulary of 8001" in line, line


def test_evaluate_progress_lines():
    tool = load_tool("evaluate")
    import contextlib
    import io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert list(tool.with_progress(iter(range(5)), 5, 2)) == list(range(5))
        assert list(tool.with_progress(iter(range(5)), 5, None)) == list(range(5))   # auto: silent below 20
    lines = err.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == ["evaluated 2/5 micro-batches", "evaluated 4/5 micro-batches",
                                                      "evaluated 5/5 micro-batches"]


# --- inspect_checkpoint.py ----------------------------------------------------------------------

def write_safetensors(path, header: dict, data: bytes):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize("case", ["string_offsets", "config_list", "metadata_list", "world_size_string",
                                  "weight_map_list", "layout_missing", "world_size_zero"])
def test_inspect_reports_damaged_checkpoints_as_problems(hf_checkpoint, tmp_path, capsys, case):
    folder = tmp_path / case
    if case in ("metadata_list", "world_size_string", "layout_missing", "world_size_zero"):
        folder.mkdir()
        meta = {"metadata_list": [], "world_size_string": {"layout": {"world_size": "2"}}, "layout_missing": {},
                "world_size_zero": {"layout": {"world_size": 0}, "files": {}, "model_config": {}, "train_state": {}}}
        (folder / "metadata.json").write_text(json.dumps(meta[case]))
        expected = {"layout_missing": "metadata.json: 'layout' is missing",     # (a traceback; a zero world: OK)
                    "world_size_zero": "layout.world_size is 0, expected an integer >= 1"}.get(case, "metadata.json")
    else:
        shutil.copytree(hf_checkpoint, folder)
        if case == "string_offsets":
            write_safetensors(folder / "model.safetensors",
                              {"model.embed_tokens.weight": {"dtype": "F32", "shape": [2], "data_offsets": ["0", "8"]}},
                              b"\0" * 8)
            expected = "malformed header entry"
        elif case == "config_list":
            (folder / "config.json").write_text("[1]")
            expected = "config.json: expected a JSON object"
        else:
            (folder / "model.safetensors").unlink()
            (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": []}))
            expected = "weight_map"
    assert load_tool("inspect_checkpoint").main([str(folder)]) == 1
    out = capsys.readouterr().out
    assert "PROBLEMS FOUND" in out and expected in out, out


def test_a_loader_names_what_a_checkpoints_metadata_lacks(hf_checkpoint, tmp_path):
    """A complete folder whose metadata.json lacks a part every loader reads: a CheckpointError naming the file
    and the part (the tools caught it as one line), not a KeyError from deep inside."""
    from megatron_zaya.checkpoint.format import COMPLETE_MARKER, FORMAT_VERSION, CheckpointError
    from megatron_zaya.inference.loading import load_model_for_inference
    folder = tmp_path / "iter_0000001"
    folder.mkdir()
    (folder / COMPLETE_MARKER).write_text("1\n")
    (folder / "metadata.json").write_text(json.dumps({"format_version": FORMAT_VERSION, "layout": {"world_size": 1},
                                                      "files": {}, "train_state": {}}))
    with pytest.raises(CheckpointError, match=r"metadata.json: 'model_config' is missing"):
        load_model_for_inference(str(folder))
    # another format version is said as such, whatever parts its metadata has
    (folder / "metadata.json").write_text(json.dumps({"format_version": FORMAT_VERSION + 1}))
    with pytest.raises(CheckpointError, match=rf"format version {FORMAT_VERSION + 1} \(this code reads"):
        load_model_for_inference(str(folder))


@pytest.mark.parametrize("present, said", [
    (["config.json"], "config.json but no model.safetensors"),
    (["model.safetensors"], "model.safetensors but no config.json"),
    (["config.json", "model-00001-of-00002.safetensors"], "config.json and model-00001-of-00002.safetensors but no "
                                                          "model.safetensors.index.json")])
def test_half_a_hugging_face_folder_is_named_as_such(tmp_path, present, said):
    """An interrupted download: not just "no checkpoint (no latest_checkpointed_iteration.txt ...)"."""
    from megatron_zaya.checkpoint.format import CheckpointError
    from megatron_zaya.checkpoint.inspection import resolve_folder
    for name in present:
        (tmp_path / name).write_text("{}")
    with pytest.raises(CheckpointError, match=f"no checkpoint .*; it holds (a Hugging Face )?{said}"):
        resolve_folder(str(tmp_path))


@pytest.mark.parametrize("load, said", [("nothing_here", "--load {}: no such checkpoint (file or folder)"),
                                        ("empty", "--load: {}: no checkpoint (no latest_checkpointed_iteration.txt")])
def test_evaluate_without_tokenizer_flags_names_the_load_problem(big_ids_prefix, tmp_path, capsys, monkeypatch, load,
                                                                 said):
    """With no tokenizer flag, a bad --load was reported as "--tokenizer-type is required (...)"."""
    (tmp_path / "empty").mkdir()
    path = str(tmp_path / load)
    code, line = error_line(load_tool("evaluate"), ["--load", path, "--data-path", big_ids_prefix], capsys,
                            monkeypatch)
    assert code == 2 and said.format(path) in line, line


def test_server_needs_a_tokenizer_flag_or_a_folder_that_holds_one(hf_checkpoint, capsys, monkeypatch):
    code, line = error_line(load_tool("run_text_generation_server"), ["--load", str(hf_checkpoint), "--port", "0"],
                            capsys, monkeypatch)
    assert code == 2 and "--tokenizer-type is required" in line and "tokenizer.json" in line, line


def test_evaluate_takes_megatrons_null_tokenizer_vocab_size(tmp_path, hf_checkpoint, capsys):   # noqa: F811
    """tools/evaluate.py: `--tokenizer-type NullTokenizer --vocab-size V` (it refused --vocab-size as
    TikTokenizer's)."""
    prefix = str(tmp_path / "ids")
    with IndexedDatasetWriter(prefix, np.int32) as writer:
        for start in range(0, 400, 40):
            writer.add_document(np.arange(start, start + 40) % 200)
    tool = load_tool("evaluate")
    argv = ["--load", str(hf_checkpoint), "--data-path", prefix, "--tokenizer-type", "NullTokenizer", "--vocab-size",
            "200", "--seq-length", "16", "--eval-iters", "1", "--micro-batch-size", "2", "--split", "0,100,0"]
    assert tool.main(argv) in (0, None)
    assert "loss" in capsys.readouterr().out


def test_null_tokenizer_takes_megatrons_vocab_size_flag():
    """The inference tools' tokenizer flags read `--tokenizer-type NullTokenizer --vocab-size V` as Megatron-LM
    does: V ids and an end-of-document token V (as with --tokenizer-model V)."""
    import argparse

    from megatron_zaya.inference.cli_checks import add_tokenizer_arguments, tokenizer_from_flags
    parser = argparse.ArgumentParser()
    add_tokenizer_arguments(parser)
    tokenizer = tokenizer_from_flags(parser.parse_args(["--tokenizer-type", "NullTokenizer", "--vocab-size", "50"]))
    assert (tokenizer.vocab_size, tokenizer.eod) == (51, 50)


def test_generate_output_json_that_became_unwritable_during_the_run(hf_checkpoint, tmp_path, capsys):
    """--output-json passed the start-up check but cannot be written at the end (here a folder took its
    place): one error line, exit status 2, not a traceback after the whole run."""
    tool = load_tool("generate")
    out_json = tmp_path / "gen.json"
    real_generate = tool.generate

    def generate_then_block_the_output(*args, **kwargs):
        (tmp_path / "gen.json").mkdir()
        return real_generate(*args, **kwargs)
    tool.generate = generate_then_block_the_output
    code, line = error_line(tool, ["--load", str(hf_checkpoint), "--prompt-ids", "1 2", "--max-new-tokens", "2",
                                   "--output-json", str(out_json)], capsys)
    assert code == 2 and f"--output-json {out_json}: cannot write (" in line, line
    assert sorted(os.listdir(tmp_path)) == ["gen.json"]


@pytest.mark.parametrize("timeout", ["nan", "-1", "0", "inf", "1e10"])
def test_text_generation_cli_checks_its_timeout_before_any_prompt(capsys, timeout):
    """A timeout the socket refuses failed every prompt ('Invalid value NaN', exit 0): a usage error first."""
    code, line = error_line(load_tool("text_generation_cli"), ["localhost:1", "--timeout", timeout], capsys)
    assert code == 2 and f"--timeout={float(timeout)}: must be a positive number of seconds, at most 1e9" in line, line


def test_generate_refuses_an_output_json_inside_the_checkpoint_it_loads(hf_checkpoint, tmp_path, capsys, monkeypatch):
    """--output-json LOAD/config.json replaced the checkpoint's config, which then no longer loaded; so did a
    Hugging Face cache's snapshot, whose config.json is a link into ../../blobs (outside the folder)."""
    code, line = error_line(load_tool("generate"), ["--load", str(hf_checkpoint), "--prompt-ids", "1 2",
                                                    "--output-json", str(hf_checkpoint / "config.json")],
                            capsys, monkeypatch)
    assert code == 2 and "inside the --load folder" in line, line
    snapshot, blobs = tmp_path / "hub" / "snapshots" / "abc", tmp_path / "hub" / "blobs"
    snapshot.mkdir(parents=True), blobs.mkdir()
    for name in os.listdir(hf_checkpoint):
        shutil.copy(hf_checkpoint / name, blobs / name)
        (snapshot / name).symlink_to(os.path.join("..", "..", "blobs", name))
    code, line = error_line(load_tool("generate"), ["--load", str(snapshot), "--prompt-ids", "1 2",
                                                    "--output-json", str(snapshot / "config.json")],
                            capsys, monkeypatch)
    assert code == 2 and "inside the --load folder" in line, line
