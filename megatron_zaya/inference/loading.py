"""One entry point to load any checkpoint for single-process inference or evaluation.

    model, config, info = load_model_for_inference("path/to/checkpoint", device="cpu", dtype=None)

Accepted today:
- a Hugging Face ZAYA folder: config.json + model.safetensors (megatron_zaya.checkpoint.hf_format),
  or config.json + model.safetensors.index.json with sharded model-*.safetensors files;
- anything `megatron_zaya.checkpoint.load_full_model_state(path) -> (state_dict, ModelConfig, info)`
  accepts (megatron-zaya's own sharded checkpoints, any parallel layout), when that function exists.
`dtype` (e.g. torch.bfloat16; default: the stored dtype) casts the parameters except the router's, which computes in fp32 by
design (spec section 3; its balancing biases are fp32 buffers); the model then runs under autocast
to that dtype, as in bf16 training (fp32 residual stream, norms and router): decode and evaluation
enter `inference_autocast(model)` themselves.
"""
from __future__ import annotations

from pathlib import Path

import torch

from megatron_zaya.checkpoint import hf_format
from megatron_zaya.config import ModelConfig
from megatron_zaya.errors import hub_name_hint
from megatron_zaya.model import ZayaModel

class CheckpointLoadError(ValueError):
    """The path is not a checkpoint this loader understands; the message names the path."""


def load_state(path) -> tuple[dict, ModelConfig, dict]:
    """(state dict on CPU, ModelConfig, info) for any supported checkpoint; nothing is built."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such checkpoint (file or folder)" + hub_name_hint(path))
    if path.is_dir() and hf_format.is_hf_folder(path):
        state, config = hf_format.load_hf_folder(path)
        return state, config, {"format": "huggingface", "path": str(path)}
    try:
        from megatron_zaya.checkpoint import load_full_model_state
    except ImportError:
        load_full_model_state = None
    if load_full_model_state is None:
        raise CheckpointLoadError(
            f"{path}: not a Hugging Face ZAYA folder (config.json + model.safetensors) and this build has no "
            f"loader for megatron-zaya checkpoints (megatron_zaya.checkpoint.load_full_model_state)")
    state, config, info = load_full_model_state(str(path))
    info = dict(info or {})
    info.setdefault("format", "megatron-zaya")
    info.setdefault("path", str(path))
    return state, config, info


def build_model(state: dict, config: ModelConfig, device="cpu", dtype: torch.dtype | None = None) -> ZayaModel:
    """A ZayaModel in eval mode holding `state` (strict: every parameter and buffer must be there)."""
    with torch.device("meta"):
        model = ZayaModel(config)
    missing, unexpected = [], []
    expected = set(model.state_dict())
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        raise CheckpointLoadError(f"checkpoint does not match the model built from its config: "
                                  f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                                  f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")
    model.load_state_dict(state, strict=True, assign=True)
    model.to(device)
    # Weights in `dtype` (default: as stored), except the router's: it computes in fp32 by design.
    target = dtype or state["embedding.weight"].dtype
    router_params = {id(p) for block in model.layers for p in block.moe.router.parameters()}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            want = torch.float32 if id(param) in router_params else target
            if param.dtype != want:
                setattr(module, name, torch.nn.Parameter(param.data.to(want), requires_grad=False))
    for buffer_owner in model.modules():
        for name, buf in buffer_owner.named_buffers(recurse=False):
            if buf.is_floating_point() and buf.dtype != torch.float32:
                setattr(buffer_owner, name, buf.float())
    for param in model.parameters():
        param.requires_grad_(False)
    return model.eval()


def compute_dtype(model: ZayaModel) -> torch.dtype:
    """The dtype the model's matmuls run in: that of its (non-router) weights."""
    return model.embedding.weight.dtype


def inference_autocast(model: ZayaModel):
    """Autocast to the model's weight dtype when it is a half-precision one (a no-op context for fp32 and fp64
    models: autocast has no fp64 and would warn on every call)."""
    dtype = compute_dtype(model)
    device_type = model.embedding.weight.device.type
    return torch.autocast(device_type=device_type, dtype=dtype, enabled=dtype in (torch.bfloat16, torch.float16))


def load_model_for_inference(path, device="cpu", dtype: torch.dtype | None = None
                             ) -> tuple[ZayaModel, ModelConfig, dict]:
    """(model in eval mode on `device`, its ModelConfig, info about the checkpoint)."""
    state, config, info = load_state(path)
    model = build_model(state, config, device, dtype)
    info = dict(info)
    info.setdefault("parameters", sum(p.numel() for p in model.parameters()))
    return model, config, info


DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


def parse_dtype(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    if name not in DTYPES:
        raise ValueError(f"--dtype={name}: choose one of {sorted(DTYPES)}")
    return DTYPES[name]
