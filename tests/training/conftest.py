"""A small tokenized corpus and SentencePiece tokenizer for training tests (built once per session)."""
import importlib.util
import json
import os

import pytest

from megatron_zaya.data.synthetic import TextGenerator

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_tool(name: str, argv: list[str]) -> int:
    spec = importlib.util.spec_from_file_location(f"_tool_{name}", os.path.join(ROOT, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    """(data prefix, tokenizer model path) of a ~400-document synthetic English corpus."""
    d = tmp_path_factory.mktemp("train_corpus")
    gen = TextGenerator(seed=11, lexicon_size=2000)
    with open(d / "docs.jsonl", "w", encoding="utf-8") as f:
        for _ in range(400):
            f.write(json.dumps({"text": gen.document(max_sentences=8)}) + "\n")
    assert run_tool("train_tokenizer", ["--input", str(d / "docs.jsonl"), "--vocab-size", "500",
                                        "--output-prefix", str(d / "sp"), "--num-threads", "1"]) == 0
    assert run_tool("preprocess_data", ["--input", str(d / "docs.jsonl"), "--output-prefix", str(d / "corpus"),
                                        "--tokenizer-type", "GPTSentencePieceTokenizer",
                                        "--tokenizer-model", str(d / "sp.model"), "--append-eod",
                                        "--workers", "1"]) == 0
    return str(d / "corpus_text_document"), str(d / "sp.model")
