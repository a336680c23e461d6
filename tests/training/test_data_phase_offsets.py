"""A resumed job whose blend changes (a recipe's next phase on the same files) continues each dataset after the
samples the earlier phases read of it: the train state's offsets per dataset and block, and the size each index
was built for (training/data_phase.py). References: each dataset's own order (read alone), and the samples of
the jobs before.

    python -m pytest -q tests/training/test_data_phase_offsets.py
"""
import dataclasses
import json
import shutil

from megatron_zaya.arguments import parse_args
from megatron_zaya.data.loaders import build_split_datasets
from megatron_zaya.training.setup import build_and_train
from tests.training.helpers import tiny_run_flags
from tests.training.phase_helpers import make_dataset, recorded_samples, train_state


def own_order(corpus, tmp_path, prefix: str, count: int, request: int | None = None) -> list[tuple]:
    """The tokens of `prefix`'s first `count` train samples (at most all its index holds) in its own order (read
    alone: its index built for `request` samples, default `count`)."""
    data = dataclasses.replace(parse_args(tiny_run_flags(corpus, tmp_path)).data, data_path=[prefix])
    alone = build_split_datasets(data, 32, [request or count, 0, 0]).train
    return [tuple(alone[i]["tokens"].tolist()) for i in range(min(count, len(alone)))]


def test_a_new_blend_continues_each_dataset_after_the_samples_the_phase_before_read(tiny_corpus, tmp_path,
                                                                                    capsys, monkeypatch):
    """A job's blend changes from 0.7 A 0.3 B to 0.5 A 0.5 B (a recipe's next phase, same files): each dataset
    goes on after the samples the first job read of it (17 of A, 7 of B: the greedy interleave of 24 samples),
    so the two jobs read A's and B's own orders without a gap or a repeat. Reference: each dataset read alone
    (its first samples, in order). Before, the new phase read both from sample 0: 20 of its 40 samples again."""
    a, tokenizer = tiny_corpus
    b = make_dataset(tmp_path, "b", tokenizer, 300, seed=12)
    ckpt = tmp_path / "ckpt"
    common = {"--train-iters": 16, "--save": ckpt}
    first = recorded_samples(monkeypatch, tiny_corpus, tmp_path, "tb1", **common, **{"--exit-interval": 6,
                             "--data-path": ["0.7", a, "0.3", b]})
    capsys.readouterr()
    dry = tiny_run_flags(tiny_corpus, tmp_path, **{**common, "--load": ckpt, "--data-path": ["0.5", a, "0.5", b],
                                                   "--dry-run": ""})
    assert build_and_train(parse_args(dry)) == 0           # (the dry run checks the resume the job makes)
    out = capsys.readouterr().out
    assert f"resumes from {ckpt / 'iter_0000006'} (iteration 6, consumed samples 24)" in out and \
        f"continue after the samples the earlier phases read of them ({a}: 17, {b}: 7)" in out, out
    assert "dry run: every check passed for 1 process and 10 iterations (from iteration 6)" in out, out
    second = recorded_samples(monkeypatch, tiny_corpus, tmp_path, "tb2", **common, **{"--load": ckpt,
                              "--data-path": ["0.5", a, "0.5", b]})
    assert (len(first), len(second)) == (24, 40)
    out = capsys.readouterr().out
    assert (f"a new data phase starts at iteration 6 (consumed samples 24); datasets read before continue after the "
            f"samples the earlier phases read of them ({a}: 17, {b}: 7)") in out, out
    assert train_state(ckpt)["data_offsets"] == {a: [17], b: [7]}
    # the same second job stopped mid-phase and resumed: the offsets come back with the checkpoint
    resumed = tmp_path / "resumed"
    shutil.copytree(ckpt / "iter_0000006", resumed / "iter_0000006")
    (resumed / "latest_checkpointed_iteration.txt").write_text("6\n")
    common = {**common, "--save": resumed, "--load": resumed, "--data-path": ["0.5", a, "0.5", b]}
    stopped = recorded_samples(monkeypatch, tiny_corpus, tmp_path, "tb3", **common, **{"--exit-interval": 11})
    assert stopped + recorded_samples(monkeypatch, tiny_corpus, tmp_path, "tb4", **common) == second
    for prefix, count in ((a, 17 + 20), (b, 7 + 20)):
        order = own_order(tiny_corpus, tmp_path, prefix, 64)
        assert [s for s in first + second if s in order] == order[:count], prefix


