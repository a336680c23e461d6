"""Shared fixtures for the data-pipeline tests: small generated corpora and tokenizers."""

import json
import os
import sys

import pytest

from megatron_zaya.data.synthetic import TextGenerator

from data_test_utils import load_tool, write_gpt2_bpe_files


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    gen = TextGenerator(seed=3, lexicon_size=3000)
    with open(d / "train.jsonl", "w", encoding="utf-8") as f:
        for _ in range(300):
            f.write(json.dumps({"text": gen.document(max_sentences=8)}) + "\n")
    return d


@pytest.fixture(scope="session")
def sp_model(corpus_dir):
    """A 1000-piece BPE SentencePiece model with byte fallback, trained by tools/train_tokenizer.py."""
    tool = load_tool("train_tokenizer")
    prefix = str(corpus_dir / "sp_bpe")
    rc = tool.main(["--input", str(corpus_dir / "train.jsonl"), "--vocab-size", "1000",
                    "--output-prefix", prefix, "--num-threads", "1"])
    assert rc == 0
    return prefix + ".model"


@pytest.fixture(scope="session")
def hf_tokenizer_dir(corpus_dir):
    """A small byte-level BPE tokenizer.json with a Gemma-like <bos> post-processor."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    hf = Tokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"])
    lines = [json.loads(l)["text"] for l in open(corpus_dir / "train.jsonl")]
    hf.train_from_iterator(lines, trainer)
    bos = hf.token_to_id("<bos>")
    hf.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
    d = corpus_dir / "hf"
    d.mkdir(exist_ok=True)
    hf.save(str(d / "tokenizer.json"))
    return d


@pytest.fixture(scope="session")
def gpt2_files(corpus_dir):
    """GPT-2 format vocab.json + merges.txt of a 600-token byte-level BPE trained on the corpus."""
    texts = [json.loads(line)["text"] for line in open(corpus_dir / "train.jsonl")]
    return write_gpt2_bpe_files(texts, corpus_dir / "gpt2", vocab_size=600)
