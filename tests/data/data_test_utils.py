"""Helpers shared by the data-pipeline tests (uniquely named: tests/ has several conftest.py)."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_tool(name):
    """Import tools/<name>.py as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"_tool_{name}", os.path.join(ROOT, "tools", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_preprocess(preprocess_tool, *args) -> int:
    """preprocess_data's main() on `args` (made strings, --no-progress added); checks that the tool gave the
    caller's SIGTERM handler back."""
    import signal

    before = signal.getsignal(signal.SIGTERM)
    rc = preprocess_tool.main([*map(str, args), "--no-progress"])
    assert signal.getsignal(signal.SIGTERM) is before
    return rc


def write_gpt2_bpe_files(texts, folder, vocab_size):
    """Train a byte-level BPE on `texts` (plus a few non-ASCII lines) and write it as GPT-2 does:
    folder/vocab.json + folder/merges.txt (with the '#version' header), <|endoftext|> = id 0."""
    from pathlib import Path

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(list(texts) + ["café naïve — “quotes” ünïcödé", "日本語のテキスト", "emoji 🙂🚀"], trainer)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    bpe.model.save(str(folder))
    assert (folder / "merges.txt").read_text(encoding="utf-8").startswith("#version")
    return folder / "vocab.json", folder / "merges.txt"
