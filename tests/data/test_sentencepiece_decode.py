"""SentencePieceTokenizer.decode (generate/evaluate/server print through it) against the rule of Megatron-LM's
SentencePiece detokenizer: plain pieces decoded by SentencePiece, each special id spelt out between spaces,
extra ids (<extra_id_i>) included."""

import numpy as np
import pytest
import sentencepiece as spm
import torch

from megatron_zaya.data.tokenizer import build_tokenizer


def expected_text(sp, names, ids):
    """The rule of Megatron-LM's SentencePiece detokenizer, written out: each run of ordinary ids decoded by
    SentencePiece, then each special id as its name, a space on either side."""
    parts, run = [], []
    for token in ids:
        if token in names:
            parts.append(f"{sp.decode_ids(run)} {names[token]} ")
            run = []
        else:
            run.append(token)
    return "".join(parts) + sp.decode_ids(run)


@pytest.mark.parametrize("text", [
    "plain text without specials",
    "first doc<EOD>second doc",
    "<CLS> a <SEP> b <MASK><EOD>",
    "x</s>y<s>z",
    "<extra_id_1>start and end<extra_id_0>",
    "",
])
def test_decode_spells_special_ids_as_megatron_does(sp_model, text):
    sp = spm.SentencePieceProcessor(model_file=sp_model)
    tok = build_tokenizer("SentencePieceTokenizer", sp_model, vocab_extra_ids=2)
    specials = ["<CLS>", "<SEP>", "<EOD>", "<MASK>", "<extra_id_0>", "<extra_id_1>"]
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    inv = {1000 + k: name for k, name in enumerate(specials)}             # appended after the 1000 pieces
    inv.update({vocab[p]: p for p in ("<pad>", "<s>", "</s>")})        # pad/bos/eos: the model's own pieces
    assert tok.vocab_size == 1006
    ids = tok.encode(text)
    assert tok.decode(ids) == expected_text(sp, inv, ids)
    if any(s in text for s in specials + ["</s>", "<s>"]):
        assert any(i in inv for i in ids)                                 # the special branch is taken
    # tensors and numpy arrays of ids decode the same as lists
    assert tok.decode(torch.tensor(ids, dtype=torch.long)) == tok.decode(np.array(ids, dtype=np.int64)) \
        == tok.decode(ids)
