"""save_hf_folder with a dtype: each weight is cast as its file is written (a bf16 export of an fp32 state holds
one file's copies beside the state, not the whole model's), the files are sized by the bytes written, and what
it writes is the state cast to the dtype (the balancing biases stay fp32)."""
import json
import weakref

import torch

from megatron_zaya.checkpoint import hf_format
from megatron_zaya.checkpoint.hf_format import load_hf_folder, save_hf_folder
from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel


def test_a_bf16_export_casts_one_file_at_a_time(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = ZayaModel(model_config_from_preset("zaya1-tiny", vocab_size=256, num_layers=2, hidden_size=32,
                                               num_attention_heads=4, num_query_groups=2, kv_channels=8))
    state = model.state_dict()
    bf16_bytes = sum(t.numel() * (4 if name.endswith("balancing_bias") else 2) for name, t in state.items())
    copies_alive_at_each_write, written = [], []
    real_save_file = hf_format.save_file

    def save_file(tensors, path, metadata=None):
        copies_alive_at_each_write.append(sum(ref() is not None for ref in written))
        written.extend(weakref.ref(t) for t in tensors.values() if t.dtype == torch.bfloat16)
        real_save_file(tensors, path, metadata=metadata)

    monkeypatch.setattr(hf_format, "save_file", save_file)
    save_hf_folder(state, model.config, tmp_path / "hf", dtype=torch.bfloat16, max_shard_bytes=bf16_bytes // 6)
    assert len(copies_alive_at_each_write) >= 6
    assert copies_alive_at_each_write == [0] * len(copies_alive_at_each_write)     # earlier files' copies freed
    index = json.loads((tmp_path / "hf" / hf_format.HF_INDEX).read_text())
    assert index["metadata"]["total_size"] == bf16_bytes
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    loaded, _ = load_hf_folder(tmp_path / "hf")
    assert set(loaded) == set(state)
    for name, t in state.items():
        want = t if name.endswith("balancing_bias") else t.to(torch.bfloat16)
        assert loaded[name].dtype == want.dtype and torch.equal(loaded[name], want), name