def test_each_datasets_offset_adds_up_over_the_phases_and_restarts_only_when_it_must(tmp_path, monkeypatch):
    """enter_data_phase on a train state, phase after phase: a weighted blend's draws are its greedy interleave over
    each block of its dataset (blending_counts, checked against the interleave itself), added to the datasets'
    offsets block by block (block k of every phase is shuffled with --seed + k); an unweighted list of several datasets (shares by length, not in the signature) or another
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
                            data_start_iteration=0, data_start_samples=0, data_blocks=[10, 20], data_offsets={},
                            data_index_sizes={a: [8, 20], b: [4, 9]})
    line = enter_data_phase(state, signature("0.5", "a", "0.5", "c"))
    block0, block1 = counts([0.7, 0.3], 10), counts([0.7, 0.3], 15)     # blocks of 10 and 20: 25 read
    assert state.data_offsets == {a: [block0[0], block1[0]], b: [block0[1], block1[1]]} and state.data_blocks == []
    assert state.data_index_sizes == {a: [8, 20], b: [4, 9]}            # (the data loaders' to record)
    assert line.endswith(f"datasets read before continue after the samples the earlier phases read of them "
                         f"({a}: {block0[0] + block1[0]})")        # (c is new; b is not read now)
    state.iteration, state.consumed_samples = 50, 45                    # 20 samples of 0.5 a 0.5 c, one block
    state.data_blocks = [30]
    line = enter_data_phase(state, signature("0.2", "b", "0.8", "c"))
    assert state.data_offsets == {a: [block0[0] + 10, block1[0]], b: [block0[1], block1[1]], c: [10]}
    assert line.endswith(f"({b}: {block0[1] + block1[1]}, {c}: 10)")
    assert enter_data_phase(state, signature("0.2", "b", "0.8", "c")) is None            # the same data: no phase
    enter_data_phase(state, signature("a", "c"))
    assert state.data_offsets == {a: [block0[0] + 10, block1[0]], b: [block0[1], block1[1]], c: [10]}   # (none read)
    state.consumed_samples = 60
    line = enter_data_phase(state, signature("0.5", "a", "0.5", "c"))     # the unweighted list's shares: unknown
    assert state.data_offsets == {b: [block0[1], block1[1]]} and line == (      # (b, which it did not read, stays)
        "WARNING: data changed since the checkpoint (data_path): a new data phase starts at iteration 50 (consumed "
        "samples 60); the datasets read before are read again from their start (the checkpoint's blend does not "
        f"tell how much of each dataset it read (in-run phases, or an unweighted list of several datasets)): {a}, {c}")
    state.data_blocks, state.consumed_samples = [10], 70                # 10 samples of 0.5 a 0.5 c
    mock = data_signature(SimpleNamespace(data=DataConfig(mock_data=True), model=SimpleNamespace(seq_length=64)))
    enter_data_phase(state, mock)
    state.consumed_samples = 80                                        # 10 samples of random tokens: none read
    line = enter_data_phase(state, signature("0", "a", "1", "b"))        # (a: weight 0, not read)
    assert state.data_offsets == {a: [5], b: [block0[1], block1[1]], c: [5]}
    assert line.endswith(f"read of them ({b}: {block0[1] + block1[1]})")
    line = enter_data_phase(state, signature("0.5", "a", "0.5", "c", seq_length=128))
    assert state.data_offsets == state.data_index_sizes == {}
    assert "(--seq-length or --split changed, so the samples differ)" in line


def test_the_blocks_of_a_phase_go_on_each_in_its_own_order_in_the_next_phase(tiny_corpus, tmp_path, monkeypatch):
    """Phase 1 grows a second block (a job with a larger batch needs more samples of a small dataset S than its index
    held: block 1 is shuffled with --seed + 1). Its offsets are kept per block: phase 2's block 0 goes on in the seed
    order and its block 1 in the seed + 1 order. Before, both blocks' reads were added into one offset (a gap in
    the seed order) and phase 2's block 1 read the seed + 1 order from 0 again: 60 of its samples were phase 1's."""
    a, tokenizer = tiny_corpus
    s = make_dataset(tmp_path, "s", tokenizer, 15, seed=13)
    ckpt, one = tmp_path / "ckpt", ["0.2", a, "0.8", s]
    first = recorded_samples(monkeypatch, tiny_corpus, tmp_path, "tb1", **{
        "--train-iters": 16, "--save": ckpt, "--exit-interval": 3, "--data-path": one})
    first += recorded_samples(monkeypatch, tiny_corpus, tmp_path, "tb2", **{
        "--train-iters": 16, "--global-batch-size": 16, "--save": ckpt, "--load": ckpt, "--exit-interval": 10,
        "--data-path": one})
    assert len(train_state(ckpt)["data_blocks"]) == 2
    two = ["0.3", a, "0.7", s]
    second = recorded_samples(monkeypatch, tiny_corpus, tmp_path, "tb3", **{
        "--train-iters": 20, "--save": ckpt, "--load": ckpt, "--exit-interval": 12, "--data-path": two})
    second += recorded_samples(monkeypatch, tiny_corpus, tmp_path, "tb4", **{
        "--train-iters": 20, "--global-batch-size": 16, "--save": ckpt, "--load": ckpt, "--data-path": two})
    assert len(first) == 124 and len(second) == 136
    assert not set(first) & set(second)
    order = own_order(tiny_corpus, tmp_path, a, 40)          # A: the seed order's first 40 (block 0)
    assert [x for x in first + second if x in order] == order[:len([x for x in first + second if x in order])]


def test_a_dataset_the_next_phase_reads_less_keeps_the_index_the_phase_before_read(tiny_corpus, tmp_path,
                                                                                   monkeypatch):
    """Phase 1 planned two epochs of a small dataset S (its index built for 2 epochs, shuffled so) and stopped
    halfway; phase 2, with another blend, needs less than one epoch of S in all: built for that, S's index would
    be one epoch shuffled otherwise, and phase 2 would read again much of what phase 1 read. Its index is built
    as phase 1's (gpt_dataset.kept_request): S's reads over both phases are its phase-1 order from the start.
    From a checkpoint saved before the index sizes were kept, the sizes phase 1 planned are taken (the same
    samples; it was reshuffled)."""
    a, tokenizer = tiny_corpus
    s = make_dataset(tmp_path, "s", tokenizer, 8, seed=13)
    ckpt = tmp_path / "ckpt"
    first = recorded_samples(monkeypatch, tiny_corpus, tmp_path, "tb1", **{
        "--train-iters": 30, "--save": ckpt, "--exit-interval": 15, "--data-path": ["0.2", a, "0.8", s]})
    built = train_state(ckpt)["data_index_sizes"][s]
    older = tmp_path / "older"                 # as saved before the offsets and index sizes were kept
    shutil.copytree(ckpt, older)
    meta = older / "iter_0000015" / "metadata.json"
    saved = json.loads(meta.read_text())
    del saved["train_state"]["data_offsets"], saved["train_state"]["data_index_sizes"]
    meta.write_text(json.dumps(saved))
    second = recorded_samples(monkeypatch, tiny_corpus, tmp_path, "tb2", **{
        "--train-iters": 30, "--save": ckpt, "--load": ckpt, "--data-path": ["0.5", a, "0.5", s]})
    assert train_state(ckpt)["data_index_sizes"][s] == built
    assert recorded_samples(monkeypatch, tiny_corpus, tmp_path, "tb3", **{
        "--train-iters": 30, "--save": older, "--load": older, "--data-path": ["0.5", a, "0.5", s]}) == second
    order = own_order(tiny_corpus, tmp_path, s, 200, request=built[0])
    read = [x for x in first + second if x in order]
    assert len(read) == train_state(ckpt)["data_offsets"][s][0] + 30 and read == order[:len(read)]
