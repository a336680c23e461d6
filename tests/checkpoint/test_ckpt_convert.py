"""tools/convert_checkpoint.py: sharded -> Hugging Face folder -> sharded in another layout (and an
offline re-layout), with identical weights, and training continues from the converted checkpoint."""
import os

import pytest
import torch

from ckpt_harness import ROOT, convert_tool, flags, train
from megatron_zaya.checkpoint import inspect_checkpoint, load_full_model_state
from megatron_zaya.checkpoint.hf_format import load_hf_folder




def _same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].shape == b[k].shape and torch.equal(a[k], b[k].to(a[k].dtype)), k


def test_sharded_to_hf_and_back_into_any_layout(ckpt_corpus, ckpt_cache, tmp_path, capsys):
    tool = convert_tool()
    src = str(tmp_path / "src")
    train(flags(ckpt_corpus, 2, "--save", src, cache=ckpt_cache))
    original, config, info = load_full_model_state(src)
    assert info["iteration"] == 2

    hf = str(tmp_path / "hf")
    capsys.readouterr()
    assert tool.main(["to-hf", src, hf]) == 0
    progress = capsys.readouterr().err        # progress lines: every tenth of the weights read, then the write
    weights = len([k for k in original])
    assert f"read {weights}/{weights} weights (" in progress and f"] writing {hf}" in progress, progress
    hf_state, hf_config = load_hf_folder(hf)
    _same(original, hf_state)
    assert hf_config.hidden_size == config.hidden_size and hf_config.num_experts == config.num_experts
    assert hf_config.seq_length == config.seq_length != 4096   # the trained length, evaluate.py's default
    assert tool.main(["to-hf", src, hf]) == 2            # refuses to overwrite (a usage error)
    assert "refusing to overwrite" in capsys.readouterr().err
    # --max-shard-size: shards and their index, read back the same (from-hf below takes either form)
    shards = str(tmp_path / "hf-shards")
    assert tool.main(["to-hf", src, shards, "--max-shard-size", "0.1MB", "--no-progress"]) == 0
    assert os.path.isfile(os.path.join(shards, "model.safetensors.index.json"))
    assert len([f for f in os.listdir(shards) if f.startswith("model-")]) > 1
    _same(original, load_hf_folder(shards)[0])
    with pytest.raises(SystemExit):
        tool.main(["to-hf", src, str(tmp_path / "x"), "--max-shard-size", "5 parsecs"])
    assert "'5 parsecs': give a size such as 5GB" in capsys.readouterr().err
    hf = shards

    sharded = str(tmp_path / "tp2ep2")
    assert tool.main(["from-hf", hf, sharded, "--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2",
                      "--world-size", "4"]) == 0
    assert "wrote rank 4/4" in capsys.readouterr().err
    report = inspect_checkpoint(sharded)
    assert report["ok"] and report["layout"]["world_size"] == 4 and report["iteration"] == 0
    assert report["layout"]["tensor_model_parallel_size"] == 2
    _same(original, load_full_model_state(sharded)[0])

    relayout = str(tmp_path / "ep2")
    assert tool.main(["reshard", sharded, relayout, "--expert-model-parallel-size", "2", "--world-size", "2",
                      "--iteration", "7", "--no-progress"]) == 0
    assert "[convert" not in capsys.readouterr().err
    assert inspect_checkpoint(relayout)["iteration"] == 7
    _same(original, load_full_model_state(relayout)[0])
    # The tokenizer goes along: from-hf records the folder's tokenizer.json, reshard its source's record (the
    # tools and --use-checkpoint-args take it when given no tokenizer flag; both recorded none before)
    from megatron_zaya.checkpoint.recorded_tokenizer import recorded_tokenizer_of
    from megatron_zaya.data.tokenizer import build_tokenizer
    for converted in (sharded, relayout):
        record = recorded_tokenizer_of(converted)
        assert record is not None and not record.missing
        assert record.flags == {"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": os.path.abspath(hf)}
    resharded_src = str(tmp_path / "src-ep2")
    assert tool.main(["reshard", src, resharded_src, "--expert-model-parallel-size", "2", "--world-size", "2",
                      "--no-progress"]) == 0
    assert recorded_tokenizer_of(resharded_src).flags == recorded_tokenizer_of(src).flags
    text = "the king and the queen"
    assert build_tokenizer(**recorded_tokenizer_of(sharded).flags).encode(text) == \
        build_tokenizer(**recorded_tokenizer_of(src).flags).encode(text)

    # A source of the other kind names the subcommand that reads it, before anything is read or written.
    for argv, expected in [(["to-hf", hf, str(tmp_path / "o1")], f"{hf}: already a Hugging Face folder"),
                           (["average", hf, str(tmp_path / "o2")], f"{hf}: already a Hugging Face folder"),
                           (["from-hf", src, str(tmp_path / "o3")], f"{src}: a training checkpoint, not a Hugging Face"),
                           (["reshard", hf, str(tmp_path / "o4")], f"{hf}: a Hugging Face folder (from-hf converts it")]:
        with pytest.raises(SystemExit) as exc:
            tool.main(argv)
        assert exc.value.code == 2 and expected in capsys.readouterr().err, argv
        assert not os.path.exists(argv[2])

    # Training starts from the converted weights exactly as from the original checkpoint.
    from_original = train(flags(ckpt_corpus, 1, "--load", src, "--finetune", cache=ckpt_cache))
    from_converted = train(flags(ckpt_corpus, 1, "--load", sharded, "--finetune", cache=ckpt_cache))
    assert from_original.losses == from_converted.losses


