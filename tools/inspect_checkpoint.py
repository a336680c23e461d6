"""What a checkpoint holds, without loading any tensor onto a device (nor into memory).

    python tools/inspect_checkpoint.py CKPT            # human-readable report
    python tools/inspect_checkpoint.py CKPT --json     # the same as JSON
    python tools/inspect_checkpoint.py CKPT --tensors  # also list every tensor
    python tools/inspect_checkpoint.py CKPT --all      # every rank and file of a checkpoint of many ranks

CKPT is a Hugging Face ZAYA folder (config.json + model.safetensors, or a sharded
model.safetensors.index.json) or a megatron-zaya checkpoint (an iter_NNNNNNN folder or the --save
folder; reported by megatron_zaya.checkpoint.inspect_checkpoint when that package provides it).

For Hugging Face folders it reads only the safetensors headers: the config (as our ModelConfig),
every tensor's name, shape, dtype and bytes, and an integrity check of every file (the header
parses, every tensor's byte range matches its shape and dtype and lies inside the file, ranges do
not overlap, and the file length is exactly the header's end offset; for sharded folders, every
tensor of the index is in the shard it names). Iteration and tokens seen are not stored there.
Exit status 0 when the checkpoint is intact, 1 when a problem was found, 2 on usage errors.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_zaya.units import human_bytes  # noqa: E402  (torch-free, as this tool's top level)
from megatron_zaya.interrupts import quiet_when_the_reader_leaves  # noqa: E402

BUFFER_SUFFIXES = ("balancing_bias", "balancing_biases")     # the routers' buffer (ours, HF), not a parameter

SAFETENSORS_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
                           "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
HF_WEIGHTS, HF_INDEX = "model.safetensors", "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024


def read_safetensors_header(path: str) -> tuple[dict, list[str]]:
    """({name: {dtype, shape, bytes, offsets}}, problems) from a .safetensors file's header only."""
    problems: list[str] = []
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            return {}, [f"{path}: {size} bytes, too short for a safetensors header"]
        (header_len,) = struct.unpack("<Q", raw)
        if header_len > min(size - 8, MAX_HEADER_BYTES):
            return {}, [f"{path}: header length {header_len} does not fit the file ({size} bytes)"]
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            return {}, [f"{path}: header is not valid JSON ({err})"]
    if not isinstance(header, dict):
        return {}, [f"{path}: header is not a JSON object"]
    data_bytes = size - 8 - header_len
    tensors, ranges = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], [int(d) for d in entry["shape"]], entry["data_offsets"]
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in (begin, end)):
                raise TypeError("data_offsets must be integers")
        except (KeyError, TypeError, ValueError):
            problems.append(f"{path}: tensor {name!r}: malformed header entry {entry!r}")
            continue
        numel = 1
        for d in shape:
            numel *= d
        want = numel * SAFETENSORS_DTYPE_BYTES.get(dtype, 0)
        if dtype not in SAFETENSORS_DTYPE_BYTES:
            problems.append(f"{path}: tensor {name!r}: unknown dtype {dtype}")
        elif end - begin != want:
            problems.append(f"{path}: tensor {name!r}: {end - begin} bytes for shape {shape} {dtype} ({want} expected)")
        if not 0 <= begin <= end <= data_bytes:
            problems.append(f"{path}: tensor {name!r}: bytes [{begin}, {end}) outside the data ({data_bytes} bytes)")
        tensors[name] = {"dtype": dtype, "shape": shape, "bytes": end - begin, "offsets": [begin, end]}
        ranges.append((begin, end, name))
    ranges.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(ranges, ranges[1:]):
        if b1 < e0:
            problems.append(f"{path}: tensors {n0!r} and {n1!r} overlap")
    end_offset = max((e for _, e, _ in ranges), default=0)
    if end_offset != data_bytes:
        problems.append(f"{path}: file is {size} bytes but the header ends its data at {8 + header_len + end_offset} "
                        f"({'truncated' if end_offset > data_bytes else 'trailing bytes'})")
    return tensors, problems


