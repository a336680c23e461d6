"""The tokenizer of a Hugging Face export (convert_checkpoint.py to-hf --tokenizer-type ...): the
folder's `transformers.AutoTokenizer` gives our ids on varied text (special-token text included),
decodes them back, knows our EOS/BOS, and the model in the same folder loads with those ids in its
config. SentencePiece BPE models (the trainer's default and a Llama-style one) likewise, decoding
random pieces too; SentencePiece models or types without an exact form are refused, with the reason,
before anything is read."""
import random
import json
import unicodedata

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
    "\u2581 a literal lower one eighth block\u2581\u2581x, \u00a0nbsp, \uff46\uff55\uff4c\uff4c, \ufb01, \x00\x01 controls",
    "", " ", "\n", "=====  -----  ......  aaaaaaaa",
    unicodedata.normalize("NFD", "Tiếng Việt, café, Ångström, naïve"),      # decomposed accents (macOS text)
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


def llama_style_sentencepiece(corpus_dir):
    """A BPE SentencePiece model set up as Llama's: no normalization, spaces kept, byte fallback."""
    import sentencepiece as spm

    prefix = corpus_dir / "sp_llama_style"
    if not prefix.with_suffix(".model").exists():
        lines = [json.loads(line)["text"] for line in open(corpus_dir / "train.jsonl")]
        spm.SentencePieceTrainer.Train(sentence_iterator=iter(lines), model_prefix=str(prefix), vocab_size=800,
                                       model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
                                       remove_extra_whitespaces=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                       num_threads=1, minloglevel=2)
    return str(prefix.with_suffix(".model"))


@pytest.mark.parametrize("kind", ["TikTokenizer", "GPT2BPETokenizer", "HuggingFaceTokenizer",
                                  "GPTSentencePieceTokenizer", "Llama2Tokenizer", "llama-style SentencePiece"])
def test_exported_tokenizer_gives_our_ids(kind, corpus_dir, gpt2_files, hf_tokenizer_dir, sp_model, tmp_path):
    if kind == "TikTokenizer":
        pytest.importorskip("tiktoken")
        ours = tiktoken_tokenizer(corpus_dir)
    elif kind == "GPT2BPETokenizer":
        ours = build_tokenizer(kind, None, vocab_file=str(gpt2_files[0]), merge_file=str(gpt2_files[1]))
    elif kind == "HuggingFaceTokenizer":
        ours = build_tokenizer(kind, str(hf_tokenizer_dir / "tokenizer.json"))
    elif kind == "llama-style SentencePiece":
        ours = build_tokenizer("Llama2Tokenizer", llama_style_sentencepiece(corpus_dir))
    else:
        ours = build_tokenizer(kind, sp_model)
    theirs = export(ours, tmp_path / "hf")
    corpus = [json.loads(line)["text"] for line in open(corpus_dir / "train.jsonl")][:20]
    # ours adds the post-processor's tokens (<bos>) as Megatron does; SentencePiece decodes control pieces to ""
    special = kind in ("HuggingFaceTokenizer", "Llama2Tokenizer", "llama-style SentencePiece")
    skip = hasattr(ours, "sp")
    for text in TEXTS + corpus:
        ids = ours.encode(text)
        assert theirs.encode(text, add_special_tokens=special) == ids, text
        assert theirs.decode(ids, skip_special_tokens=skip) == ours.decode(ids), text
    if kind != "HuggingFaceTokenizer":    # the folder read back as --tokenizer-type HuggingFaceTokenizer: our ids
        again = build_tokenizer("HuggingFaceTokenizer", str(tmp_path / "hf"))
        assert [again.encode(text) for text in TEXTS + corpus] == [ours.encode(text) for text in TEXTS + corpus]
        assert again.eod == ours.eod
    if skip:        # any sequence of pieces (not only what text encodes to) decodes alike
        sp, rng = ours.sp, random.Random(0)
        pieces = [i for i in range(sp.GetPieceSize()) if not (sp.IsControl(i) or sp.IsUnknown(i) or sp.IsByte(i))]
        spaces = [i for i in pieces if sp.IdToPiece(i).startswith("\u2581")]    # leading spaces decode apart
        for k in range(300):
            ids = [rng.choice(spaces) for _ in range(k % 3)] + [rng.choice(pieces) for _ in range(rng.randint(1, 10))]
            assert theirs.decode(ids, skip_special_tokens=True) == ours.decode(ids), ids
    assert theirs.eos_token_id == ours.eod
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    # Our ids, or null for one the tokenizer lacks (SentencePiece's pad -1, GPT-2's bos): never -1, and never
    # ZayaConfig's defaults (ids of ZAYA1's vocabulary), which a batched generate() would pad with.
    expected = {"eos_token_id": ours.eod, "bos_token_id": ours.bos, "pad_token_id": ours.pad}
    expected = {name: value if value is not None and value >= 0 else None for name, value in expected.items()}
    model = transformers.ZayaForCausalLM.from_pretrained(tmp_path / "hf")
    for name, value in expected.items():
        assert config[name] == value and getattr(model.config, name) == value, (name, config[name], value)


