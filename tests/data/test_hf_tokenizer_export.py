"""The tokenizer of a Hugging Face export (convert_checkpoint.py to-hf --tokenizer-type ...): the
folder's `transformers.AutoTokenizer` gives our ids on varied text (special-token text included),
decodes them back, knows our EOS/BOS, and the model in the same folder loads with those ids in its
config; the SentencePiece types, which have no exact form, are refused before anything is read."""
import json

import pytest
import torch

from megatron_zaya.checkpoint.hf_format import save_hf_folder
from megatron_zaya.config import model_config_from_preset
from megatron_zaya.data.tiktoken_vocab import train_tiktoken_ranks, write_tiktoken_vocab
from megatron_zaya.data.tokenizer import build_tokenizer
from megatron_zaya.model import ZayaModel
from tests.data.data_test_utils import load_tool

transformers = pytest.importorskip("transformers")

TEXTS = [
    "The lazy fox, the quick dog.",
    "  leading spaces and trailing   ",
    "digits 9876543210 and 3.14",
    "Ünïcödé 東京 Привет 🙂",
    "line one\nline two\r\n\n\ttabbed",
    "CamelCase HTTPServer's url/path//x",
    "special text </s> <s> <unk> <|endoftext|> <bos> stays ordinary",
]


def export(tokenizer, folder):
    torch.manual_seed(0)
    config = model_config_from_preset("zaya1-tiny", num_layers=1, vocab_size=tokenizer.padded_vocab_size)
    save_hf_folder(ZayaModel(config).state_dict(), config, folder, tokenizer=tokenizer)
    return transformers.AutoTokenizer.from_pretrained(folder)


def tiktoken_tokenizer(corpus_dir):
    lines = [json.loads(line)["text"] for line in open(corpus_dir / "train.jsonl")]
    path = corpus_dir / "tiktoken.json"
    tokens = train_tiktoken_ranks(lines, 700, "v2")
    write_tiktoken_vocab(tokens, str(path))
    return build_tokenizer("TikTokenizer", str(path), tiktoken_pattern="v2", tokenizer_vocab_size=len(tokens) + 16,
                           tiktoken_num_special_tokens=16)


@pytest.mark.parametrize("kind", ["TikTokenizer", "GPT2BPETokenizer", "HuggingFaceTokenizer"])
def test_exported_tokenizer_gives_our_ids(kind, corpus_dir, gpt2_files, hf_tokenizer_dir, tmp_path):
    pytest.importorskip("tiktoken")
    if kind == "TikTokenizer":
        ours = tiktoken_tokenizer(corpus_dir)
    elif kind == "GPT2BPETokenizer":
        ours = build_tokenizer(kind, None, vocab_file=str(gpt2_files[0]), merge_file=str(gpt2_files[1]))
    else:
        ours = build_tokenizer(kind, str(hf_tokenizer_dir / "tokenizer.json"))
    theirs = export(ours, tmp_path / "hf")
    corpus = [json.loads(line)["text"] for line in open(corpus_dir / "train.jsonl")][:20]
    special = kind == "HuggingFaceTokenizer"      # ours adds the post-processor's tokens (<bos>) as Megatron does
    for text in TEXTS + corpus:
        ids = ours.encode(text)
        assert theirs.encode(text, add_special_tokens=special) == ids, text
        assert theirs.decode(ids) == ours.decode(ids)
    assert theirs.eos_token_id == ours.eod
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["eos_token_id"] == ours.eod
    model = transformers.ZayaForCausalLM.from_pretrained(tmp_path / "hf")
    assert model.config.eos_token_id == ours.eod


def test_tiktoken_special_tokens_keep_their_ids(corpus_dir, tmp_path):
    pytest.importorskip("tiktoken")
    ours = tiktoken_tokenizer(corpus_dir)
    theirs = export(ours, tmp_path / "hf")
    assert len(theirs) == ours.vocab_size
    assert (theirs.unk_token_id, theirs.bos_token_id, theirs.eos_token_id) == (0, 1, 2)
    assert theirs.convert_ids_to_tokens([3, 15]) == ["<SPECIAL_3>", "<SPECIAL_15>"]
    assert theirs.decode([1] + ours.encode("hi") + [2]) == "<s>hi</s>"


def test_to_hf_refuses_a_tokenizer_without_an_exact_form_before_reading(sp_model, tmp_path, capsys):
    tool = load_tool("convert_checkpoint")
    out = tmp_path / "hf"
    with pytest.raises(SystemExit) as exc:
        tool.main(["to-hf", str(tmp_path / "no-checkpoint-needed"), str(out), "--tokenizer-type",
                   "GPTSentencePieceTokenizer", "--tokenizer-model", str(sp_model)])
    assert exc.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--tokenizer-type GPTSentencePieceTokenizer: no Hugging Face tokenizer gives the same ids" in line, line
    assert not out.exists()
    with pytest.raises(SystemExit):
        tool.main(["to-hf", str(tmp_path / "x"), str(out), "--tokenizer-model", str(sp_model)])
    assert "--tokenizer-model needs --tokenizer-type" in capsys.readouterr().err
