"""Our ZAYA1 model against the transformers reference (ZayaForCausalLM, transformers 5.24.0).

Tolerance: fp32 logits must agree to max |diff| <= 1e-4 (observed ~1e-6: only op ordering differs)."""
import json
import os
import stat

import pytest
import torch

from megatron_zaya.checkpoint.hf_format import load_hf_folder, save_hf_folder
from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel

transformers = pytest.importorskip("transformers")

CONFIGS = {
    "hq8-hkv2-even": dict(num_layers=2, hidden_size=64, num_attention_heads=8, num_query_groups=2, kv_channels=16),
    "hq6-hkv3-odd-layers": dict(num_layers=3, hidden_size=48, num_attention_heads=6, num_query_groups=3,
                                kv_channels=8, num_experts=5),
    "hq4-hkv4-mha": dict(num_layers=1, hidden_size=32, num_attention_heads=4, num_query_groups=4, kv_channels=12,
                         rotary_percent=1.0, rotary_base=1e6, untie_embeddings_and_output_weights=True),
    "hq4-hkv1-mqa": dict(num_layers=5, hidden_size=40, num_attention_heads=4, num_query_groups=1, kv_channels=20,
                         num_experts=3, moe_ffn_hidden_size=24, router_hidden_size=8),
}


def randomized_model(overrides: dict, seed: int) -> ZayaModel:
    """A random-init model whose scales, biases, temperatures and balancing biases are perturbed too,
    so that a wrong mapping of any of them shows up."""
    torch.manual_seed(seed)
    config = model_config_from_preset("zaya1-tiny", vocab_size=256, **overrides)
    model = ZayaModel(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1:
                param.add_(0.2 * torch.randn_like(param))
        torch.nn.init.normal_(model.embedding.weight, 0.0, 1.0)   # tokens must differ more than biases
        for block in model.layers:   # a sharper router, so that tokens spread over several experts
            router = block.moe.router
            for linear in (router.down_proj, router.fc1, router.fc2, router.out_proj):
                torch.nn.init.normal_(linear.weight, 0.0, 2.0 / linear.in_features ** 0.5)
                if linear.bias is not None:
                    torch.nn.init.normal_(linear.bias, 0.0, 0.02)
        for block in model.layers:
            block.moe.router.balancing_bias.add_(0.05 * torch.randn(config.num_router_classes))
            # transformers sets the skip class's bias to its initial -1 when it loads a checkpoint (training
            # never moves it): perturbed, the two models would differ wherever a token is near skipping.
            block.moe.router.balancing_bias[-1] = config.skip_class_bias_init
    return model


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match_transformers(name, tmp_path):
    model = randomized_model(CONFIGS[name], seed=len(name)).eval()
    save_hf_folder(model.state_dict(), model.config, tmp_path / "hf")
    reference = transformers.ZayaForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    tokens = torch.randint(0, model.config.vocab_size, (3, 29), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(tokens).logits
        theirs = reference(tokens).logits
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() <= 1e-4
    # The routing must actually be exercised: several experts used, and logits not trivially equal.
    with torch.no_grad():
        used = torch.stack([r.counts for r in model(tokens).routing]).sum(0)
    assert (used[:-1] > 0).sum() >= 2
    assert ours.std() > 1e-3


def test_an_export_whose_skip_bias_transformers_would_reset_is_warned_of(tmp_path):
    """transformers loads every skip-class bias as -1 (above): an export of another value warns, naming it,
    and transformers indeed reads -1 there; the default -1 exports without a warning."""
    import warnings

    config = CONFIGS[sorted(CONFIGS)[0]]
    model = randomized_model(config, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save_hf_folder(model.state_dict(), model.config, tmp_path / "default")
    model.layers[0].moe.router.balancing_bias[-1] = -0.25
    with pytest.warns(UserWarning, match=r"1 router\(s\) have a skip-class balancing bias other than -1 \(e.g. "
                      r"layers.0.moe.router.balancing_bias\[-1\] = -0.25\)"):
        save_hf_folder(model.state_dict(), model.config, tmp_path / "hf")
    loaded = transformers.ZayaForCausalLM.from_pretrained(tmp_path / "hf")
    biases = [b for name, b in loaded.state_dict().items() if name.endswith("balancing_biases")]
    assert biases and float(biases[0][-1]) == -1.0


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_export_import_is_bit_identical(name, tmp_path):
    model = randomized_model(CONFIGS[name], seed=7)
    save_hf_folder(model.state_dict(), model.config, tmp_path / "hf")
    state, config = load_hf_folder(tmp_path / "hf")
    original = model.state_dict()
    assert set(state) == set(original)
    for key, tensor in original.items():
        assert state[key].dtype == tensor.dtype, key
        assert torch.equal(state[key], tensor), key
    rebuilt = ZayaModel(config)
    rebuilt.load_state_dict(state)
    tokens = torch.randint(0, config.vocab_size, (1, 11))
    with torch.no_grad():
        assert torch.equal(rebuilt(tokens).logits, model(tokens).logits)


def _edited_export(tmp_path, edit) -> tuple[ZayaModel, object]:
    """A random model exported, its config.json changed by `edit` (a function of the dict)."""
    model = randomized_model(CONFIGS["hq8-hkv2-even"], seed=3).eval()
    save_hf_folder(model.state_dict(), model.config, tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    return model, path


ROPE_EDITS = {
    "as exported": lambda hf: hf,
    # transformers' ZayaConfig then uses rope_theta 5e6 and partial_rotary_factor 0.5
    "no rope_parameters": lambda hf: {k: v for k, v in hf.items() if k != "rope_parameters"},
    # ... and its model rotates every channel (factor 1.0) when the hybrid entry names no factor
    "no partial_rotary_factor": lambda hf: {**hf, "rope_parameters": {"hybrid": {"rope_type": "default",
                                                                                "rope_theta": 1e4}}},
}


@pytest.mark.parametrize("edit", sorted(ROPE_EDITS))
def test_imported_config_reads_rope_as_transformers_does(edit, tmp_path):
    """A config.json written elsewhere may leave RoPE fields out: the imported model gives transformers'
    logits (to 1e-4) on the same folder (the defaults were 1e4 and 0.5, logits off by 0.04-0.15)."""
    _, path = _edited_export(tmp_path, ROPE_EDITS[edit])
    state, config = load_hf_folder(path.parent)
    ours = ZayaModel(config).eval()
    ours.load_state_dict(state)
    reference = transformers.ZayaForCausalLM.from_pretrained(path.parent, attn_implementation="eager").eval()
    tokens = torch.randint(0, config.vocab_size, (2, 23), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert (ours(tokens).logits - reference(tokens).logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("field, value, message", [
    ("layer_types", ["hybrid_sliding", "hybrid"], "sliding-window"),
    ("hidden_act", "gelu", "hidden_act 'gelu'"),
    ("rope_parameters", {"hybrid": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_type 'yarn'"),
    ("rope_parameters", {"hybrid": {"rope_type": "default"}}, "no rope_theta"),
])
def test_imported_config_refuses_what_the_model_cannot_run(field, value, message, tmp_path):
    """Settings transformers' Zaya model has and ours does not are refused naming config.json (a
    sliding-window layer imported silently as a full-attention one)."""
    from megatron_zaya.checkpoint.format import CheckpointError

    _, path = _edited_export(tmp_path, lambda hf: {**hf, field: value, "sliding_window": 8})
    with pytest.raises(CheckpointError, match=f"config.json: .*{message}"):
        load_hf_folder(path.parent)


def test_config_names_the_dtype_most_weights_were_written_in(tmp_path):
    """Without a dtype the weights are written as they are; config.json's torch_dtype says the dtype of the
    bulk of them (a --bf16 run's bf16 matrices beside fp32 norms: bfloat16, where it said float32)."""
    model = randomized_model(CONFIGS["hq4-hkv1-mqa"], seed=0)
    mixed = {k: v.to(torch.bfloat16) if v.ndim > 1 else v for k, v in model.state_dict().items()}
    for name, state, want in (("mixed", mixed, "bfloat16"), ("fp32", model.state_dict(), "float32")):
        save_hf_folder(state, model.config, tmp_path / name)
        assert json.loads((tmp_path / name / "config.json").read_text())["torch_dtype"] == want


def test_export_refuses_to_overwrite(tmp_path):
    model = randomized_model(CONFIGS["hq4-hkv1-mqa"], seed=0)
    target = tmp_path / "hf"
    target.mkdir()
    (target / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not empty"):
        save_hf_folder(model.state_dict(), model.config, target)
    assert (target / "precious.txt").read_text() == "keep me"


def test_export_is_readable_as_the_umask_allows(tmp_path):
    """Not the 0700 folder of mkdtemp and the 0600 files of safetensors: others on a cluster can read it."""
    model = randomized_model(CONFIGS["hq4-hkv1-mqa"], seed=0)
    old = os.umask(0o022)
    try:
        save_hf_folder(model.state_dict(), model.config, tmp_path / "hf", max_shard_bytes=50_000)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "hf").st_mode) == 0o755
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "hf").iterdir()}
    assert len(modes) > 3 and set(modes.values()) == {0o644}, modes


def test_sharded_export_loads_in_transformers_and_imports_back(tmp_path):
    """Past max_shard_bytes the folder holds model-0000i-of-0000N.safetensors and their index, as
    save_pretrained writes them: transformers loads it to the same logits, and load_hf_folder reads it
    back bit-identical. A shard the index names but the folder lacks is an error naming it."""
    from megatron_zaya.checkpoint.format import CheckpointError

    model = randomized_model(CONFIGS["hq6-hkv3-odd-layers"], seed=3).eval()
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    save_hf_folder(model.state_dict(), model.config, tmp_path / "hf", max_shard_bytes=total // 5)
    shards = sorted(p.name for p in (tmp_path / "hf").glob("model-*.safetensors"))
    assert len(shards) >= 5 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert not (tmp_path / "hf" / "model.safetensors").exists()
    reference = transformers.ZayaForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    tokens = torch.randint(0, model.config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (model(tokens).logits - reference(tokens).logits).abs().max().item() <= 1e-4
    state, _ = load_hf_folder(tmp_path / "hf")
    original = model.state_dict()
    assert set(state) == set(original) and all(torch.equal(state[k], original[k]) for k in original)
    (tmp_path / "hf" / shards[1]).unlink()
    with pytest.raises(CheckpointError, match=f"{shards[1]}: missing"):
        load_hf_folder(tmp_path / "hf")
