"""Fixtures of the checkpoint tests: one small corpus + tokenizer and data cache per session."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ckpt_harness import make_corpus  # noqa: E402


@pytest.fixture(scope="session")
def ckpt_corpus(tmp_path_factory):
    return make_corpus(str(tmp_path_factory.mktemp("ckpt_corpus")))


@pytest.fixture(scope="session")
def ckpt_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("ckpt_cache"))


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