def test_bad_source_is_a_clear_error(tmp_path, capsys):
    tool = convert_tool()
    assert tool.main(["to-hf", str(tmp_path / "nothing"), str(tmp_path / "out"), "--no-tokenizer"]) == 1
    assert f"{tmp_path / 'nothing'}: no such checkpoint folder" in capsys.readouterr().err
    for command in (["to-hf", str(tmp_path / "nothing")], ["average", str(tmp_path / "nothing")]):
        # without tokenizer flags: the missing checkpoint's error alone, no "records no tokenizer" note first
        assert tool.main([*command, str(tmp_path / "out")]) == 1
        err = capsys.readouterr().err
        assert err.strip() == f"convert_checkpoint.py: error: {tmp_path / 'nothing'}: no such checkpoint folder", err
    (tmp_path / "docs.jsonl").write_text("{}\n")        # a file where a checkpoint goes: said so
    assert tool.main(["to-hf", str(tmp_path / "docs.jsonl"), str(tmp_path / "out"), "--no-tokenizer"]) == 1
    assert f"{tmp_path / 'docs.jsonl'}: a file, not a checkpoint folder" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["to-hf", "average", "from-hf", "reshard"])
def test_an_output_that_is_a_file_is_a_usage_error_and_the_file_stays(tmp_path, capsys, command):
    (tmp_path / "src").mkdir()
    out = tmp_path / "notes.txt"
    out.write_text("mine")
    with pytest.raises(SystemExit) as stopped:
        convert_tool().main([command, str(tmp_path / "src"), str(out)])
    assert stopped.value.code == 2 and f"{out}: a file, not a folder" in capsys.readouterr().err
    assert out.read_text() == "mine"


@pytest.mark.parametrize("command", ["from-hf", "reshard"])
def test_a_training_checkpoint_is_not_written_into_a_hugging_face_folder(tmp_path, capsys, command):
    """from-hf HF HF wrote iter_0000000 and the latest file into the HF folder itself (a second copy of the
    weights there, and a folder --load refuses as an HF folder): a usage error, the folder left as it was."""
    from megatron_zaya.checkpoint.hf_format import save_hf_folder
    from megatron_zaya.config import model_config_from_preset
    from megatron_zaya.model import ZayaModel

    config = model_config_from_preset("zaya1-tiny", num_layers=1, vocab_size=512)
    hf = tmp_path / "hf"
    save_hf_folder(ZayaModel(config).state_dict(), config, str(hf))
    before = sorted(os.listdir(hf))
    with pytest.raises(SystemExit) as stopped:
        convert_tool().main([command, str(hf if command == "from-hf" else tmp_path / "ckpt"), str(hf)])
    assert stopped.value.code == 2 and f"{hf}: a Hugging Face folder ({command} writes a training checkpoint" \
        in capsys.readouterr().err
    assert sorted(os.listdir(hf)) == before


