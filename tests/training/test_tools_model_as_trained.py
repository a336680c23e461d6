"""tools/model_stats.py counts the model pretrain_zaya.py trains: with a tokenizer (flags or a training YAML's
keys) the vocabulary is the tokenizer's, padded as the trainer pads it, not the preset's placeholder; it and
tools/estimate.py take the Megatron-LM model switches as pretrain_zaya.py takes them."""
import json
import re

import pytest
import torch

from megatron_zaya.arguments import parse_args
from megatron_zaya.data.tokenizer import build_tokenizer, tiktoken_options
from megatron_zaya.model import ZayaModel
from megatron_zaya.training.setup import resolve_vocab
from tests.training.conftest import run_tool
from tests.training.helpers import tiny_run_flags
from tests.training.test_arguments import error_of


def trainer_parameters(argv) -> tuple[int, int]:
    """(parameters, vocabulary) of the model pretrain_zaya.py builds from `argv` (on the meta device)."""
    run = parse_args(argv)
    tokenizer = build_tokenizer(run.data.tokenizer_type, run.data.tokenizer_model,
                                run.model.make_vocab_size_divisible_by, run.parallel.tensor_model_parallel_size,
                                vocab_file=run.data.vocab_file, merge_file=run.data.merge_file,
                                **tiktoken_options(run.args))
    resolve_vocab(run, tokenizer)
    with torch.device("meta"):
        model = ZayaModel(run.model)
    return sum(p.numel() for p in model.parameters()), run.model.vocab_size


def model_stats_total(argv, capsys) -> tuple[int, str]:
    capsys.readouterr()
    assert run_tool("model_stats", argv) == 0
    out = capsys.readouterr().out
    return int(re.search(r"total parameters:\s+([\d,]+)", out).group(1).replace(",", "")), out


def test_model_stats_sizes_the_vocabulary_as_the_trainer(tiny_corpus, tmp_path, capsys):
    """A training YAML with a 500-piece SentencePiece tokenizer and --make-vocab-size-divisible-by 7: the trainer's
    model has 504 rows (the preset's placeholder has 8,192); model_stats counts the same parameters and says where
    the vocabulary comes from. Megatron-LM's NullTokenizer --vocab-size N (N + 1 ids, padded) likewise."""
    prefix, sp_model = tiny_corpus
    config = tmp_path / "run.yaml"
    config.write_text(f"preset: zaya1-tiny\nnum-layers: 2\nseq-length: 32\nmake-vocab-size-divisible-by: 7\n"
                      f"tokenizer-type: GPTSentencePieceTokenizer\ntokenizer-model: {sp_model}\nlr: 3.0e-3\n")
    trained, vocab = trainer_parameters(["--config", str(config)] + tiny_run_flags(
        tiny_corpus, tmp_path, **{"--preset": None, "--num-layers": None, "--seq-length": None,
                                  "--tokenizer-model": None}))
    assert vocab == 504
    total, out = model_stats_total(["--config", str(config)], capsys)
    assert total == trained
    assert "vocabulary: 504, the tokenizer's 500 (GPTSentencePieceTokenizer " in out
    null = {"--tokenizer-type": "NullTokenizer", "--vocab-size": "1000", "--num-layers": "2"}
    trained, vocab = trainer_parameters(tiny_run_flags(tiny_corpus, tmp_path, **null, **{"--tokenizer-model": None}))
    assert vocab == 1024
    total, out = model_stats_total(["--preset", "zaya1-tiny"] + [w for kv in null.items() for w in kv], capsys)
    assert total == trained and "vocabulary: 1,024, the tokenizer's 1,001" in out
    total, out = model_stats_total(["--preset", "zaya1-tiny"], capsys)    # no tokenizer: the preset's, said so
    assert "vocabulary: 8,192, the preset's (no --tokenizer-model given" in out
    total, out = model_stats_total(["--preset", "zaya1-tiny", "--tokenizer-type", "HuggingFaceTokenizer"], capsys)
    assert "vocabulary: 8,192, the preset's (no --tokenizer-model given" in out    # a config whose launch adds it


# The model block of a Megatron-LM MoE launch script (with ZAYA1's values).
MEGATRON_MODEL_BLOCK = ["--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4",
                        "--group-query-attention", "--num-query-groups", "2", "--ffn-hidden-size", "64", "--swiglu",
                        "--normalization", "RMSNorm", "--disable-bias-linear", "--position-embedding-type", "rope",
                        "--untie-embeddings-and-output-weights", "--moe-router-load-balancing-type", "none",
                        "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall", "--attention-dropout", "0",
                        "--hidden-dropout", "0", "--use-flash-attn", "--moe-layer-freq", "1"]


def tool_error(name, argv, capsys) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        run_tool(name, argv)
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1].split(" error: ", 1)[1]


