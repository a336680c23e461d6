"""A two-phase run (the ZAYA1 recipe in small): phase 2 changes the sequence length and global batch,
starts at sample 0 of its own dataset, and resumes exactly mid-phase (same losses as straight); a phase that
changes only the blend continues each dataset after the samples the phases before read of it."""
import json
import shutil

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from megatron_zaya.arguments import parse_args
from megatron_zaya.training.setup import build_and_train
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


def first_global_batch(monkeypatch, corpus, tmp_path, name, **flags):
    """The tokens of the first global batch a run trains on (its micro-batches in order)."""
    import torch

    from megatron_zaya.training.loop import Trainer

    batches, real_step = [], Trainer.train_step

    def recording_step(self, micro_batches):
        batches.append(torch.cat([mb["tokens"] for mb in micro_batches]))
        return real_step(self, micro_batches)
    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "train_step", recording_step)
        phase(corpus, tmp_path, name, **flags)
    return batches[0]


def test_phase_change_starts_its_data_at_zero_and_resumes_exactly(tiny_corpus, tmp_path, capsys, monkeypatch):
    """Phase 2's first global batch is the one a fresh run with phase 2's flags trains on first (sample 0 of its
    own dataset, not sample 12, the run's count; the fresh run's --train-iters 5 asks the same 40 samples of the
    dataset, hence the same shuffle): exact token equality."""
    p1, p2, p2b = tmp_path / "p1", tmp_path / "p2", tmp_path / "p2b"
    phase(tiny_corpus, tmp_path, "tb1", **{"--save": p1, "--exit-interval": 3})          # 3 x 4 samples of 32
    capsys.readouterr()
    new_data = {"--seq-length": 64, "--global-batch-size": 8}
    fresh = first_global_batch(monkeypatch, tiny_corpus, tmp_path, "fresh", **new_data,
                               **{"--train-iters": 5, "--exit-interval": 1})
    capsys.readouterr()
    first = first_global_batch(monkeypatch, tiny_corpus, tmp_path, "tb2", **new_data, **{"--load": p1, "--save": p2})
    straight = losses(tmp_path / "tb2")
    assert first.shape == fresh.shape == (8, 64) and first.equal(fresh)
    assert (f"WARNING: data changed since the checkpoint (seq_length): a new data phase starts at iteration 3 "
            f"(consumed samples 12); the datasets read before are read again from their start (--seq-length or "
            f"--split changed, so the samples differ): {tiny_corpus[0]}") in capsys.readouterr().out
    state = train_state(p2)
    assert (state["iteration"], state["consumed_samples"]) == (8, 12 + 5 * 8)
    assert (state["data_start_iteration"], state["data_start_samples"]) == (3, 12)
    # tokens are summed per step: 12 samples of 32, then 40 of 64 (not 52 x 64)
    assert state["consumed_tokens"] == 12 * 32 + 5 * 8 * 64
    meta = json.loads((p2 / "iter_0000008" / "metadata.json").read_text())
    assert meta["tokens_seen"] == state["consumed_tokens"]

    first = phase(tiny_corpus, tmp_path, "tb3", **new_data, **{"--load": p1, "--save": p2b, "--exit-interval": 5})
    second = phase(tiny_corpus, tmp_path, "tb4", **new_data, **{"--load": p2b, "--save": p2b})
    out = capsys.readouterr().out
    assert out.count("a new data phase starts") == 1              # the mid-phase resume keeps the phase
    assert sorted(straight) == [4, 5, 6, 7, 8]
    assert {**first, **second} == straight