def test_tiktoken_special_tokens_keep_their_ids(corpus_dir, tmp_path):
    pytest.importorskip("tiktoken")
    ours = tiktoken_tokenizer(corpus_dir)
    theirs = export(ours, tmp_path / "hf")
    assert len(theirs) == ours.vocab_size
    assert (theirs.unk_token_id, theirs.bos_token_id, theirs.eos_token_id) == (0, 1, 2)
    assert theirs.convert_ids_to_tokens([3, 15]) == ["<SPECIAL_3>", "<SPECIAL_15>"]
    assert theirs.decode([1] + ours.encode("hi") + [2]) == "<s>hi</s>"


def test_tiktoken_tokens_no_merge_reaches_are_exported_as_tiktoken_reads_them(tmp_path):
    """tiktoken takes a piece that is a token whole before merging: a vocabulary trained elsewhere can hold
    tokens its pairwise merges never reach (b"bcacb": no two ranks make it). The export reads it the same."""
    from tokenizers import Tokenizer

    from megatron_zaya.checkpoint.hf_tokenizer import hf_tokenizer_files

    pytest.importorskip("tiktoken")
    path = tmp_path / "synthetic.json"
    write_tiktoken_vocab([bytes([b]) for b in range(256)] + [b"bc", b"ac", b"bcacb"], str(path))
    ours = build_tokenizer("TikTokenizer", str(path), tiktoken_pattern="v2", tokenizer_vocab_size=259 + 10,
                           tiktoken_num_special_tokens=10)
    assert len(ours.encode("bcacb")) == 1
    exported = Tokenizer.from_str(hf_tokenizer_files(ours)["tokenizer.json"])
    for text in ("bcacb", "bcac", "abcacbb bcacb", "acbc"):
        assert exported.encode(text, add_special_tokens=False).ids == ours.encode(text), text


def test_a_hugging_face_tokenizers_chat_template_goes_with_the_export(hf_tokenizer_dir, tmp_path):
    import shutil
    folder = tmp_path / "tok"
    shutil.copytree(hf_tokenizer_dir, folder)
    template = "{% for m in messages %}<bos>{{ m['content'] }}<eos>{% endfor %}"
    (folder / "chat_template.jinja").write_text(template)
    theirs = export(build_tokenizer("HuggingFaceTokenizer", str(folder / "tokenizer.json")), tmp_path / "hf")
    assert (tmp_path / "hf" / "chat_template.jinja").read_text() == template
    assert theirs.chat_template == template


def test_to_hf_refuses_a_tokenizer_without_an_exact_form_before_reading(sp_model, tmp_path, capsys):
    tool = load_tool("convert_checkpoint")
    out = tmp_path / "hf"
    with pytest.raises(SystemExit) as exc:
        tool.main(["to-hf", str(tmp_path / "no-checkpoint-needed"), str(out), "--tokenizer-type",
                   "SentencePieceTokenizer", "--tokenizer-model", str(sp_model)])
    assert exc.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--tokenizer-type SentencePieceTokenizer: no Hugging Face tokenizer gives the same ids" in line, line
    assert not out.exists()
    with pytest.raises(SystemExit):
        tool.main(["to-hf", str(tmp_path / "x"), str(out), "--tokenizer-model", str(sp_model)])
    assert "--tokenizer-model needs --tokenizer-type" in capsys.readouterr().err


