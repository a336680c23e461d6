"""Tokenizers: Megatron's conventions for EOD/special tokens, vocab padding, HF tokenizer.json loading."""

import json

import pytest
import sentencepiece as spm

from megatron_zaya.data.tokenizer import build_tokenizer, pad_vocab_size
from megatron_zaya.errors import UserInputError


def reference_megatron_sp(sp, text):
    """Reference of Megatron's _SentencePieceTokenizer: vocab + appended specials, and its
    tokenize() loop (search each special in the remaining text, take the earliest by dict order)."""
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    specials = {}

    def add(t):
        if t not in vocab:
            vocab[t] = len(vocab)
        specials[t] = vocab[t]

    for t in ("<CLS>", "<SEP>", "<EOD>", "<MASK>"):
        add(t)
    for pid, default in ((sp.pad_id(), "<PAD>"), (sp.bos_id(), "<BOS>"), (sp.eos_id(), "<EOS>")):
        try:
            add(sp.id_to_piece(pid))
        except IndexError:
            add(default)
    ids, idx = [], 0
    while True:
        indices = {}
        for tok in specials:
            try:
                indices[tok] = text[idx:].index(tok)
            except ValueError:
                continue
        if not indices:
            break
        nxt = min(indices, key=indices.get)
        at = idx + indices[nxt]
        ids.extend(sp.encode_as_ids(text[idx:at]))
        ids.append(specials[nxt])
        idx = at + len(nxt)
    ids.extend(sp.encode_as_ids(text[idx:]))
    return ids, len(vocab), vocab["<EOD>"]


def test_pad_vocab_size():
    assert pad_vocab_size(262145) == 262272 == 2049 * 128
    assert pad_vocab_size(32000) == 32000
    assert pad_vocab_size(32001) == 32128
    assert pad_vocab_size(32001, 128, tensor_parallel_size=2) == 32128     # 128 is split by TP 2 already
    assert pad_vocab_size(32001, 128, tensor_parallel_size=3) == 32256 == 84 * 384
    assert pad_vocab_size(1001, 1, tensor_parallel_size=2) == 1002
    assert pad_vocab_size(1, 64) == 64


def test_gpt_sentencepiece(sp_model):
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    tok = build_tokenizer("GPTSentencePieceTokenizer", sp_model)
    assert tok.vocab_size == 1000 and tok.padded_vocab_size == 1024
    assert (tok.eod, tok.bos, tok.pad) == (2, 1, 3) == (sp.eos_id(), sp.bos_id(), sp.pad_id())
    text = "Thetion proment café \u2603 <EOD> 12345"
    assert tok.encode(text) == sp.encode_as_ids(text)
    assert tok.encode_batch([text, "a"]) == [sp.encode_as_ids(text), sp.encode_as_ids("a")]
    # byte fallback: an unseen character round-trips instead of becoming <unk>
    assert tok.decode(tok.encode("snow \u2603 man")) == "snow \u2603 man"
    assert 0 not in tok.encode("\u2603")


@pytest.mark.parametrize("text", [
    "plain text without specials",
    "first doc<EOD>second doc",
    "<CLS> a <SEP> b <MASK><EOD>",
    "x</s>y<s>z<pad>w",
    "<EO<EOD>D>",
    "",
])
def test_megatron_sentencepiece_conventions(sp_model, text):
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    tok = build_tokenizer("SentencePieceTokenizer", sp_model)
    ref_ids, ref_vocab, ref_eod = reference_megatron_sp(sp, text)
    assert tok.vocab_size == ref_vocab == 1004  # <CLS> <SEP> <EOD> <MASK> appended; pad/bos/eos exist
    assert tok.eod == ref_eod == 1002
    assert tok.encode(text) == ref_ids
    assert tok.encode_batch([text, "plain"]) == [ref_ids, sp.encode_as_ids("plain")]


def test_a_sentencepiece_model_without_bos_or_pad_says_none(tmp_path, corpus_dir):
    """SentencePiece gives -1 for a piece the model lacks; the tokenizer interface says None (generate's
    --add-bos and the server's add_BOS check `bos is None`: a -1 went in front of the prompt)."""
    lines = [json.loads(line)["text"] for line in open(corpus_dir / "train.jsonl")]
    spm.SentencePieceTrainer.Train(sentence_iterator=iter(lines), model_prefix=str(tmp_path / "nobos"), vocab_size=600,
                                   model_type="bpe", byte_fallback=True, unk_id=0, bos_id=-1, eos_id=1, pad_id=-1,
                                   num_threads=1, minloglevel=2)
    tok = build_tokenizer("GPTSentencePieceTokenizer", str(tmp_path / "nobos.model"))
    assert (tok.bos, tok.pad, tok.eod) == (None, None, 1)
    with pytest.raises(UserInputError, match="has no BOS piece, which Llama2Tokenizer puts in front"):
        build_tokenizer("Llama2Tokenizer", str(tmp_path / "nobos.model"))