@pytest.mark.parametrize("layout, message", [
    (["--expert-model-parallel-size", "8"], "--expert-model-parallel-size=8 must divide data-parallel"),
    (["--expert-model-parallel-size", "3", "--world-size", "3"], "--expert-model-parallel-size=3 must divide "
                                                                 "--num-experts=4"),
    (["--tensor-model-parallel-size", "0"], "--tensor-model-parallel-size=0: must be >= 1"),
    (["--world-size", "0"], "--world-size=0: must be >= 1"),
    (["--iteration", "-5"], "--iteration=-5: must be >= 0"),
    (["--tensor-model-parallel-size", "3", "--world-size", "3"], "--tensor-model-parallel-size=3 must divide "
                                                                 "--num-attention-heads=4"),
])
def test_an_impossible_output_layout_is_refused_before_anything_is_written(tmp_path, capsys, layout, message):
    """One rank splits nothing itself, so EP 8 on a world of 1 was written (and recorded) as if split; TP 0
    crashed after creating the output folder; a negative iteration was written as iter_-000005. Each is a
    usage error (exit status 2, as the tool's docstring says; it was 1, a checkpoint problem's)."""
    from megatron_zaya.checkpoint.hf_format import save_hf_folder
    from megatron_zaya.config import model_config_from_preset
    from megatron_zaya.model import ZayaModel

    model = ZayaModel(model_config_from_preset("zaya1-tiny", num_layers=1, vocab_size=256))
    save_hf_folder(model.state_dict(), model.config, tmp_path / "hf")
    assert convert_tool().main(["from-hf", str(tmp_path / "hf"), str(tmp_path / "out"), "--no-progress", *layout]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_bad_output_or_layout_is_refused_before_any_weight_is_read(tmp_path, capsys, monkeypatch):
    """to-hf into a non-empty folder (or one under a file), reshard and from-hf with an impossible layout or
    iteration, or into a folder holding checkpoints: refused from the metadata / config.json alone (every weight
    was read first: minutes and tens of GB for a large model)."""
    from megatron_zaya.checkpoint import convert, hf_format
    from megatron_zaya.config import model_config_from_preset
    from megatron_zaya.model import ZayaModel

    model = ZayaModel(model_config_from_preset("zaya1-tiny", num_layers=1, vocab_size=256))
    hf_format.save_hf_folder(model.state_dict(), model.config, tmp_path / "hf")
    ckpt = str(tmp_path / "ckpt")
    assert convert_tool().main(["from-hf", str(tmp_path / "hf"), ckpt, "--no-progress"]) == 0
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("mine")
    (tmp_path / "notes.txt").write_text("mine")

    def no_weights(*args, **kwargs):
        raise AssertionError("a weight was read")
    monkeypatch.setattr(convert, "load_full_model_state", no_weights)
    monkeypatch.setattr(convert, "load_hf_folder", no_weights)
    for argv, status, message in (
            (["to-hf", ckpt, str(tmp_path / "full")], 2, "full: exists and is not empty"),
            (["to-hf", ckpt, str(tmp_path / "notes.txt" / "out")], 2, "notes.txt is a file, not a folder"),
            (["reshard", ckpt, str(tmp_path / "r"), "--expert-model-parallel-size", "3", "--world-size", "3"], 2,
             "--expert-model-parallel-size=3 must divide --num-experts=4"),
            (["reshard", ckpt, str(tmp_path / "r"), "--iteration", "-1"], 2, "--iteration=-1: must be >= 0"),
            (["reshard", ckpt, str(tmp_path / "r"), "--world-size", "0"], 2, "--world-size=0: must be >= 1"),
            (["reshard", ckpt, ckpt], 2, "already holds checkpoints"),
            (["from-hf", str(tmp_path / "hf"), str(tmp_path / "r"), "--world-size", "-1"], 2, "--world-size=-1"),
            (["from-hf", str(tmp_path / "hf"), ckpt], 2, "already holds checkpoints")):
        assert convert_tool().main([*argv, "--no-progress"]) == status, argv
        assert message in capsys.readouterr().err, argv
    assert (tmp_path / "full" / "mine.txt").read_text() == "mine" and not (tmp_path / "r").exists()


def test_a_conversion_into_a_folder_a_run_is_saving_into_is_refused(tmp_path, capsys):
    """The output folder's lock held (a training run before its first complete checkpoint): refused at once,
    nothing written (the conversion's pruning removed the run's save in progress, and its checkpoint hid the
    run's later ones); once free, the same conversion goes through."""
    from megatron_zaya.checkpoint.format import list_complete
    from megatron_zaya.checkpoint.hf_format import save_hf_folder
    from megatron_zaya.checkpoint.save_lock import SaveFolderLock
    from megatron_zaya.config import model_config_from_preset
    from megatron_zaya.model import ZayaModel

    model = ZayaModel(model_config_from_preset("zaya1-tiny", num_layers=1, vocab_size=256))
    save_hf_folder(model.state_dict(), model.config, tmp_path / "hf")
    out = tmp_path / "run"
    (out / "iter_0000002.partial-0123456789").mkdir(parents=True)     # the run's save in progress
    running = SaveFolderLock.hold(str(out), is_first_process=True)
    try:
        assert convert_tool().main(["from-hf", str(tmp_path / "hf"), str(out), "--no-progress"]) == 1
    finally:
        running.release()
    assert f"{out} is in use by a training run (pid {os.getpid()}" in capsys.readouterr().err
    assert (out / "iter_0000002.partial-0123456789").is_dir() and list_complete(str(out)) == []
    (out / "iter_0000002.partial-0123456789").rmdir()
    assert convert_tool().main(["from-hf", str(tmp_path / "hf"), str(out), "--no-progress"]) == 0
    assert list_complete(str(out)) == [0]


def test_failed_hf_write_leaves_no_temporary_folder(tmp_path, monkeypatch, capsys):
    """A write that fails half-way (here: the weights file) removes its hidden temporary folder."""
    import errno
    from megatron_zaya.checkpoint import hf_format
    from megatron_zaya.config import model_config_from_preset
    from megatron_zaya.model import ZayaModel
    config = model_config_from_preset("zaya1-tiny", num_layers=1, hidden_size=32, num_attention_heads=2,
                                      num_query_groups=2, kv_channels=16, vocab_size=128, num_experts=2,
                                      moe_ffn_hidden_size=32, router_hidden_size=8, seq_length=16)
    state = ZayaModel(config).state_dict()

    def disk_full(tensors, path, metadata=None):
        open(path, "wb").write(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device", path)
    monkeypatch.setattr(hf_format, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        hf_format.save_hf_folder(state, config, tmp_path / "hf")
    assert os.listdir(tmp_path) == []
    # The tool: one error line naming the output (it was a traceback), nothing left either
    monkeypatch.undo()
    hf_format.save_hf_folder(state, config, tmp_path / "src")
    monkeypatch.setattr(hf_format, "save_file", disk_full)
    assert convert_tool().main(["from-hf", str(tmp_path / "src"), str(tmp_path / "ckpt"), "--no-progress"]) == 0
    assert convert_tool().main(["to-hf", str(tmp_path / "ckpt"), str(tmp_path / "hf"), "--no-progress"]) == 1
    assert f"convert_checkpoint.py: error: {tmp_path / 'hf'}: [Errno 28] No space left" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "src"]


def test_sigterm_during_a_conversion_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    """A job's end (SIGTERM) in the middle of writing a sharded checkpoint removes the partial folder, as
    Ctrl-C does (without a handler the process would die with it in place); exit 130, handler restored."""
    import signal
    from megatron_zaya.checkpoint import convert, hf_format
    from megatron_zaya.config import model_config_from_preset
    from megatron_zaya.model import ZayaModel
    config = model_config_from_preset("zaya1-tiny", num_layers=1, hidden_size=32, num_attention_heads=2,
                                      num_query_groups=2, kv_channels=16, vocab_size=128, num_experts=2,
                                      moe_ffn_hidden_size=32, router_hidden_size=8, seq_length=16)
    hf_format.save_hf_folder(ZayaModel(config).state_dict(), config, tmp_path / "hf")
    real, ranks = convert._sharded_model, []

    def killed_on_the_second_rank(*args):
        ranks.append(args[-1])
        if len(ranks) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args)

    monkeypatch.setattr(convert, "_sharded_model", killed_on_the_second_rank)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "out"
    assert convert_tool().main(["from-hf", str(tmp_path / "hf"), str(out), "--world-size", "2", "--no-progress"]) == 130
    assert ranks == [0, 1] and "interrupted: no output written" in capsys.readouterr().err
    assert [f for _, _, files in os.walk(out) for f in files] == [] and sorted(os.listdir(tmp_path)) == ["hf", "out"]
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_next_write_removes_the_folder_a_sigkilled_hf_write_left(tmp_path, capsys):
    """A Hugging Face write killed by SIGKILL (here: inside the weights' save) leaves its hidden folder; the
    next write of that output removes it once it has been quiet for 10 minutes (aged here), not before."""
    import shutil
    import subprocess
    import sys
    import time
    from megatron_zaya.checkpoint import hf_format
    from megatron_zaya.config import model_config_from_preset
    from megatron_zaya.model import ZayaModel
    script = f"""
import os, signal, sys
sys.path.insert(0, {ROOT!r})
from megatron_zaya.checkpoint import hf_format
from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel
config = model_config_from_preset("zaya1-tiny", num_layers=1, hidden_size=32, num_attention_heads=2, num_query_groups=2,
                                  kv_channels=16, vocab_size=128, num_experts=2, moe_ffn_hidden_size=32,
                                  router_hidden_size=8, seq_length=16)
def killed(tensors, path, metadata=None):
    open(path, "wb").write(bytes(1000))
    os.kill(os.getpid(), signal.SIGKILL)
hf_format.save_file = killed
hf_format.save_hf_folder(ZayaModel(config).state_dict(), config, {str(tmp_path / "hf")!r})
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == -9, err[-3000:]
    left = [n for n in os.listdir(tmp_path) if n.startswith(".hf.tmp")]
    assert len(left) == 1 and left[0].startswith(f".hf.tmp{proc.pid}-"), os.listdir(tmp_path)
    config = model_config_from_preset("zaya1-tiny", num_layers=1, hidden_size=32, num_attention_heads=2,
                                      num_query_groups=2, kv_channels=16, vocab_size=128, num_experts=2,
                                      moe_ffn_hidden_size=32, router_hidden_size=8, seq_length=16)
    state = ZayaModel(config).state_dict()
    hf_format.save_hf_folder(state, config, tmp_path / "hf")     # just killed: left in place, and said so
    assert "left 1 temporary file(s)" in capsys.readouterr().err and left[0] in os.listdir(tmp_path)
    shutil.rmtree(tmp_path / "hf")
    folder = tmp_path / left[0]
    for path in [folder, *folder.iterdir()]:
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    hf_format.save_hf_folder(state, config, tmp_path / "hf")
    assert "removed 1 temporary file(s)" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["hf"]


def test_average_of_checkpoints_is_their_weighted_mean(ckpt_corpus, ckpt_cache, tmp_path, capsys):
    """`average`: the newest checkpoints of a --save folder (--last) or those given (--weights), as an
    HF folder holding the weighted mean of their weights: exactly the float64 mean (computed here
    independently) rounded once to fp32 (an fp32 accumulation differed in up to 38% of the elements);
    a different model is refused before any weight is read, and so is a non-empty output."""
    tool = convert_tool()
    save = str(tmp_path / "ckpt")
    train(flags(ckpt_corpus, 3, "--save", save, "--save-interval", "1", cache=ckpt_cache))
    states = [load_full_model_state(os.path.join(save, f"iter_{i:07d}"))[0] for i in (1, 2, 3)]
    def float64_mean_rounded(name, weights, chosen):
        return (sum(w * states[i][name].double() for w, i in zip(weights, chosen)) / sum(weights)).float()
    assert tool.main(["average", save, str(tmp_path / "last3"), "--last", "3", "--no-progress"]) == 0
    assert "the mean of iterations 1, 2, 3" in capsys.readouterr().out
    averaged, _ = load_hf_folder(tmp_path / "last3")
    for name, tensor in averaged.items():
        assert torch.equal(tensor, float64_mean_rounded(name, [1, 1, 1], [0, 1, 2])), name
    assert any(not torch.equal(states[1][k], states[2][k]) for k in averaged)      # the checkpoints differ
    given = [os.path.join(save, f"iter_{i:07d}") for i in (1, 3)]
    assert tool.main(["average", *given, str(tmp_path / "weighted"), "--weights", "1", "3", "--no-progress"]) == 0
    weighted, _ = load_hf_folder(tmp_path / "weighted")
    card = (tmp_path / "weighted" / "README.md").read_text()      # the model card says what was averaged
    assert "| trained | the mean of iterations 1, 3 (weights 0.25, 0.75) |" in card, card
    for name, tensor in weighted.items():
        assert torch.equal(tensor, float64_mean_rounded(name, [1, 3], [0, 2])), name
    # refusals: another model, a non-empty output, too few checkpoints for --last, a weight count
    other = str(tmp_path / "other")
    train(flags(ckpt_corpus, 1, "--save", other, "--num-layers", "1", cache=ckpt_cache))
    capsys.readouterr()
    assert tool.main(["average", given[0], other, str(tmp_path / "bad"), "--no-progress"]) == 1
    assert "its model differs" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert tool.main(["average", save, str(tmp_path / "last3"), "--last", "2"]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    # flag values are usage errors (exit status 2), a checkpoint problem's is 1
    assert tool.main(["average", save, str(tmp_path / "x"), "--last", "5"]) == 2
    assert "3 complete checkpoints, --last 5" in capsys.readouterr().err
    assert tool.main(["average", save, str(tmp_path / "x"), "--last", "0"]) == 2
    assert "3 complete checkpoints, --last 0 asks for at least one" in capsys.readouterr().err
    assert tool.main(["average", *given, str(tmp_path / "y"), "--weights", "1"]) == 2
    assert "--weights: 1 weights for 2 checkpoints" in capsys.readouterr().err
    assert tool.main(["average", *given, str(tmp_path / "y"), "--weights", "1", "-1"]) == 2
    assert "finite numbers >= 0 with a positive sum" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["5GB", "500MB", "2GiB", "3MiB", "7KiB", "12KB", "1.5KB", "2.5GB"])
def test_max_shard_size_units_are_transformers(text):
    """--max-shard-size reads KB/MB/GB as powers of 10 and KiB/MiB/GiB as powers of 2, as transformers'
    save_pretrained(max_shard_size=...) does: the reference is transformers.utils.hub.convert_file_size_to_int
    (exact; it takes whole numbers only, so a fraction is checked as fraction x its value for one unit)."""
    convert_file_size_to_int = pytest.importorskip("transformers.utils.hub").convert_file_size_to_int
    number, unit = float(text.rstrip("BGKMi")), text.lstrip("0123456789.")
    assert convert_tool().shard_size(text) == int(number * convert_file_size_to_int("1" + unit))
    if number.is_integer():
        assert convert_tool().shard_size(text) == convert_file_size_to_int(text)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_cast_export_keeps_the_balancing_biases_fp32(dtype, tmp_path):
    """to-hf --dtype bf16/fp16 casts the weights, not the router's balancing biases (their ~1e-3 updates on
    values near 0.1 are below bf16's resolution there). The reference is safetensors' own reader: the stored
    tensor is F32 and equals the model's biases exactly; the weights are in the export dtype."""
    from safetensors import safe_open

    from megatron_zaya.checkpoint.convert import save_model_as_checkpoint
    from megatron_zaya.config import model_config_from_preset
    from megatron_zaya.model import ZayaModel

    torch.manual_seed(0)
    config = model_config_from_preset("zaya1-tiny", num_layers=2)
    model = ZayaModel(config)
    with torch.no_grad():
        for block in model.layers:
            bias = block.moe.router.balancing_bias
            bias.copy_(0.1 + 1e-3 * torch.arange(bias.numel(), dtype=torch.float32) / 7)
    cast = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    assert any(not torch.equal(b.moe.router.balancing_bias.to(cast).float(), b.moe.router.balancing_bias)
               for b in model.layers)
    src, hf = str(tmp_path / "src"), str(tmp_path / "hf")
    save_model_as_checkpoint(model.state_dict(), config, src, iteration=1)
    assert convert_tool().main(["to-hf", src, hf, "--dtype", dtype, "--no-tokenizer", "--no-progress"]) == 0
    with safe_open(os.path.join(hf, "model.safetensors"), framework="pt") as f:
        for i, block in enumerate(model.layers):
            name = f"model.layers.{i}.mlp.gate.balancing_biases"
            assert f.get_slice(name).get_dtype() == "F32", name
            assert torch.equal(f.get_tensor(name), block.moe.router.balancing_bias.detach()), name
        assert f.get_tensor("model.embed_tokens.weight").dtype == cast


def test_a_reshard_with_context_parallelism_records_its_data_parallel_size(tmp_path):
    """reshard --world-size 8 --tensor-model-parallel-size 2 --context-parallel-size 2: the layout recorded in
    the metadata has data_parallel_size = world / (TP x CP) = 2 (Megatron's definition: CP ranks hold one
    replica's sequence shards), and the weights come back unchanged (exact)."""
    import json

    from megatron_zaya.checkpoint.convert import save_model_as_checkpoint
    from megatron_zaya.checkpoint.format import METADATA_FILE
    from megatron_zaya.config import model_config_from_preset
    from megatron_zaya.model import ZayaModel

    torch.manual_seed(0)
    config = model_config_from_preset("zaya1-tiny", num_layers=1)
    state = ZayaModel(config).state_dict()
    src, out = str(tmp_path / "src"), str(tmp_path / "tp2cp2")
    save_model_as_checkpoint(state, config, src, iteration=3)
    assert convert_tool().main(["reshard", src, out, "--tensor-model-parallel-size", "2",
                                "--context-parallel-size", "2", "--world-size", "8", "--no-progress"]) == 0
    layout = json.load(open(os.path.join(out, "iter_0000003", METADATA_FILE)))["layout"]
    assert layout["world_size"] == 8 and layout["tensor_model_parallel_size"] == 2
    assert layout["context_parallel_size"] == 2 and layout["data_parallel_size"] == 8 // (2 * 2)
    _same(load_full_model_state(out)[0], state)


def test_a_sharded_export_says_each_file_written_with_the_time_left(tmp_path):
    """ConversionProgress.wrote_file, through save_hf_folder's on_file: one line per weight file, in order, with
    the count and an estimate of the time left (a 17 GB export writes for minutes)."""
    import io

    from megatron_zaya.checkpoint import hf_format
    from megatron_zaya.checkpoint.convert import ConversionProgress
    from megatron_zaya.config import model_config_from_preset
    from megatron_zaya.model import ZayaModel

    config = model_config_from_preset("zaya1-tiny", num_layers=2, hidden_size=32, num_attention_heads=2,
                                      num_query_groups=2, kv_channels=16, vocab_size=128, num_experts=2,
                                      moe_ffn_hidden_size=32, router_hidden_size=8, seq_length=16)
    stream = io.StringIO()
    progress = ConversionProgress(stream)
    hf_format.save_hf_folder(ZayaModel(config).state_dict(), config, tmp_path / "hf", max_shard_bytes=20_000,
                             on_file=progress.wrote_file)
    files = sorted(n for n in os.listdir(tmp_path / "hf") if n.endswith(".safetensors"))
    lines = [line for line in stream.getvalue().splitlines() if "] wrote " in line]
    assert len(files) > 2 and len(lines) == len(files)
    for done, (line, name) in enumerate(zip(lines, files), 1):
        assert f"wrote {name} ({done}/{len(files)} files, ~" in line and line.endswith(" s left)")
