"""Conversion between megatron-zaya's model state and a Hugging Face `ZayaForCausalLM` folder
(config.json + model.safetensors), loadable by `transformers.ZayaForCausalLM.from_pretrained`.

The mapping is a plain name table; tensors are copied unchanged (layouts already agree). A model
larger than `max_shard_bytes` (5 GB by default) is written as transformers' `save_pretrained` does:
model-00001-of-0000N.safetensors ... with model.safetensors.index.json mapping each tensor to its
file; both forms are read (published checkpoints are sharded)."""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from megatron_zaya.checkpoint.format import CheckpointError
from megatron_zaya.config import ModelConfig
from megatron_zaya.errors import hub_name_hint
from megatron_zaya.leftovers import remove_leftovers
from megatron_zaya.paths import nearest_existing

HF_WEIGHTS = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 10 ** 9

_BLOCK_NAMES = {
    "input_norm.weight": "input_layernorm.weight",
    "attention.linear_q.weight": "self_attn.qkv_proj.q_proj.weight",
    "attention.linear_k.weight": "self_attn.qkv_proj.k_proj.weight",
    "attention.linear_v_current.weight": "self_attn.qkv_proj.v_proj_current.weight",
    "attention.linear_v_previous.weight": "self_attn.qkv_proj.v_proj_delayed.weight",
    "attention.conv_depthwise.weight": "self_attn.qkv_proj.conv_qk_depthwise.weight",
    "attention.conv_depthwise.bias": "self_attn.qkv_proj.conv_qk_depthwise.bias",
    "attention.conv_grouped.weight": "self_attn.qkv_proj.conv_qk_grouped.weight",
    "attention.conv_grouped.bias": "self_attn.qkv_proj.conv_qk_grouped.bias",
    "attention.key_temperature": "self_attn.qk_norm.temp",
    "attention.linear_proj.weight": "self_attn.o_proj.weight",
    "attention_residual.out_scale": "post_attention_residual_scale.hidden_states_scale",
    "attention_residual.out_bias": "post_attention_residual_scale.hidden_states_bias",
    "attention_residual.res_scale": "post_attention_residual_scale.residual_scale",
    "attention_residual.res_bias": "post_attention_residual_scale.residual_bias",
    "pre_mlp_norm.weight": "post_attention_layernorm.weight",
    "moe.router.down_proj.weight": "mlp.gate.down_proj.weight",
    "moe.router.down_proj.bias": "mlp.gate.down_proj.bias",
    "moe.router.eda_gamma": "mlp.gate.router_states_scale",
    "moe.router.norm.weight": "mlp.gate.router_mlp.norm.weight",
    "moe.router.fc1.weight": "mlp.gate.router_mlp.fc1.weight",
    "moe.router.fc1.bias": "mlp.gate.router_mlp.fc1.bias",
    "moe.router.fc2.weight": "mlp.gate.router_mlp.fc2.weight",
    "moe.router.fc2.bias": "mlp.gate.router_mlp.fc2.bias",
    "moe.router.out_proj.weight": "mlp.gate.router_mlp.out_proj.weight",
    "moe.router.balancing_bias": "mlp.gate.balancing_biases",
    "moe.experts.gate_up_weight": "mlp.experts.gate_up_proj",
    "moe.experts.down_weight": "mlp.experts.down_proj",
    "mlp_residual.out_scale": "post_mlp_residual_scale.hidden_states_scale",
    "mlp_residual.out_bias": "post_mlp_residual_scale.hidden_states_bias",
    "mlp_residual.res_scale": "post_mlp_residual_scale.residual_scale",
    "mlp_residual.res_bias": "post_mlp_residual_scale.residual_bias",
}
_TOP_NAMES = {
    "embedding.weight": "model.embed_tokens.weight",
    "input_scaling.scale": "model.input_hidden_states_scale",
    "input_scaling.bias": "model.input_hidden_states_bias",
    "final_norm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}


def ours_to_hf_name(name: str) -> str:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    prefix, index, rest = name.split(".", 2)
    if prefix != "layers" or rest not in _BLOCK_NAMES:
        raise KeyError(f"no Hugging Face name for parameter {name!r}")
    return f"model.layers.{index}.{_BLOCK_NAMES[rest]}"


def hf_to_ours_name(name: str) -> str:
    for ours, theirs in _TOP_NAMES.items():
        if name == theirs:
            return ours
    if name.startswith("model.layers."):
        index, rest = name[len("model.layers."):].split(".", 1)
        for ours, theirs in _BLOCK_NAMES.items():
            if rest == theirs:
                return f"layers.{index}.{ours}"
    raise KeyError(f"unknown Hugging Face ZAYA tensor {name!r}")


def hf_config_dict(config: ModelConfig, dtype: torch.dtype = torch.float32) -> dict:
    return {
        "architectures": ["ZayaForCausalLM"],
        "model_type": "zaya",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_query_groups,
        "head_dim": config.kv_channels,
        "moe_intermediate_size": config.moe_ffn_hidden_size,
        "num_experts": config.num_experts,
        "num_experts_per_tok": config.moe_router_topk,
        "router_hidden_size": config.router_hidden_size,
        "rms_norm_eps": config.norm_epsilon,
        "cca_time0": config.cca_depthwise_kernel,
        "cca_time1": config.cca_grouped_kernel,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_parameters": {"hybrid": {"rope_type": "default", "rope_theta": config.rotary_base,
                                       "partial_rotary_factor": config.rotary_percent}},
        "tie_word_embeddings": not config.untie_embeddings_and_output_weights,
        "initializer_range": config.init_method_std,
        "hidden_act": "silu",
        "torch_dtype": str(dtype).removeprefix("torch."),
        # Unknown without the tokenizer (hf_tokenizer.hf_token_ids fills them): null, not ZayaConfig's
        # defaults, which are ids of the published ZAYA1 vocabulary.
        "eos_token_id": None, "bos_token_id": None, "pad_token_id": None,
        # not transformers': the sequence length it was trained at, which our tools (evaluate.py) default to
        "training_seq_length": config.seq_length,
    }


