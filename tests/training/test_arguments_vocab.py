"""The model's vocabulary from the flags: --vocab-size as Megatron-LM reads it for each tokenizer type (the
NullTokenizer's and TikTokenizer's size, the model's padded vocabulary with a tokenizer file), and
--make-vocab-size-divisible-by alone."""
from megatron_zaya.arguments import parse_args
from tests.training.helpers import tiny_run_flags
from tests.training.test_arguments import error_of


def test_null_tokenizer_takes_a_vocabulary_size(tiny_corpus, tmp_path, capsys):
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--tokenizer-type": "NullTokenizer",
                                                               "--tokenizer-model": "500"}))
    assert run.data.tokenizer_model == "500"
    line = error_of(tiny_run_flags(tiny_corpus, tmp_path, **{"--tokenizer-type": "NullTokenizer",
                                                              "--tokenizer-model": "500", "--vocab-size": "256"}),
                    capsys)
    assert "--vocab-size=256" in line and "501" in line


def test_vocab_size_with_a_tokenizer_file_is_the_models_vocabulary_and_said_so(tiny_corpus, tmp_path, capsys):
    """Megatron-LM ignores --vocab-size for tokenizer files (SentencePiece, HF, GPT-2) and pads the tokenizer's;
    here it is the model's padded vocabulary: warned, and a value that is not a multiple names what it is."""
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--vocab-size": "1024"}))
    assert run.model.vocab_size == 1024
    assert run.warnings == ["--vocab-size=1024 with --tokenizer-type GPTSentencePieceTokenizer: the model's "
                            "vocabulary (embedding rows) here, where Megatron-LM ignores the flag for this type "
                            "and pads the tokenizer's"]
    line = error_of(tiny_run_flags(tiny_corpus, tmp_path, **{"--vocab-size": "1000"}), capsys)
    assert "--vocab-size=1000: must be a multiple of --make-vocab-size-divisible-by=128 (next valid: 1024); it is " \
           "the model's padded vocabulary: without it, the tokenizer's is padded" in line, line
    assert parse_args(tiny_run_flags(tiny_corpus, tmp_path)).warnings == []


def test_make_vocab_size_divisible_by_alone_pads_the_tokenizers_vocabulary(tiny_corpus, tmp_path):
    """--make-vocab-size-divisible-by 7 without --vocab-size: the preset's vocabulary (8192) is only a placeholder
    for the tokenizer's, so it is not refused as "--vocab-size=8192: must be a multiple of 7"; the model gets the
    tokenizer's 500 tokens padded to 504."""
    from megatron_zaya.data.tokenizer import build_tokenizer
    from megatron_zaya.training.setup import resolve_vocab

    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--make-vocab-size-divisible-by": "7"}))
    assert run.model.vocab_size % 7 == 0 and run.warnings == []
    resolve_vocab(run, build_tokenizer("GPTSentencePieceTokenizer", run.data.tokenizer_model,
                                       make_vocab_size_divisible_by=7))
    assert run.model.vocab_size == 504


def test_null_tokenizer_in_megatron_form_takes_its_size_from_vocab_size(tiny_corpus, tmp_path):
    """Megatron-LM's `--tokenizer-type NullTokenizer --vocab-size N`: N token ids plus EOD; the model's
    vocabulary is then padded from the tokenizer, not fixed to N."""
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--tokenizer-type": "NullTokenizer",
                                                               "--tokenizer-model": None, "--vocab-size": "500"}))
    assert run.data.tokenizer_model == "500" and run.args.vocab_size is None
