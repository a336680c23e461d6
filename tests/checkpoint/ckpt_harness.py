"""Test harness: a tiny corpus + tokenizer, the flags of a tiny run, in-process training that
records every step's exact fp32 loss, and a subprocess launcher for fault-injection tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY = ("--preset zaya1-tiny --num-layers 2 --hidden-size 64 --num-attention-heads 2 --num-query-groups 2 "
        "--kv-channels 32 --moe-ffn-hidden-size 64 --router-hidden-size 16 --micro-batch-size 2 "
        "--global-batch-size 4 --seq-length 32 --lr 3e-3 --num-workers 0 --log-interval 1 "
        "--eval-interval 1000 --eval-iters 0 --peak-tflops 1").split()


def convert_tool():
    """tools/convert_checkpoint.py as a module."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_convert_checkpoint",
                                                  os.path.join(ROOT, "tools", "convert_checkpoint.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_corpus(directory: str) -> tuple[str, str]:
    """(data prefix, tokenizer model) of a small synthetic corpus."""
    from megatron_zaya.data.synthetic import TextGenerator
    os.makedirs(directory, exist_ok=True)
    prefix, model = os.path.join(directory, "corpus_text_document"), os.path.join(directory, "sp.model")
    if os.path.exists(prefix + ".idx") and os.path.exists(model):
        return prefix, model
    gen = TextGenerator(seed=3, lexicon_size=2000)
    jsonl = os.path.join(directory, "train.jsonl")
    with open(jsonl, "w") as f:
        for _ in range(300):
            f.write(json.dumps({"text": gen.document(max_sentences=8)}) + "\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train_tokenizer.py"), "--input", jsonl,
                    "--vocab-size", "500", "--output-prefix", os.path.join(directory, "sp"), "--num-threads", "1",
                    "--overwrite"],
                   check=True, capture_output=True, env=env)
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "preprocess_data.py"), "--input", jsonl,
                    "--json-keys", "text", "--append-eod", "--output-prefix", os.path.join(directory, "corpus"),
                    "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", model, "--workers", "1",
                    "--no-progress", "--overwrite"], check=True, capture_output=True, env=env)
    return prefix, model


def flags(corpus: tuple[str, str], iters: int, *extra: str, cache: str | None = None) -> list[str]:
    prefix, model = corpus
    out = TINY + ["--data-path", prefix, "--tokenizer-model", model, "--train-iters", str(iters)]
    if cache:
        out += ["--data-cache-path", cache]
    return out + list(extra)


class Recorder:
    """Patches Trainer to record (iteration, exact loss, first sample's tokens) of every step."""

    def __init__(self):
        self.losses: dict[int, float] = {}
        self.tokens: dict[int, list] = {}
        self.trainer = None

    def __enter__(self):
        from megatron_zaya.training import loop
        self._loop = loop
        self._step, self._next = loop.Trainer.train_step, loop.Trainer.next_micro_batches
        rec = self

        def next_micro_batches(trainer):
            batches = rec._next(trainer)
            rec.tokens[trainer.state.iteration + 1] = [b["tokens"].tolist() for b in batches]
            return batches

        def train_step(trainer, micro_batches):
            rec.trainer = trainer
            result = rec._step(trainer, micro_batches)
            rec.losses[trainer.state.iteration + 1] = result.loss
            return result

        loop.Trainer.train_step, loop.Trainer.next_micro_batches = train_step, next_micro_batches
        return self

    def __exit__(self, *exc):
        self._loop.Trainer.train_step, self._loop.Trainer.next_micro_batches = self._step, self._next


def train(argv: list[str], configure=None) -> Recorder:
    """build_and_train in this process (OMP threads as set); returns the recorder."""
    from megatron_zaya.arguments import parse_args
    from megatron_zaya.training.setup import build_and_train
    run = parse_args(argv)
    if configure:
        configure(run)
    torch.manual_seed(run.train.seed)
    with Recorder() as rec:
        build_and_train(run)
    return rec


def subprocess_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MEGATRON_ZAYA_KERNELS="torch",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ckpt_runner.py")


def start(argv: list[str], **env_extra) -> subprocess.Popen:
    env = subprocess_env()
    env.update({k: str(v) for k, v in env_extra.items()})
    return subprocess.Popen([sys.executable, RUNNER, *argv], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run_script(argv: list[str], timeout: float = 120, **env_extra) -> subprocess.CompletedProcess:
    proc = start(argv, **env_extra)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
