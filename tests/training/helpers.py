"""Command lines for tiny training runs in tests."""


def tiny_run_flags(corpus, tmp_path, **extra) -> list[str]:
    prefix, tokenizer = corpus
    flags = {"--preset": "zaya1-tiny", "--num-layers": "2", "--data-path": prefix, "--tokenizer-model": tokenizer,
             "--micro-batch-size": "2", "--global-batch-size": "4", "--seq-length": "32", "--train-iters": "6",
             "--lr": "3e-3", "--num-workers": "0", "--log-interval": "1", "--eval-interval": "3",
             "--eval-iters": "1", "--data-cache-path": str(tmp_path / "cache")}
    # a list value is several words (e.g. --valid-data-path A B)
    flags.update({k: None if v is None else [str(x) for x in v] if isinstance(v, list) else str(v)
                  for k, v in extra.items()})
    argv = []
    for key, value in flags.items():
        if value is None:      # drop a default flag
            continue
        argv.append(key)
        if isinstance(value, list):
            argv.extend(value)
        elif value != "":
            argv.append(value)
    return argv