def inspect_hf_folder(folder: str) -> dict:
    from megatron_zaya.checkpoint.format import CheckpointError
    from megatron_zaya.checkpoint.hf_format import hf_to_ours_name, model_config_from_hf, read_hf_config
    from megatron_zaya.config import ConfigError

    report = {"format": "huggingface", "folder": os.path.abspath(folder), "iteration": None, "tokens_seen": None,
              "files": {}, "problems": [], "tensors": {}}
    config_path = os.path.join(folder, "config.json")
    try:
        hf_config = read_hf_config(config_path)
        report["hf_config"] = hf_config
        report["model_config"] = model_config_from_hf(hf_config).to_dict()
        report["files"]["config.json"] = "ok"
    except (OSError, ValueError, KeyError, TypeError, CheckpointError, ConfigError) as err:
        report["files"]["config.json"] = f"unreadable: {err}"
        report["problems"].append(str(err) if str(err).startswith(config_path) else f"{config_path}: {err!r}")
    index_path = os.path.join(folder, HF_INDEX)
    expected: dict[str, str] | None = None
    if os.path.isfile(os.path.join(folder, HF_WEIGHTS)):
        shards = [HF_WEIGHTS]
    else:
        try:
            with open(index_path, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError(f"'weight_map' is {type(weight_map).__name__}, expected an object")
            expected = weight_map
            shards = sorted(set(expected.values()))
            report["files"][HF_INDEX] = "ok"
        except (OSError, ValueError, KeyError, TypeError) as err:
            report["problems"].append(f"{folder}: no {HF_WEIGHTS} and no readable {HF_INDEX} ({err!r})")
            shards = []
    for shard in shards:
        path = os.path.join(folder, shard)
        if not os.path.isfile(path):
            report["files"][shard] = "missing"
            report["problems"].append(f"{path}: missing")
            continue
        tensors, problems = read_safetensors_header(path)
        report["files"][shard] = "ok" if not problems else f"corrupt: {problems[0]}"
        report["problems"] += problems
        for name, entry in tensors.items():
            entry["file"] = shard
            report["tensors"][name] = entry
    if expected is not None:
        for name, shard in expected.items():
            if report["tensors"].get(name, {}).get("file") != shard:
                report["problems"].append(f"{os.path.join(folder, shard)}: tensor {name!r} listed in {HF_INDEX} "
                                          f"is not in that file")
    unknown = []
    for name in report["tensors"]:
        try:
            hf_to_ours_name(name)
        except KeyError:
            unknown.append(name)
    if unknown:
        report["problems"].append(f"{folder}: tensors that are not ZAYA parameters: {unknown[:5]}")
    report["parameters"] = sum(_numel(e["shape"]) for k, e in report["tensors"].items()
                               if not k.endswith(BUFFER_SUFFIXES))
    sizes = {shard: os.path.getsize(os.path.join(folder, shard)) for shard in shards
             if os.path.isfile(os.path.join(folder, shard))}
    report["ranks"] = [{"rank": "single (unsharded model)", "bytes": sum(sizes.values()), "files": sizes}]
    report["total_bytes"] = sum(sizes.values())
    report["layout"] = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                        "expert_model_parallel_size": 1, "note": "Hugging Face folders hold the full model"}
    report["ok"] = not report["problems"]
    return report


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def inspect_any(path: str) -> dict:
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such checkpoint (file or folder)")
    if os.path.isfile(os.path.join(path, "config.json")) and (
            os.path.isfile(os.path.join(path, HF_WEIGHTS)) or os.path.isfile(os.path.join(path, HF_INDEX))):
        return inspect_hf_folder(path)
    try:
        from megatron_zaya.checkpoint import inspect_checkpoint
    except ImportError:
        raise ValueError(f"{path}: not a Hugging Face ZAYA folder (config.json + {HF_WEIGHTS}) and this build has "
                         f"no inspector for megatron-zaya checkpoints (megatron_zaya.checkpoint.inspect_checkpoint)")
    report = dict(inspect_checkpoint(path))
    report.setdefault("format", "megatron-zaya")
    return report