def test_tools_take_megatron_model_switches_as_the_trainer(tiny_corpus, tmp_path, capsys):
    """model_stats and estimate accept the Megatron-LM compatibility switches pretrain_zaya.py accepts (they were
    unrecognized arguments), also from a --config file, and refuse a value pretrain refuses with its words."""
    planner = ["--preset", "zaya1-tiny", "--gpus", "1", "--global-batch-size", "1", "--json"]
    trained, _ = trainer_parameters(tiny_run_flags(tiny_corpus, tmp_path) + MEGATRON_MODEL_BLOCK)
    assert model_stats_total(["--preset", "zaya1-tiny"] + MEGATRON_MODEL_BLOCK +
                             ["--tokenizer-model", tiny_corpus[1]], capsys)[0] == trained
    assert run_tool("estimate", planner + MEGATRON_MODEL_BLOCK) == 0
    config = tmp_path / "switches.yaml"
    config.write_text("preset: zaya1-tiny\ngroup-query-attention: true\nswiglu: true\nnormalization: RMSNorm\n")
    capsys.readouterr()
    assert run_tool("model_stats", ["--config", str(config)]) == 0
    assert "swiglu" not in capsys.readouterr().err          # read, not left out
    for refused in (["--normalization", "LayerNorm"], ["--position-embedding-type", "learned_absolute"],
                    ["--squared-relu"]):
        expected = error_of(tiny_run_flags(tiny_corpus, tmp_path) + refused, capsys).split(" error: ", 1)[1]
        assert tool_error("model_stats", ["--preset", "zaya1-tiny"] + refused, capsys) == expected
        assert tool_error("estimate", planner + refused, capsys) == expected


@pytest.mark.parametrize("name, argv", [("model_stats", ["--preset", "zaya1-tiny"]),
                                        ("estimate", ["--preset", "zaya1-tiny", "--gpus", "1",
                                                      "--global-batch-size", "1"])])
def test_a_tool_error_is_one_line_not_the_usage_of_every_megatron_flag(name, argv, capsys):
    """argparse printed the usage first: some 170 lines of Megatron-LM's flags above the one that says what is
    wrong (pretrain_zaya.py prints the one line)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        run_tool(name, argv + ["--no-such-flag"])
    lines = capsys.readouterr().err.splitlines()
    assert exc.value.code == 2 and len(lines) == 1, lines[-3:]
    assert lines[0].endswith(": error: unrecognized arguments: --no-such-flag"), lines


def test_tools_pad_the_placeholder_vocabulary_to_a_make_vocab_size_divisible_by(tiny_corpus, tmp_path, capsys):
    """--make-vocab-size-divisible-by 7 without --vocab-size (flag or --config key): the preset's placeholder
    (8,192) padded to 8,197, as the trainer pads a tokenizer of 8,192 ids (NullTokenizer 8191 and its EOD),
    where both tools refused a --vocab-size=8192 nobody gave."""
    trained, vocab = trainer_parameters(tiny_run_flags(tiny_corpus, tmp_path, **{
        "--tokenizer-type": "NullTokenizer", "--tokenizer-model": "8191", "--make-vocab-size-divisible-by": "7"}))
    assert vocab == 8197
    config = tmp_path / "divisible.yaml"
    config.write_text("preset: zaya1-tiny\nnum-layers: 2\nmake-vocab-size-divisible-by: 7\n")
    for argv in (["--preset", "zaya1-tiny", "--num-layers", "2", "--make-vocab-size-divisible-by", "7"],
                 ["--config", str(config)]):
        total, out = model_stats_total(argv, capsys)
        assert total == trained and "vocabulary: 8,197, the preset's padded to a multiple of --make-vocab-size-" \
            "divisible-by=7" in out, out
    planner = ["--gpus", "1", "--global-batch-size", "1", "--optimizer", "adamw", "--json"]

    def planned(argv):
        capsys.readouterr()
        assert run_tool("estimate", planner + argv) == 0, capsys.readouterr().err
        return json.loads(capsys.readouterr().out)
    given = planned(["--preset", "zaya1-tiny", "--num-layers", "2", "--vocab-size", "8197",
                     "--make-vocab-size-divisible-by", "7"])
    assert planned(["--preset", "zaya1-tiny", "--num-layers", "2", "--make-vocab-size-divisible-by", "7"]) == given
    assert planned(["--config", str(config)]) == given
    # Under TP 2 the tokenizer's vocabulary is padded to a multiple of 7 that 2 divides (8,204), and so is the
    # placeholder: the planner refused "--tensor-model-parallel-size=2: must divide ... the vocabulary (8197)".
    planner[1] = "2"
    tp2 = ["--preset", "zaya1-tiny", "--num-layers", "2", "--tensor-model-parallel-size", "2"]
    assert planned(tp2 + ["--make-vocab-size-divisible-by", "7"]) == planned(
        tp2 + ["--vocab-size", "8204", "--make-vocab-size-divisible-by", "7"])