# transformers' ZayaConfig for a config.json without rope_parameters.
HF_DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.5}


def rope_from_hf(hf: dict) -> tuple[float, float]:
    """(rotary_base, rotary_percent) as transformers' Zaya model reads them: rope_parameters["hybrid"] (or
    the dict itself when not nested), ZayaConfig's defaults when the config has none, and a partial
    rotary factor of 1.0 when a given entry leaves it out. ValueError for what our model cannot run."""
    params = hf.get("rope_parameters") or {"hybrid": HF_DEFAULT_ROPE}
    rope = params.get("hybrid", params)
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_type {rope['rope_type']!r}: only the default (unscaled) RoPE is supported")
    if "rope_theta" not in rope:
        raise ValueError("rope_parameters: no rope_theta for the 'hybrid' layers")
    return float(rope["rope_theta"]), float(rope.get("partial_rotary_factor", 1.0))


def model_config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("num_experts_per_tok", 1) != 1:
        raise ValueError("num_experts_per_tok must be 1 for ZAYA1")
    other_layers = sorted(set(hf.get("layer_types") or ["hybrid"]) - {"hybrid"})
    if other_layers:
        raise ValueError(f"layer_types {other_layers}: only 'hybrid' layers (full causal attention) are supported, "
                         f"not sliding-window ones")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf['hidden_act']!r}: the experts are SwiGLU (silu)")
    rotary_base, rotary_percent = rope_from_hf(hf)
    return ModelConfig(
        num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
        num_attention_heads=hf["num_attention_heads"], num_query_groups=hf["num_key_value_heads"],
        kv_channels=hf["head_dim"], vocab_size=hf["vocab_size"], moe_ffn_hidden_size=hf["moe_intermediate_size"],
        num_experts=hf["num_experts"], router_hidden_size=hf["router_hidden_size"], norm_epsilon=hf["rms_norm_eps"],
        cca_depthwise_kernel=hf.get("cca_time0", 2), cca_grouped_kernel=hf.get("cca_time1", 2),
        max_position_embeddings=hf["max_position_embeddings"], rotary_base=rotary_base, rotary_percent=rotary_percent,
        untie_embeddings_and_output_weights=not hf.get("tie_word_embeddings", True),
        init_method_std=hf.get("initializer_range", 0.02),
        make_vocab_size_divisible_by=1,
        seq_length=hf.get("training_seq_length") or min(4096, hf["max_position_embeddings"]),
    ).validate()