LIST_AT_MOST = 16       # ranks and files listed one per line up to this many (more: a summary, --all)


def print_report(report: dict, show_tensors: bool, all_lines: bool = False) -> None:
    print(f"checkpoint:  {report.get('folder')}  [{report.get('format')}]")
    print(f"status:      {'OK' if report.get('ok') else 'PROBLEMS FOUND'}")
    for key in ("iteration", "consumed_samples", "tokens_seen", "saved_at", "format_version", "complete"):
        if key in report:
            print(f"{key + ': ':<13}{report[key] if report[key] is not None else '(not recorded)'}")
    if report.get("layout"):
        print("layout:      " + ", ".join(f"{k}={v}" for k, v in report["layout"].items()))
    if report.get("model_config"):
        cfg = report["model_config"]
        print("model:       " + ", ".join(f"{k}={cfg[k]}" for k in (
            "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "num_experts",
            "moe_ffn_hidden_size", "vocab_size") if k in cfg))
    if report.get("tokenizer"):
        print(f"tokenizer:   {report['tokenizer']}")
    if "parameters" in report:
        print(f"parameters:  {report['parameters']:,}")
    holds = report.get("holds")
    if holds:       # (our format: what a resume finds)
        parts = ["model weights"] + [name for key, name in (("optimizer", "optimizer state"), ("rng", "RNG state"))
                                     if holds[key]]
        origin = f" (converted from {holds['converted_from']})" if holds.get("converted_from") else ""
        print(f"holds:       {', '.join(parts)}{' only' if len(parts) == 1 else ''}{origin}")
    print(f"total size:  {human_bytes(report.get('total_bytes'))}")
    ranks = report.get("ranks", [])
    if len(ranks) > LIST_AT_MOST and not all_lines:      # a cluster's checkpoint: how even the ranks are
        sizes = sorted(ranks, key=lambda r: r["bytes"] if r["bytes"] is not None else -1)
        if sizes:
            print(f"  {len(ranks):,} ranks: smallest {human_bytes(sizes[0]['bytes'])} (rank {sizes[0]['rank']}), "
                  f"largest {human_bytes(sizes[-1]['bytes'])} (rank {sizes[-1]['rank']})")
    else:
        for rank in ranks:
            print(f"  rank {rank['rank']}: {human_bytes(rank['bytes'])}")
    files = sorted(report.get("files", {}).items())
    shown = files if len(files) <= LIST_AT_MOST or all_lines else [(n, s) for n, s in files if s != "ok"]
    print("files:" + ("" if shown is files else f" {len(files) - len(shown):,} of {len(files):,} ok"
                      + (", the others:" if shown else "")))
    for name, status in shown:
        print(f"  {name:<40} {status}")
    if show_tensors and report.get("tensors"):
        print("tensors:")
        for name, entry in report["tensors"].items():
            if isinstance(entry, dict):
                print(f"  {name:<64} {str(entry['shape']):<20} {entry['dtype']:<5} {human_bytes(entry['bytes'])}")
            else:
                print(f"  {name:<64} {list(entry)}")
    for problem in report.get("problems", []):
        print(f"PROBLEM: {problem}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="checkpoint folder")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--tensors", action="store_true", help="list every tensor (name, shape, dtype, bytes)")
    parser.add_argument("--all", action="store_true",
                        help=f"list every rank and file even when there are more than {LIST_AT_MOST} "
                             f"(otherwise: the smallest and largest rank, and the files not ok)")
    args = parser.parse_args(argv)
    try:
        report = inspect_any(args.path)
    except (OSError, ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print_report(report, args.tensors, args.all)
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(quiet_when_the_reader_leaves(main))