def test_the_same_files_spelled_another_way_are_the_same_data(tmp_path, monkeypatch):
    """The signature holds each dataset prefix as its real path: a resume that names the same files
    relatively, with ./ or a .bin suffix, through a symlinked folder, or from another working directory,
    continues the data (it started a new phase from sample 0, re-reading what was trained on); a
    checkpoint written before (paths as typed) compares the same way. Other files or weights still differ."""
    from types import SimpleNamespace

    from megatron_zaya.data.config import DataConfig
    from megatron_zaya.training.data_phase import data_changed, data_signature

    (tmp_path / "data").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data")
    monkeypatch.chdir(tmp_path)

    def signature(*data_path):
        return data_signature(SimpleNamespace(data=DataConfig(data_path=list(data_path)),
                                              model=SimpleNamespace(seq_length=64)))
    saved = signature("0.3", "data/a", "0.7", "data/b")
    assert json.loads(saved)["data_path"] == ["0.3", str(tmp_path / "data" / "a"), "0.7", str(tmp_path / "data" / "b")]
    for same in (("0.3", str(tmp_path / "data" / "a"), "0.7", "./data/b"), ("0.3", "link/a.bin", "0.7", "data/b.idx")):
        assert not data_changed(saved, signature(*same))
    typed = json.dumps({**json.loads(saved), "data_path": ["0.3", "data/a", "0.7", "data/b"]})   # an older checkpoint
    assert not data_changed(typed, saved)
    monkeypatch.chdir(tmp_path / "data")
    assert not data_changed(saved, signature("0.3", "a", "0.7", "b"))
    assert data_changed(saved, signature("0.3", "a", "0.7", "c"))
    assert data_changed(saved, signature("0.4", "a", "0.6", "b"))
    # Weights and the split are compared as the shares the blend uses: '30 A 70 B' is '0.3 A 0.7 B' (a new
    # phase re-read the samples already trained on), '98,2' is '98/2/0'; an unweighted list is not
    # '0.5 A 0.5 B' (no surplus asked of its datasets).
    for same in (("30", "a", "70", "b"), ("0.30", "a", "0.70", "b"), ("3", "a", "7", "b")):
        assert not data_changed(saved, signature(*same)), same
    assert data_changed(signature("a", "b"), signature("0.5", "a", "0.5", "b"))
    assert not data_changed(signature("1", "a", "1", "b"), signature("0.5", "a", "0.5", "b"))

    def split(value):
        return data_signature(SimpleNamespace(data=DataConfig(data_path=["a"], split=value),
                                              model=SimpleNamespace(seq_length=64)))
    assert not data_changed(split("98,2"), split("98/2/0"))
    assert not data_changed(split("969,30,1"), split("96.9, 3, 0.1"))
    assert data_changed(split("98,2,0"), split("98,1,1"))


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


def test_a_new_blend_continues_each_dataset_after_the_samples_the_phase_before_read(tiny_corpus, tmp_path,
                                                                                    capsys, monkeypatch):
    """A job's blend changes from 0.7 A 0.3 B to 0.5 A 0.5 B (a recipe's next phase, same files): each dataset
    goes on after the samples the first job read of it (17 of A, 7 of B: the greedy interleave of 24 samples),
    so the two jobs read A's and B's own orders without a gap or a repeat. Reference: each dataset read alone
    (its first samples, in order). Before, the new phase read both from sample 0: 20 of its 40 samples again."""
    import dataclasses

    from megatron_zaya.data.loaders import build_split_datasets
    from tests.training.conftest import run_tool
    from megatron_zaya.data.synthetic import TextGenerator

    a, tokenizer = tiny_corpus
    gen = TextGenerator(seed=12, lexicon_size=2000)
    with open(tmp_path / "b.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": gen.document(max_sentences=8)}) + "\n" for _ in range(300))
    assert run_tool("preprocess_data", ["--input", str(tmp_path / "b.jsonl"), "--output-prefix", str(tmp_path / "b"),
                                        "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", tokenizer,
                                        "--append-eod", "--workers", "1"]) == 0
    b, ckpt = str(tmp_path / "b_text_document"), tmp_path / "ckpt"
    common = {"--train-iters": 16, "--save": ckpt}
    first = recorded_samples(monkeypatch, tiny_corpus, tmp_path, "tb1", **common, **{"--exit-interval": 6,
                             "--data-path": ["0.7", a, "0.3", b]})
    capsys.readouterr()
    second = recorded_samples(monkeypatch, tiny_corpus, tmp_path, "tb2", **common, **{"--load": ckpt,
                              "--data-path": ["0.5", a, "0.5", b]})
    assert (len(first), len(second)) == (24, 40)
    out = capsys.readouterr().out
    assert (f"a new data phase starts at iteration 6 (consumed samples 24); datasets read before continue after the "
            f"samples the earlier phases read of them ({a}: 17, {b}: 7)") in out, out
    assert train_state(ckpt)["data_offsets"] == {a: 17, b: 7}
    # the same second job stopped mid-phase and resumed: the offsets come back with the checkpoint
    resumed = tmp_path / "resumed"
    shutil.copytree(ckpt / "iter_0000006", resumed / "iter_0000006")
    (resumed / "latest_checkpointed_iteration.txt").write_text("6\n")
    common = {**common, "--save": resumed, "--load": resumed, "--data-path": ["0.5", a, "0.5", b]}
    stopped = recorded_samples(monkeypatch, tiny_corpus, tmp_path, "tb3", **common, **{"--exit-interval": 11})
    assert stopped + recorded_samples(monkeypatch, tiny_corpus, tmp_path, "tb4", **common) == second
    run = parse_args(tiny_run_flags(tiny_corpus, tmp_path))
    for prefix, count in ((a, 17 + 20), (b, 7 + 20)):
        alone = build_split_datasets(dataclasses.replace(run.data, data_path=[prefix]), 32, [64, 0, 0]).train
        order = [tuple(alone[i]["tokens"].tolist()) for i in range(64)]
        read = [s for s in first + second if s in order]
        assert read == order[:count], prefix