@pytest.mark.parametrize("options, reason", [
    ({"model_type": "unigram"}, "only BPE models are converted"),
    ({"user_defined_symbols": ["<think>"]}, "it has user-defined symbols"),
    ({"byte_fallback": False}, "it has no byte fallback"),
    ({"normalization_rule_name": "nfkc"}, "its normalization (rule 'nfkc', remove_extra_whitespaces True)"),
    ({"split_digits": True}, "it was trained with split_digits"),
])
def test_sentencepiece_models_without_an_exact_form_are_refused_with_the_reason(corpus_dir, tmp_path, options, reason):
    import sentencepiece as spm

    from megatron_zaya.checkpoint.hf_tokenizer import hf_tokenizer_files
    from megatron_zaya.errors import UserInputError

    lines = [json.loads(line)["text"] for line in open(corpus_dir / "train.jsonl")][:200]
    settings = dict(sentence_iterator=iter(lines), model_prefix=str(tmp_path / "m"), vocab_size=400, model_type="bpe",
                    byte_fallback=True, unk_id=0, bos_id=1, eos_id=2, pad_id=3, num_threads=1, minloglevel=2)
    spm.SentencePieceTrainer.Train(**{**settings, **options})
    with pytest.raises(UserInputError, match="no exact Hugging Face form") as err:
        hf_tokenizer_files(build_tokenizer("GPTSentencePieceTokenizer", str(tmp_path / "m.model")))
    assert reason in str(err.value) and str(tmp_path / "m.model") in str(err.value)


def test_to_hf_refuses_an_unconvertible_sentencepiece_model_before_reading(corpus_dir, tmp_path, capsys):
    tool = load_tool("train_tokenizer")
    assert tool.main(["--input", str(corpus_dir / "train.jsonl"), "--vocab-size", "400", "--model-type", "unigram",
                      "--output-prefix", str(tmp_path / "uni"), "--num-threads", "1"]) == 0
    note = capsys.readouterr().err                   # the trainer says so at once, with the converter's reason
    assert "note: tools/convert_checkpoint.py to-hf cannot write this tokenizer" in note
    assert "only BPE models are converted" in note
    out = tmp_path / "hf"
    with pytest.raises(SystemExit) as exc:
        load_tool("convert_checkpoint").main(["to-hf", str(tmp_path / "no-checkpoint-needed"), str(out),
                                              "--tokenizer-type", "GPTSentencePieceTokenizer",
                                              "--tokenizer-model", str(tmp_path / "uni.model")])
    assert exc.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--tokenizer-model {tmp_path / 'uni.model'}: no exact Hugging Face form" in line and "unigram" in line
    assert not out.exists()


def test_an_export_without_its_tokenizer_says_no_special_ids(tmp_path):
    """Without the tokenizer the special ids are unknown: null in config.json, not ZayaConfig's defaults
    (eos 106, bos 2, pad 0 of ZAYA1's vocabulary; pad 0 would also freeze that embedding row in HF)."""
    torch.manual_seed(0)
    config = model_config_from_preset("zaya1-tiny", num_layers=1, vocab_size=256)
    save_hf_folder(ZayaModel(config).state_dict(), config, tmp_path / "hf")
    model = transformers.ZayaForCausalLM.from_pretrained(tmp_path / "hf")
    assert (model.config.eos_token_id, model.config.bos_token_id, model.config.pad_token_id) == (None, None, None)


def test_generate_never_draws_the_padded_vocabulary(sp_model, tmp_path):
    """The export's generation_config.json suppresses the rows the vocabulary was padded with
    (--make-vocab-size-divisible-by), as our sampling does (vocab_limit): transformers' generate() at a
    temperature high enough to draw from nearly the whole vocabulary (120 tokens) draws none of them, and
    draws them without the file (the control)."""
    ours = build_tokenizer("GPTSentencePieceTokenizer", sp_model)
    assert ours.padded_vocab_size > ours.vocab_size
    export(ours, tmp_path / "hf")
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert generation["suppress_tokens"] == list(range(ours.vocab_size, ours.padded_vocab_size))
    model = transformers.ZayaForCausalLM.from_pretrained(tmp_path / "hf")
    prompt = torch.tensor([ours.encode("the cat")])

    def drawn(**overrides):
        torch.manual_seed(0)
        out = model.generate(prompt.repeat(2, 1), do_sample=True, temperature=50.0, top_k=0, top_p=1.0,
                             max_new_tokens=60, min_new_tokens=60, **overrides)
        return out[:, prompt.shape[1]:]

    assert int((drawn() >= ours.vocab_size).sum()) == 0
    assert int((drawn(suppress_tokens=None) >= ours.vocab_size).sum()) > 0