def process_umask() -> int:
    """This process's umask, read without changing it where Linux says it (os.umask sets one to read it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def readable_as_umask_allows(folder: Path) -> None:
    """A folder and its files with the modes a plain mkdir / open would have given them: mkdtemp makes the
    folder 0700 and safetensors writes 0600, which kept an export from the other users of a cluster."""
    mask = process_umask()
    os.chmod(folder, 0o777 & ~mask)
    for path in folder.iterdir():
        os.chmod(path, 0o666 & ~mask)


def check_new_output_folder(output_dir) -> None:
    """FileExistsError unless `output_dir` can be a new HF folder: absent or empty, under folders (not a file):
    checked before a conversion reads any weight, and again when it writes. A symlink is checked as the folder
    it names (where the write goes); one to a missing folder is refused (paths.DanglingLink), as training's
    output folders are."""
    output_dir = Path(output_dir)
    if output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
        raise FileExistsError(f"{output_dir}: exists and is not {'empty' if output_dir.is_dir() else 'a folder'}; "
                              f"refusing to overwrite")
    nearest_existing(output_dir)
    above = nearest_existing(os.path.dirname(os.path.realpath(output_dir)))
    if not os.path.isdir(above):
        raise FileExistsError(f"{output_dir}: {above} is a file, not a folder")


def _atomic_folder_write(output_dir: Path, write) -> None:
    """Write into a temporary sibling folder, then rename: never a half-written folder. Through a symlink (e.g.
    a link into scratch space on another mount) the folder it names is the one written, the temporary folder
    beside it (a rename within one file system), and the link stays."""
    check_new_output_folder(output_dir)
    output_dir = Path(os.path.realpath(output_dir))
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    # The process id in the name lets the next write find what a SIGKILLed one left (megatron_zaya.leftovers).
    remove_leftovers(str(output_dir.parent), re.compile(re.escape(f".{output_dir.name}.tmp") + r"(?P<pid>\d+)-\w+"),
                     str(output_dir))
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.tmp{os.getpid()}-", dir=output_dir.parent))
    try:
        write(tmp)
        readable_as_umask_allows(tmp)
        if output_dir.exists():
            output_dir.rmdir()
        os.replace(tmp, output_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)     # a failed write leaves nothing behind
        raise


def shard_files(sizes: dict[str, int], max_shard_bytes: int) -> dict[str, list[str]]:
    """File name -> tensor names, from each tensor's size in bytes as written: in order, each file filled up to
    max_shard_bytes (a larger tensor gets a file of its own); one file is model.safetensors, more are
    model-0000i-of-0000N.safetensors."""
    groups, size = [[]], 0
    for name, nbytes in sizes.items():
        if groups[-1] and size + nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    if len(groups) == 1:
        return {HF_WEIGHTS: groups[0]}
    return {f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors": names for i, names in enumerate(groups)}


def bulk_dtype(tensors: dict) -> torch.dtype:
    """The floating dtype holding most of the elements (config.json's torch_dtype for weights written as they
    are: a --bf16 run's bf16 matrices beside its fp32 norms read as bf16); fp32 when there are none."""
    elements: dict[torch.dtype, int] = {}
    for t in tensors.values():
        if t.is_floating_point():
            elements[t.dtype] = elements.get(t.dtype, 0) + t.numel()
    return max(elements, key=elements.get) if elements else torch.float32


def warn_of_skip_biases(state_dict: dict) -> None:
    """transformers' ZayaForCausalLM sets every router's skip-class balancing bias to -1 when it loads a
    checkpoint (its weight init runs on that buffer): a model whose skip bias is another value (the
    skip_class_bias_init config field; balancing never moves it) would route differently there."""
    other = {name: float(t[-1]) for name, t in state_dict.items()
             if name.endswith("balancing_bias") and float(t[-1]) != -1.0}
    if other:
        name, value = next(iter(other.items()))
        warnings.warn(f"{len(other)} router(s) have a skip-class balancing bias other than -1 (e.g. {name}[-1] = "
                      f"{value:g}); transformers' ZayaForCausalLM resets it to -1 when it loads the export, so the "
                      f"exported model skips tokens differently from this one", stacklevel=3)


def save_hf_folder(state_dict: dict, config: ModelConfig, output_dir, dtype: torch.dtype | None = None,
                   tokenizer=None, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                   extra_files: dict[str, str] | None = None, on_file=None) -> None:
    """Write config.json + model.safetensors (or shards and their index past `max_shard_bytes`) for
    transformers' ZayaForCausalLM; with `tokenizer` (one of ours) also its Hugging Face files and special
    token ids (checkpoint/hf_tokenizer.py); `extra_files` {name: text} too (e.g. the README.md model card).
    `on_file(done, total, name)` after each weight file is written (progress)."""
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes={max_shard_bytes} must be >= 1")
    warn_of_skip_biases(state_dict)
    # Each weight is cast to `dtype` as its file is written, not all up front: a bf16 export of an fp32 state
    # then holds one file's copies beside the state, not the whole model's (1.5x the fp32 model).
    tensors, dtypes = {}, {}
    for name, tensor in state_dict.items():
        hf_name = ours_to_hf_name(name)
        tensors[hf_name] = tensor.detach()
        cast = dtype is not None and tensor.is_floating_point() and not name.endswith("balancing_bias")
        dtypes[hf_name] = dtype if cast else tensor.dtype
    config_dict = hf_config_dict(config, dtype or bulk_dtype(tensors))
    text_files = {}       # the tokenizer's files and generation_config.json
    if tokenizer is not None:       # built before anything is written: a refusal leaves no folder
        from megatron_zaya.checkpoint.hf_tokenizer import hf_generation_config, hf_token_ids, hf_tokenizer_files
        text_files = hf_tokenizer_files(tokenizer)
        token_ids = hf_token_ids(tokenizer)
        config_dict.update(token_ids)
        generation = hf_generation_config(token_ids, tokenizer.vocab_size, config.vocab_size)
        text_files["generation_config.json"] = json.dumps(generation, indent=2) + "\n"

    sizes = {n: t.numel() * dtypes[n].itemsize for n, t in tensors.items()}
    files = shard_files(sizes, max_shard_bytes)

    def write(folder: Path) -> None:
        for done, (file, names) in enumerate(files.items(), 1):
            as_written = {n: tensors[n].to(device="cpu", dtype=dtypes[n]).contiguous() for n in names}
            save_file(as_written, str(folder / file), metadata={"format": "pt"})
            del as_written
            if on_file is not None:
                on_file(done, len(files), file)
        if len(files) > 1:
            total = sum(sizes.values())
            index = {"metadata": {"total_size": total},
                     "weight_map": {n: file for file, names in files.items() for n in names}}
            (folder / HF_INDEX).write_text(json.dumps(index, indent=2) + "\n")
        (folder / "config.json").write_text(json.dumps(config_dict, indent=2) + "\n")
        for name, text in {**text_files, **(extra_files or {})}.items():
            (folder / name).write_text(text, encoding="utf-8")

    _atomic_folder_write(Path(output_dir), write)


def is_hf_folder(path) -> bool:
    """A Hugging Face model folder: config.json and model.safetensors (or the index of its shards)."""
    path = Path(path)
    return (path / "config.json").is_file() and ((path / HF_WEIGHTS).is_file() or (path / HF_INDEX).is_file())


def read_hf_config(config_path) -> dict:
    """The JSON object in a Hugging Face config.json; CheckpointError naming the file if it is not one."""
    try:
        hf_config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{config_path}: not valid JSON ({err})") from err
    if not isinstance(hf_config, dict):
        raise CheckpointError(f"{config_path}: expected a JSON object, found {type(hf_config).__name__}")
    return hf_config


def config_from_hf_file(config_path) -> ModelConfig:
    """Our ModelConfig from a ZAYA config.json; CheckpointError naming the file when it is unusable."""
    hf_config = read_hf_config(config_path)
    if hf_config.get("model_type") != "zaya":
        raise CheckpointError(f"{config_path}: model_type is {hf_config.get('model_type')!r}, expected 'zaya'")
    try:
        return model_config_from_hf(hf_config)
    except KeyError as err:
        raise CheckpointError(f"{config_path}: missing field {err}") from err
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{config_path}: {err}") from err


def load_safetensors(path) -> dict:
    """load_file(path), with a damaged file (truncated, bad header) reported as a CheckpointError naming it."""
    try:
        return load_file(str(path))
    except SafetensorError as err:
        raise CheckpointError(f"{path}: unreadable safetensors file ({err})") from err


def hf_weight_files(folder: Path) -> dict[str, list[str] | None]:
    """The safetensors files of a ZAYA folder -> the tensor names the index puts in each (None: the
    single model.safetensors, whose names are all taken). CheckpointError naming a bad index."""
    if (folder / HF_WEIGHTS).is_file():
        return {HF_WEIGHTS: None}
    index_path = folder / HF_INDEX
    if not index_path.is_file():
        raise FileNotFoundError(f"{folder / HF_WEIGHTS}: missing, and no {HF_INDEX} (expected a Hugging Face "
                                f"ZAYA folder)")
    try:
        weight_map = json.loads(index_path.read_text(encoding="utf-8")).get("weight_map")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
        raise CheckpointError(f"{index_path}: not a JSON object ({err})") from err
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise CheckpointError(f"{index_path}: no 'weight_map' of tensor names to file names")
    files: dict[str, list[str]] = {}
    for name, file in weight_map.items():
        files.setdefault(file, []).append(name)
    for file in files:
        if not (folder / file).is_file():
            raise CheckpointError(f"{folder / file}: missing (listed in {HF_INDEX})")
    return files


def hf_folder_config(folder) -> ModelConfig:
    """The ModelConfig of a ZayaForCausalLM folder's config.json (FileNotFoundError when it has none)."""
    config_path = Path(folder) / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: missing (expected a Hugging Face ZAYA folder)" + hub_name_hint(folder))
    return config_from_hf_file(config_path)


def load_hf_folder(folder) -> tuple[dict, ModelConfig]:
    """Read a ZayaForCausalLM folder (one model.safetensors, or shards with their index) into (our state
    dict, our ModelConfig)."""
    folder = Path(folder)
    config = hf_folder_config(folder)
    files = hf_weight_files(folder)
    state = {}
    for file, names in files.items():
        tensors = load_safetensors(folder / file)
        missing = [n for n in names or () if n not in tensors]
        if missing:
            raise CheckpointError(f"{folder / file}: has no tensor {missing[0]!r} ({HF_INDEX} puts it there)")
        for name in names or tensors:
            if name == "lm_head.weight" and not config.untie_embeddings_and_output_weights:
                continue  # tied to the embedding
            state[hf_to_ours_name(name)] = tensors[name]
    return state, config
