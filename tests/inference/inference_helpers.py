"""Helpers for the inference tests: a tiny fp32 ZAYA model with every parameter perturbed
(so residual scales, conv biases, key temperatures and EDA gammas all matter), saved as a HF folder."""
import importlib.util
import os
import threading
import time

import pytest
import torch

from megatron_zaya.checkpoint.hf_format import save_hf_folder
from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_tool(name):
    """Import tools/<name>.py as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"_inference_tool_{name}", os.path.join(ROOT, "tools", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def trickle_request(conn) -> None:
    """Start a request on connected socket `conn` and send the rest of its header a byte every 0.3 s (a thread,
    until the connection fails): a client that no per-read timeout ever ends."""
    conn.sendall(b"PUT /api HTTP/1.1\r\nX-Slow: ")

    def trickle():
        try:
            while True:
                conn.sendall(b"a")
                time.sleep(0.3)
        except OSError:
            return

    threading.Thread(target=trickle, daemon=True).start()


def make_model(seed: int = 0, **overrides) -> ZayaModel:
    torch.manual_seed(seed)
    overrides.setdefault("num_layers", 3)
    config = model_config_from_preset("zaya1-tiny", **overrides)
    model = ZayaModel(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.add_(torch.randn_like(param) * (0.3 if param.dim() == 1 else 0.05))
        for block in model.layers:
            # Balanced enough that several experts and the skip class are used.
            block.moe.router.balancing_bias.copy_(torch.randn_like(block.moe.router.balancing_bias) * 0.05)
    for param in model.parameters():
        param.requires_grad_(False)
    return model




# Fixtures: test modules import them by name (no conftest.py here: tests/data imports its own
# `conftest` module by name, which a second conftest.py on sys.path would shadow).
@pytest.fixture(scope="module", autouse=True)
def one_cpu_thread():
    """These tests run many tiny ops: on a shared 2-core machine, intra-op threads only contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model():
    return make_model()


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory, tiny_model):
    folder = tmp_path_factory.mktemp("ckpt") / "hf"
    save_hf_folder(tiny_model.state_dict(), tiny_model.config, folder)
    return folder


@pytest.fixture(scope="session")
def sp_model(tmp_path_factory):
    """A 500-piece SentencePiece model trained on synthetic English (a smaller vocabulary than the
    tiny model's 8192 rows)."""
    import json

    from megatron_zaya.data.synthetic import TextGenerator
    d = tmp_path_factory.mktemp("sp")
    gen = TextGenerator(seed=5, lexicon_size=800)
    with open(d / "corpus.jsonl", "w", encoding="utf-8") as f:
        for _ in range(150):
            f.write(json.dumps({"text": gen.document(max_sentences=6)}) + "\n")
    tool = load_tool("train_tokenizer")
    assert tool.main(["--input", str(d / "corpus.jsonl"), "--vocab-size", "500", "--output-prefix",
                      str(d / "sp"), "--num-threads", "1"]) == 0
    return str(d / "sp.model")
