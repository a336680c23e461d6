"""training/setup.py's small pieces: the model's vocabulary against the tokenizer's, and the settings
--deterministic-mode leaves as it found them."""
from types import SimpleNamespace

import pytest
import torch

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.errors import UserInputError
from megatron_zaya.training.setup import deterministic_algorithms, resolve_vocab


def run_with(vocab_flag):
    model = model_config_from_preset("zaya1-tiny", **({"vocab_size": vocab_flag} if vocab_flag else {}))
    return SimpleNamespace(args=SimpleNamespace(vocab_size=vocab_flag), model=model,
                           data=SimpleNamespace(tokenizer_model="tok.model"))


def test_vocab_size_may_equal_the_tokenizers_but_not_be_smaller():
    tokenizer = SimpleNamespace(vocab_size=512, padded_vocab_size=640, model_path="tok.model")
    run = run_with(None)                            # no --vocab-size: the tokenizer's, padded
    resolve_vocab(run, tokenizer)
    assert run.model.vocab_size == 640
    run = run_with(512)                             # exactly the tokenizer's: kept
    resolve_vocab(run, tokenizer)
    assert run.model.vocab_size == 512
    with pytest.raises(UserInputError, match=r"--vocab-size=384 is smaller than the tokenizer's vocabulary \(512"):
        resolve_vocab(run_with(384), tokenizer)


def test_deterministic_mode_restores_the_settings_it_found():
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)
    with deterministic_algorithms(True):
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.benchmark
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark) == before