def test_each_datasets_offset_adds_up_over_the_phases_and_restarts_only_when_it_must(tmp_path, monkeypatch):
    """enter_data_phase on a train state, phase after phase: a weighted blend's draws are its greedy interleave over
    each block of its dataset (blending_counts, checked against the interleave itself), added to the datasets'
    offsets; an unweighted list of several datasets (shares by length, not in the signature) or another
    --seq-length starts every dataset anew, with a warning naming those read before."""
    from types import SimpleNamespace

    import numpy as np

    from megatron_zaya.data.config import DataConfig
    from megatron_zaya.data.index_builders import build_blending_indices
    from megatron_zaya.training.data_phase import data_signature, enter_data_phase

    monkeypatch.chdir(tmp_path)
    a, b, c = (str(tmp_path / name) for name in "abc")

    def signature(*data_path, seq_length=64):
        return data_signature(SimpleNamespace(data=DataConfig(data_path=list(data_path)),
                                              model=SimpleNamespace(seq_length=seq_length)))

    def counts(weights, size):
        return np.bincount(build_blending_indices(weights, size)[0], minlength=len(weights)).tolist()
    state = SimpleNamespace(data_signature=signature("0.7", "a", "0.3", "b"), iteration=30, consumed_samples=25,
                            data_start_iteration=0, data_start_samples=0, data_blocks=[10, 20], data_offsets={})
    line = enter_data_phase(state, signature("0.5", "a", "0.5", "c"))
    drawn = [x + y for x, y in zip(counts([0.7, 0.3], 10), counts([0.7, 0.3], 15))]   # blocks of 10 and 20: 25 read
    assert state.data_offsets == {a: drawn[0], b: drawn[1]} and state.data_blocks == []
    assert line.endswith(f"datasets read before continue after the samples the earlier phases read of them "
                         f"({a}: {drawn[0]})")        # (c is new; b is not read now)
    state.iteration, state.consumed_samples = 50, 45                    # 20 samples of 0.5 a 0.5 c, one block
    state.data_blocks = [30]
    line = enter_data_phase(state, signature("0.2", "b", "0.8", "c"))
    assert state.data_offsets == {a: drawn[0] + 10, b: drawn[1], c: 10}
    assert line.endswith(f"({b}: {drawn[1]}, {c}: 10)")
    assert enter_data_phase(state, signature("0.2", "b", "0.8", "c")) is None            # the same data: no phase
    enter_data_phase(state, signature("a", "c"))
    assert state.data_offsets == {a: drawn[0] + 10, b: drawn[1], c: 10}      # (nothing read in that phase)
    state.consumed_samples = 60
    line = enter_data_phase(state, signature("0.5", "a", "0.5", "c"))     # the unweighted list's shares: unknown
    assert state.data_offsets == {} and line == (
        "WARNING: data changed since the checkpoint (data_path): a new data phase starts at iteration 50 (consumed "
        "samples 60); the datasets read before are read again from their start (the checkpoint's blend does not "
        f"tell how much of each dataset it read (in-run phases, or an unweighted list of several datasets)): {a}, {c}")
    state.consumed_samples = 70
    line = enter_data_phase(state, signature("0.5", "a", "0.5", "c", seq_length=128))
    assert state.data_offsets == {} and "(--seq-length or --split changed, so the samples differ)" in line
