"""Tiny training jobs for the data-phase tests: run one, read its losses, its saved train state and the samples
it trained on; make a small dataset with the tiny corpus's tokenizer."""
import json

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from megatron_zaya.arguments import parse_args
from megatron_zaya.training.setup import build_and_train
from tests.training.conftest import run_tool
from tests.training.helpers import tiny_run_flags


def losses(logdir) -> dict[int, float]:
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars("lm loss")}


def phase(corpus, tmp_path, name, **flags) -> dict[int, float]:
    argv = tiny_run_flags(corpus, tmp_path, **{"--train-iters": 8, "--eval-iters": 0, "--tensorboard-dir":
                                               tmp_path / name, **flags})
    assert build_and_train(parse_args(argv)) == 0
    return losses(tmp_path / name)


def train_state(folder) -> dict:
    latest = (folder / "latest_checkpointed_iteration.txt").read_text().strip()
    return json.loads((folder / f"iter_{int(latest):07d}" / "metadata.json").read_text())["train_state"]


def recorded_samples(monkeypatch, corpus, tmp_path, name, **flags) -> list[tuple]:
    """The tokens of every sample a run trains on, in order."""
    from megatron_zaya.training.loop import Trainer

    samples, real_step = [], Trainer.train_step

    def recording_step(self, micro_batches):
        samples.extend(tuple(row.tolist()) for mb in micro_batches for row in mb["tokens"])
        return real_step(self, micro_batches)
    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "train_step", recording_step)
        phase(corpus, tmp_path, name, **flags)
    return samples


def make_dataset(tmp_path, name: str, tokenizer: str, documents: int, seed: int) -> str:
    """The prefix of a dataset of `documents` synthetic documents, tokenized with `tokenizer` (with EOD)."""
    from megatron_zaya.data.synthetic import TextGenerator

    gen = TextGenerator(seed=seed, lexicon_size=2000)
    with open(tmp_path / f"{name}.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": gen.document(max_sentences=8)}) + "\n" for _ in range(documents))
    assert run_tool("preprocess_data", ["--input", str(tmp_path / f"{name}.jsonl"), "--output-prefix",
                                        str(tmp_path / name), "--tokenizer-type", "GPTSentencePieceTokenizer",
                                        "--tokenizer-model", tokenizer, "--append-eod", "--workers", "1"]) == 0
    return str(tmp_path / f"{name}_text_document")
