"""tools/inspect_checkpoint.py on Hugging Face folders: config, tensors from the header, integrity."""
import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from megatron_zaya.checkpoint.hf_format import save_hf_folder

from inference_helpers import hf_checkpoint, load_tool, one_cpu_thread, tiny_model  # noqa: F401 (fixtures)

TOOL = load_tool("inspect_checkpoint")


def copy_folder(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_reports_config_tensors_and_sizes(hf_checkpoint, tiny_model, capsys):
    report = TOOL.inspect_any(str(hf_checkpoint))
    assert report["ok"] and report["problems"] == []
    assert report["model_config"]["num_layers"] == tiny_model.config.num_layers
    state = tiny_model.state_dict()
    assert report["parameters"] == sum(p.numel() for p in tiny_model.parameters())     # not the routers' buffers
    emb = report["tensors"]["model.embed_tokens.weight"]
    assert emb["shape"] == list(state["embedding.weight"].shape) and emb["dtype"] == "F32"
    assert emb["bytes"] == state["embedding.weight"].numel() * 4
    weights = hf_checkpoint / "model.safetensors"
    assert report["total_bytes"] == weights.stat().st_size
    assert TOOL.main([str(hf_checkpoint), "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "status:      OK" in out and "model.layers.0.self_attn.o_proj.weight" in out
    assert TOOL.main([str(hf_checkpoint), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_detects_truncated_and_corrupt_headers(hf_checkpoint, tmp_path, capsys):
    truncated = copy_folder(hf_checkpoint, tmp_path / "truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[:-100])
    report = TOOL.inspect_any(str(truncated))
    assert not report["ok"] and any("truncated" in p for p in report["problems"])
    assert TOOL.main([str(truncated)]) == 1
    assert "PROBLEM" in capsys.readouterr().out

    garbage = copy_folder(hf_checkpoint, tmp_path / "garbage")
    (garbage / "model.safetensors").write_bytes(struct.pack("<Q", 20) + b"{not json at all....." + data[29:])
    report = TOOL.inspect_any(str(garbage))
    assert not report["ok"] and "not valid JSON" in report["problems"][0]

    lying = copy_folder(hf_checkpoint, tmp_path / "lying")
    header_len = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + header_len])
    name = "model.embed_tokens.weight"
    header[name]["shape"] = [header[name]["shape"][0] + 1] + header[name]["shape"][1:]
    new_header = json.dumps(header).encode()
    (lying / "model.safetensors").write_bytes(struct.pack("<Q", len(new_header)) + new_header + data[8 + header_len:])
    report = TOOL.inspect_any(str(lying))
    assert not report["ok"] and any(name in p and "expected" in p for p in report["problems"])


def test_sharded_folder_and_index_consistency(tiny_model, tmp_path):
    folder = tmp_path / "full"
    save_hf_folder(tiny_model.state_dict(), tiny_model.config, folder)
    from safetensors.torch import load_file
    tensors = load_file(str(folder / "model.safetensors"))
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_bytes((folder / "config.json").read_bytes())
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for shard, shard_names in halves.items():
        save_file({n: tensors[n] for n in shard_names}, str(sharded / shard))
        weight_map.update({n: shard for n in shard_names})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    report = TOOL.inspect_any(str(sharded))
    assert report["ok"], report["problems"]
    assert len(report["tensors"]) == len(tensors)
    # The loader reads the sharded folder into the same model.
    from megatron_zaya.inference.loading import load_model_for_inference
    model, _, _ = load_model_for_inference(sharded)
    tokens = torch.randint(0, 1000, (1, 12))
    torch.testing.assert_close(model(tokens).logits, tiny_model(tokens).logits, rtol=0, atol=0)
    # An index naming the wrong shard is reported.
    weight_map[names[0]] = "model-00002-of-00002.safetensors"
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    report = TOOL.inspect_any(str(sharded))
    assert not report["ok"] and any(names[0] in p for p in report["problems"])


def test_not_a_checkpoint_is_a_clear_error(tmp_path, capsys):
    assert TOOL.main([str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err


def test_a_checkpoint_of_many_ranks_is_summarised_unless_all(capsys):
    """1,024 ranks would print 3,000 lines: the smallest and largest rank, and the files not ok; --all lists all."""
    report = {"folder": "ckpt/iter_0000010", "format": "megatron-zaya", "ok": False, "total_bytes": 40 << 20,
              "ranks": [{"rank": r, "bytes": (1 << 20) + 1000 * ((r * 7) % 40)} for r in range(40)],
              "files": {**{f"rank_{r:05d}.json": "ok" for r in range(40)}, "rank_00003.safetensors": "corrupt"}}
    TOOL.print_report(report, False)
    out = capsys.readouterr().out
    assert "40 ranks: smallest 1.00 MiB (rank 0), largest 1.04 MiB (rank 17)" in out
    assert "files: 40 of 41 ok, the others:" in out and "rank_00003.safetensors" in out
    assert "rank_00001.json" not in out and "rank 5:" not in out
    TOOL.print_report(report, False, all_lines=True)
    out = capsys.readouterr().out
    assert "rank 5: " in out and "rank_00001.json" in out and out.count("\n  rank_") == 41
