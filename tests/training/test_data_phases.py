"""A two-phase run (the ZAYA1 recipe in small): phase 2 changes the sequence length and global batch,
starts at sample 0 of its own dataset, and resumes exactly mid-phase (same losses as straight); the data
signature. (A phase that changes only the blend: test_data_phase_offsets.py.)"""
import json

from tests.training.phase_helpers import losses, phase, train_state


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