def test_hf_tokenizer_json(tmp_path, hf_tokenizer_dir):
    import shutil

    from tokenizers import Tokenizer

    d = tmp_path / "hf"
    shutil.copytree(hf_tokenizer_dir, d)
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    bos = hf.token_to_id("<bos>")
    tok = build_tokenizer("HuggingFaceTokenizer", str(d))
    assert tok.vocab_size == hf.get_vocab_size(with_added_tokens=True)
    assert (tok.eod, tok.bos, tok.pad) == (1, 2, 0)
    ids = tok.encode("Thetion proment")
    assert ids[0] == bos and ids == hf.encode("Thetion proment").ids
    assert tok.decode(ids[1:]) == "Thetion proment"
    # tokenizer_config.json decides EOS when present (as transformers would)
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<pad>"}}))
    assert build_tokenizer("HuggingFaceTokenizer", str(d / "tokenizer.json")).eod == 0


@pytest.fixture(scope="module")
def byte_level_bpe_json(corpus_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<pad>", "<eos>", "<bos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator([json.loads(l)["text"] for l in open(corpus_dir / "train.jsonl")], trainer)
    return hf.to_str()


def _tokenizer_dir(directory, tokenizer_json: str, bos_post_processor: bool, config: dict | None):
    from tokenizers import Tokenizer, processors

    hf = Tokenizer.from_str(tokenizer_json)
    if bos_post_processor:
        hf.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    directory.mkdir()
    hf.save(str(directory / "tokenizer.json"))
    if config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


TEXTS = ["Thetion proment", "", " ", "  leading and trailing  ", "tabs\tand\n\nnewlines\r\n",
         "héllo wörld, ça va? 🙂 日本語", "literal <eos> and <bos> and <pad> tokens", "<eos>", "x" * 300]


@pytest.mark.parametrize("bos_post_processor", [True, False])
@pytest.mark.parametrize("config", [
    None,
    {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>", "bos_token": "<bos>", "pad_token": "<pad>"},
    # transformers 5 ignores add_*_token beside a tokenizer.json (the post-processor decides): so do we
    {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>", "bos_token": "<bos>",
     "add_bos_token": True, "add_eos_token": True},
], ids=["no-config", "config", "config-add-flags"])
def test_hf_tokenizer_matches_transformers(tmp_path, byte_level_bpe_json, monkeypatch, bos_post_processor, config):
    """Megatron's HuggingFaceTokenizer encodes with `AutoTokenizer(...)(text).input_ids` and takes
    EOD from `eos_token_id`: the same local folder must give the same ids through ours."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    d = _tokenizer_dir(tmp_path / "tok", byte_level_bpe_json, bos_post_processor, config)
    ours = build_tokenizer("HuggingFaceTokenizer", str(d))
    if config is None:   # transformers needs the special tokens named; ours finds them by name
        ref = transformers.PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json"), eos_token="<eos>",
                                                   bos_token="<bos>", pad_token="<pad>")
    else:
        ref = transformers.AutoTokenizer.from_pretrained(str(d))
    assert ours.vocab_size == len(ref)
    assert ours.eod == ref.eos_token_id and ours.bos == ref.bos_token_id
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref(text).input_ids, text
        assert ours.decode(ids) == ref.decode(ids), text
        assert (ids[:1] == [2]) == bos_post_processor
    assert ours.encode_batch(TEXTS) == ref(TEXTS).input_ids


@pytest.mark.parametrize("declared", [{"eos_token": "<eos>", "bos_token": "<bos>"},
                                      {"eos_token": "<eos>", "additional_special_tokens": ["<bos>", "<pad>"]},
                                      {"eos_token": "<eos>", "added_tokens_decoder": {
                                          "2": {"content": "<bos>", "special": True, "lstrip": False,
                                                "rstrip": False, "normalized": False, "single_word": False}}}])
def test_hf_tokens_the_config_declares_are_one_token_wherever_their_text_appears(
        tmp_path, byte_level_bpe_json, monkeypatch, declared):
    """Special tokens in tokenizer.json's vocabulary but not its added_tokens, declared by tokenizer_config.json:
    AutoTokenizer (and so Megatron-LM) registers them, so "<eos>" in a text is one id; ours encoded its pieces."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    without_added = json.loads(byte_level_bpe_json)
    without_added["added_tokens"] = []
    d = _tokenizer_dir(tmp_path / "tok", json.dumps(without_added), False,
                       {"tokenizer_class": "PreTrainedTokenizerFast", **declared})
    ours, ref = build_tokenizer("HuggingFaceTokenizer", str(d)), transformers.AutoTokenizer.from_pretrained(str(d))
    assert ours.vocab_size == len(ref) and ours.encode("a<eos>") == ref("a<eos>").input_ids
    assert [ours.encode(text) for text in TEXTS] == ref(TEXTS).input_ids
    assert ours.encode("<bos>") == ref("<bos>").input_ids == [2]


def test_hf_tokenizer_config_declaring_a_token_tokenizer_json_lacks_is_refused(tmp_path, hf_tokenizer_dir):
    """transformers adds such a token as a new id (other ids and vocabulary than ours); it fell back to
    another EOS candidate silently. Refused, naming the file and the token."""
    import shutil
    folder = tmp_path / "tok"
    shutil.copytree(hf_tokenizer_dir, folder)
    for config in ({"eos_token": "<|im_end|>"},
                   {"eos_token": "<eos>", "added_tokens_decoder": {"500": {"content": "<think>", "special": True}}}):
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        with pytest.raises(UserInputError, match="declares the token '(<\\|im_end\\|>|<think>)'.*does not hold"):
            build_tokenizer("HuggingFaceTokenizer", str(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    assert build_tokenizer("HuggingFaceTokenizer", str(folder)).eod == build_tokenizer(
        "HuggingFaceTokenizer", str(hf_tokenizer_dir)).tok.token_to_id("<eos>")
    # its <pad> is found by name (an export writes it) but only a declared pad is loss-masked, as transformers'
    # pad_token_id (Megatron-LM's) is the declared one
    from megatron_zaya.data.gpt_dataset import loss_masked_pad
    guessed = build_tokenizer("HuggingFaceTokenizer", str(folder))
    assert guessed.pad == guessed.tok.token_to_id("<pad>") and loss_masked_pad(guessed) is None
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>", "pad_token": "<pad>"}))
    assert loss_masked_pad(build_tokenizer("HuggingFaceTokenizer", str(folder))) == guessed.pad


def test_null_tokenizer():
    tok = build_tokenizer("NullTokenizer", 1000)
    assert tok.vocab_size == 1001 and tok.eod == 1000 and tok.encode("5 7 9") == [5, 7, 9]


def test_bad_arguments_are_clear(tmp_path):
    with pytest.raises(ValueError, match="--tokenizer-type 'BertWordPieceLowerCase' is not supported"):
        build_tokenizer("BertWordPieceLowerCase", "x")
    with pytest.raises(UserInputError, match="nope.model"):
        build_tokenizer("GPTSentencePieceTokenizer", str(tmp_path / "nope.model"))
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a valid SentencePiece model"):
        build_tokenizer("SentencePieceTokenizer", str(bad))
    with pytest.raises(UserInputError, match="no tokenizer.json") as missing:
        build_tokenizer("HuggingFaceTokenizer", str(tmp_path))
    assert "Hub name" not in str(missing.value)
    from megatron_zaya.data.tokenizer import check_tokenizer_flags
    with pytest.raises(UserInputError) as hub:      # a Hub name: nothing is downloaded, the message says how
        check_tokenizer_flags("HuggingFaceTokenizer", "google/gemma-3-1b-pt")
    assert str(hub.value).endswith("google/gemma-3-1b-pt looks like a Hugging Face Hub name, and nothing is downloaded "
                                   "at run time: fetch it first (hf download google/gemma-3-1b-pt tokenizer.json "
                                   "tokenizer_config.json --local-dir DIR) and give DIR")


def test_a_tokenizer_of_the_other_kind_is_named_with_the_type_that_reads_it(sp_model, hf_tokenizer_dir, tmp_path):
    """A config file's --tokenizer-type the user does not see on the command line: the error says what the file is
    and which --tokenizer-type reads it, both ways (a tokenizer.json folder or file to a SentencePiece type, a
    SentencePiece .model to HuggingFaceTokenizer); a file of neither kind gets no such hint."""
    from megatron_zaya.data.tokenizer import check_tokenizer_flags
    hf_hint = "it is a Hugging Face tokenizer: pass --tokenizer-type HuggingFaceTokenizer"
    with pytest.raises(UserInputError, match=hf_hint):          # a folder: refused by the flag check
        check_tokenizer_flags("GPTSentencePieceTokenizer", str(hf_tokenizer_dir))
    for tokenizer_type in ("GPTSentencePieceTokenizer", "Llama2Tokenizer"):      # the file: refused by its loader
        with pytest.raises(UserInputError, match=hf_hint):
            build_tokenizer(tokenizer_type, str(hf_tokenizer_dir / "tokenizer.json"))
    with pytest.raises(UserInputError) as refused:
        build_tokenizer("HuggingFaceTokenizer", sp_model)
    assert ("which --tokenizer-type HuggingFaceTokenizer reads" in str(refused.value)
            and "it is a SentencePiece model: pass --tokenizer-type GPTSentencePieceTokenizer" in str(refused.value))
    with pytest.raises(UserInputError) as refused:      # a tokenizer.json that is not there: no hint
        check_tokenizer_flags("GPTSentencePieceTokenizer", str(tmp_path / "tokenizer.json"))
    assert "it is a" not in str(refused.value), refused.value
    neither = tmp_path / "notes.txt"
    neither.write_text("neither kind")
    for tokenizer_type in ("HuggingFaceTokenizer", "GPTSentencePieceTokenizer"):
        with pytest.raises(UserInputError) as refused:
            build_tokenizer(tokenizer_type, str(neither))
        assert "it is a" not in str(refused.value), refused.value


def test_train_tokenizer_samples_with_its_seed_and_skips_lone_surrogates(tmp_path, corpus_dir, capsys):
    """--input-sentence-size below the corpus: the sample (and so the vocabulary) follows --seed (SentencePiece's
    own sampling did not: two runs differed); a record with a lone surrogate escape is skipped and counted
    (it stopped SentencePiece's training)."""
    from data_test_utils import load_tool

    corpus = tmp_path / "c.jsonl"
    corpus.write_text((corpus_dir / "train.jsonl").read_text() + '{"text": "broken emoji \\ud83d here"}\n')

    def train(name, seed):
        assert load_tool("train_tokenizer").main(["--input", str(corpus), "--vocab-size", "500", "--num-threads", "1",
                                                  "--input-sentence-size", "400", "--seed", str(seed),
                                                  "--output-prefix", str(tmp_path / name)]) == 0
        return (tmp_path / f"{name}.vocab").read_text()

    first, again, other = train("a", 1), train("b", 1), train("c", 2)
    assert first == again and first != other
    assert "1 invalid Unicode" in capsys.readouterr().out
    # an --output-prefix that is a folder: refused (it wrote the hidden DIR/.model)
    for prefix in (str(tmp_path) + "/", str(tmp_path)):
        assert load_tool("train_tokenizer").main(["--input", str(corpus), "--vocab-size", "500",
                                                  "--output-prefix", prefix]) == 2
        assert f"--output-prefix {prefix}: a folder; give a name in it" in capsys.readouterr().err


def test_train_unigram(tmp_path, corpus_dir):
    from data_test_utils import load_tool

    rc = load_tool("train_tokenizer").main(["--input", str(corpus_dir / "train.jsonl"), "--vocab-size", "600",
                                            "--model-type", "unigram", "--output-prefix", str(tmp_path / "u"),
                                            "--num-threads", "1"])
    assert rc == 0
    tok = build_tokenizer("GPTSentencePieceTokenizer", str(tmp_path / "u.model"))
    assert tok.vocab_size == 600 and tok.decode(tok.encode("Proment thetion.")) == "Proment thetion."


def test_hf_eos_declared_twice_is_the_one_transformers_takes(tmp_path, byte_level_bpe_json, monkeypatch):
    """tokenizer_config.json and special_tokens_map.json naming different EOS tokens: Megatron's EOD is
    transformers' `AutoTokenizer.from_pretrained(folder).eos_token_id` (the reference, exact ids); ours is
    the same token."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    d = _tokenizer_dir(tmp_path / "tok", byte_level_bpe_json, False,
                       {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>", "bos_token": "<bos>"})
    (d / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<pad>"}))
    ref = transformers.AutoTokenizer.from_pretrained(str(d))
    ours = build_tokenizer("HuggingFaceTokenizer", str(d))
    assert (ours.eod, ours.bos) == (ref.eos_token_id, ref.bos_token_id)
