"""pretrain_zaya.py with an unweighted --data-path A B none of whose datasets holds a sample of the train split:
the start-up summary (it comes before the build, also under --dry-run) leaves the error to the build, which
names the split, the datasets and the sample size.

    python -m pytest -q tests/training/test_unweighted_blend_cli.py
"""
import numpy as np

from megatron_zaya.data.indexed import write_dataset
from pretrain_zaya import main


def test_the_build_names_a_split_without_a_sample(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "1")
    paths = []
    for name, n_docs in (("a", 10), ("b", 30)):
        write_dataset(str(tmp_path / name), [[5 + i % 7] * 9 + [0] for i in range(n_docs)], dtype=np.uint16)
        paths.append(str(tmp_path / name))
    flags = ["--preset", "zaya1-tiny", "--num-layers", "2", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
             "--micro-batch-size", "2", "--global-batch-size", "4", "--seq-length", "512", "--train-iters", "3",
             "--eval-iters", "0", "--num-workers", "0", "--split", "50,0,50", "--data-cache-path", str(tmp_path / "c"),
             "--dry-run", "--data-path", *paths]
    assert main(flags) == 2
    err = capsys.readouterr().err
    assert f"--split 50,0,50: no dataset of {paths[0]} {paths[1]} holds a sample (513 tokens) in the train split" in err
    # a's 50 train-split tokens hold no sample of 65, b's 150 hold two: a warning names a, and the run goes on
    flags[flags.index("--seq-length") + 1] = "64"
    assert main(flags) == 0
    out = capsys.readouterr()
    assert f"{paths[0]}: its train split holds no sample of 65 tokens" in out.out + out.err
