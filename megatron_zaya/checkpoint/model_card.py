"""The README.md of a Hugging Face export: what the model is and where it comes from.

convert_checkpoint.py to-hf and average write it beside config.json: the architecture and parameter
counts (model/accounting.py), the training run's position (iteration, tokens seen, or the averaged
iterations), its data and tokenizer flags as that run recorded them (checkpoint metadata "args"), the
checkpoint it was read from, the dtype of the stored weights, and how to load it with transformers.
Facts only: nothing is claimed about quality.
"""
from __future__ import annotations

import datetime

import torch

from megatron_zaya.config import ModelConfig
from megatron_zaya.data.tokenizer import flags_text, tokenizer_flags
from megatron_zaya.model.accounting import count_parameters

DATA_ARGS = ("data_path", "train_data_path", "valid_data_path", "test_data_path", "split", "seq_length")


def _billions(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _data_flags(args: dict) -> str:
    words = []
    for name in DATA_ARGS:
        value = args.get(name)
        if value not in (None, [], ""):
            shown = " ".join(map(str, value)) if isinstance(value, list) else value
            words.append(f"--{name.replace('_', '-')} {shown}")
    return " ".join(words)


def model_card(config: ModelConfig, metas: list[dict], sources: list[str], weights: list[float] | None,
               dtype: torch.dtype, tokenizer_written: bool) -> str:
    """The card of a model exported from the checkpoints `sources` (their metadata `metas`; several:
    their mean with `weights`) with its weights stored in `dtype`."""
    counts = count_parameters(config)
    active = counts.active_non_embedding(config.num_experts)
    meta, args = metas[-1], metas[-1].get("args") or {}
    if len(metas) == 1:
        tokens = meta.get("tokens_seen")
        trained = f"iteration {meta.get('iteration')}" + (f", {tokens:,} tokens seen" if tokens else "")
        source = f"`{sources[0]}`" + (f" (saved {meta['saved_at']})" if meta.get("saved_at") else "")
    else:
        trained = "the mean of iterations " + ", ".join(str(m.get("iteration")) for m in metas) + (
            f" (weights {', '.join(f'{w:.4g}' for w in weights)})" if weights else "")
        source = ", ".join(f"`{s}`" for s in sources)
    data, tokenizer = _data_flags(args), flags_text(tokenizer_flags(args))
    stored = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))
    rows = [
        ("parameters", f"{_billions(counts.total)} in total, {_billions(active + counts.embedding)} active per token "
                       f"({_billions(counts.non_embedding)} / {_billions(active)} without the embedding)"),
        ("layers, hidden size", f"{config.num_layers}, {config.hidden_size}"),
        ("attention", f"CCA, {config.num_attention_heads} query heads and {config.num_query_groups} KV heads of "
                      f"{config.kv_channels}"),
        ("experts", f"{config.num_experts} + a skip class, top-1, FFN {config.moe_ffn_hidden_size}"),
        ("vocabulary, context",
         f"{config.vocab_size:,}, {config.seq_length:,} tokens (RoPE base {config.rotary_base:g})"),
        ("trained", trained),
        ("data", f"`{data}`" if data else "not recorded"),
        ("tokenizer", (f"`{tokenizer}`" if tokenizer else "not recorded")
         + ("" if tokenizer_written else " (no tokenizer files in this folder)")),
        ("exported from", source),
        ("weights", f"{stored}, exported {datetime.date.today().isoformat()}"),
    ]
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    load = ("from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            + ("tokenizer = AutoTokenizer.from_pretrained(PATH)\n" if tokenizer_written else "")
            + "model = AutoModelForCausalLM.from_pretrained(PATH)")
    return (f"---\nlibrary_name: transformers\npipeline_tag: text-generation\ntags:\n- zaya\n- mixture-of-experts\n"
            f"- megatron-zaya\n---\n\n# ZAYA-style MoE language model\n\n"
            f"A ZAYA1-style Mixture-of-Experts model (Compressed Convolutional Attention, the ZAYA1 router, learned "
            f"residual scaling) pretrained with megatron-zaya and exported by `tools/convert_checkpoint.py`.\n\n"
            f"| | |\n|---|---|\n{table}\n\n## Use\n\n```python\n{load}\n```\n")