def synthetic_tiktoken(tmp_path, learned=(), special=None):
    """A TikTokenizer over the 256 bytes (+ `learned` tokens) with 10 special ids."""
    path = tmp_path / "synthetic_ranks.json"
    write_tiktoken_vocab([bytes([b]) for b in range(256)] + list(learned), str(path))
    options = {"tokenizer_special_tokens": list(special)} if special else {}
    return build_tokenizer("TikTokenizer", str(path), tiktoken_pattern="v2",
                           tokenizer_vocab_size=256 + len(learned) + 10, tiktoken_num_special_tokens=10, **options)


def test_tiktoken_special_token_that_is_a_whole_piece_stays_text(tmp_path):
    """A special token the pattern keeps as one piece ("hello"): its text encodes as text (split_special_tokens),
    byte by byte through the merges, never as the special id the vocabulary also maps that string to."""
    pytest.importorskip("tiktoken")
    ours = synthetic_tiktoken(tmp_path, learned=[b"he", b"ll"], special=["<unk>", "<s>", "</s>", "hello"])
    theirs = export(ours, tmp_path / "hf")
    for text in ("hello", "say hello", "hello world"):
        assert theirs.encode(text, add_special_tokens=False) == ours.encode(text), text
    assert ours.encode("hello") != [3]


def test_tiktoken_learned_token_spelled_like_a_special_one_is_refused(tmp_path):
    from megatron_zaya.checkpoint.hf_tokenizer import hf_tokenizer_files
    from megatron_zaya.errors import UserInputError

    pytest.importorskip("tiktoken")
    ours = synthetic_tiktoken(tmp_path, learned=[b"<s", b"<s>"])
    with pytest.raises(UserInputError, match="the token '<s>' is both a special token and a learned one"):
        hf_tokenizer_files(ours)


def test_hugging_face_tokenizer_config_beside_it_is_exported_as_is(hf_tokenizer_dir, tmp_path):
    """A tokenizer_config.json beside the tokenizer.json goes into the export unchanged (transformers' loading of
    that folder is what HuggingFaceTokenizer matches); only without one is a plain one written."""
    import shutil

    from megatron_zaya.checkpoint.hf_tokenizer import hf_tokenizer_files

    folder = tmp_path / "tok"
    shutil.copytree(hf_tokenizer_dir, folder)
    (folder / "tokenizer_config.json").unlink(missing_ok=True)
    written = json.loads(hf_tokenizer_files(build_tokenizer("HuggingFaceTokenizer", str(folder / "tokenizer.json")))
                         ["tokenizer_config.json"])
    assert written["tokenizer_class"] == "PreTrainedTokenizerFast" and written["eos_token"] == "<eos>"
    own = json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 77, "eos_token": "<eos>"})
    (folder / "tokenizer_config.json").write_text(own)
    files = hf_tokenizer_files(build_tokenizer("HuggingFaceTokenizer", str(folder / "tokenizer.json")))
    assert files["tokenizer_config.json"] == own


def test_sentencepiece_export_names_every_special_piece_including_id_0(sp_model):
    """tokenizer_config.json names each special piece the model has, <unk> at id 0 included."""
    from megatron_zaya.checkpoint.hf_tokenizer import hf_tokenizer_files

    ours = build_tokenizer("GPTSentencePieceTokenizer", sp_model)
    sp = ours.sp
    config = json.loads(hf_tokenizer_files(ours)["tokenizer_config.json"])
    expected = {f"{role}_token": sp.IdToPiece(i) for role, i in
                (("eos", sp.eos_id()), ("bos", sp.bos_id()), ("unk", sp.unk_id()), ("pad", sp.pad_id())) if i >= 0}
    assert 0 in (sp.eos_id(), sp.bos_id(), sp.unk_id(), sp.pad_id())
    assert {k: config.get(k) for k in expected} == expected
