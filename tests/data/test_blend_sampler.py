"""Blends (Megatron's greedy interleave), curriculum phases, the resumable sampler and the loaders."""

import os

import numpy as np
import pytest
import torch

import data_megatron_reference as ref
from megatron_zaya.data import DataConfig, PhaseBlend, build_train_valid_test_datasets, build_train_valid_test_loaders
from megatron_zaya.data.blend import parse_data_path
from megatron_zaya.data.index_builders import blending_counts, build_blending_indices
from megatron_zaya.data.indexed import write_dataset
from megatron_zaya.data.sampler import PretrainingBatchSampler
from megatron_zaya.data.tokenizer import build_tokenizer

EOD = 1000


def corpus(tmp_path, name, base, n_docs=60, seed=0):
    """Documents whose tokens encode (corpus, document) so a sample tells where it came from."""
    rng = np.random.default_rng(seed)
    seqs = [[base + (i % 50)] * int(rng.integers(2, 20)) + [EOD] for i in range(n_docs)]
    prefix = str(tmp_path / name)
    write_dataset(prefix, seqs, dtype=np.uint16)
    return prefix, seqs


@pytest.mark.parametrize("weights", [[0.3, 0.7], [0.5, 0.25, 0.25], [0.1, 0.1, 0.1, 0.7], [1 / 3, 1 / 3, 1 / 3]])
def test_blending_matches_reference_and_tracks_weights(weights):
    di, dsi = build_blending_indices(weights, 2000)
    rdi, rdsi = ref.blending(weights, 2000)
    assert di.tolist() == rdi and dsi.tolist() == rdsi
    counts = np.bincount(di, minlength=len(weights))
    assert np.all(np.abs(counts - np.array(weights) * 2000) <= 1.0 + 1e-9)  # no randomness in the ratios


def test_the_compiled_blending_loop_gives_the_python_loops_indices(monkeypatch):
    """native_blending.py: the C loop (the default where a compiler works) against the Python loop, on random
    weights and on exact ties, and its counts alone (blending_counts) against the counts of a longer index's
    first samples; without a compiler both fall back to Python."""
    import shutil

    from megatron_zaya.data import native_blending
    if native_blending.native_blending() is None:
        pytest.skip("no working C compiler here")
    rng = np.random.default_rng(3)
    blends = [rng.dirichlet(np.ones(n)).tolist() for n in (2, 3, 7, 40)] + [[1 / 3] * 3, [0.5, 0.25, 0.25], [0.2] * 5]
    for weights in blends:
        for size in (0, 1, 2, 3000, 40000):
            native, python = build_blending_indices(weights, size), build_blending_indices(weights, size, native=False)
            assert native[0].dtype == np.int16 and native[1].dtype == np.int64
            assert np.array_equal(native[0], python[0]) and np.array_equal(native[1], python[1]), (weights, size)
            first = np.bincount(python[0][:size // 3], minlength=len(weights))     # a prefix of the longer one
            assert np.array_equal(blending_counts(weights, size // 3), first), (weights, size)
            assert np.array_equal(blending_counts(weights, size // 3, native=False), first), (weights, size)
    native_blending.native_library.cache_clear()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    try:
        assert native_blending.native_blending() is None and native_blending.count_natively(blends[0], 5) is None
        fallback = build_blending_indices(blends[0], 500)[0]
        assert np.array_equal(fallback, build_blending_indices(blends[0], 500, False)[0])
        assert blending_counts(blends[0], 500).tolist() == np.bincount(fallback).tolist()
    finally:
        native_blending.native_library.cache_clear()


def test_a_compiled_blending_library_is_named_by_its_flags_too(tmp_path, monkeypatch):
    """The cached library's name holds the hash of the source and the compiler flags: a library built with
    other flags (e.g. with floating-point contraction, which changes the sums) is never reused."""
    import shutil

    from megatron_zaya.data import native_blending
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler here")
    first = native_blending._compile(str(tmp_path), compiler)
    monkeypatch.setattr(native_blending, "FLAGS", [f for f in native_blending.FLAGS if f != "-ffp-contract=off"])
    second = native_blending._compile(str(tmp_path), compiler)
    assert first and second and first != second and os.path.exists(first) and os.path.exists(second)


def test_a_blending_library_another_user_could_have_written_is_never_loaded(tmp_path, monkeypatch):
    """The library cache may be the node's shared temporary folder: a library in a folder another user owns is
    not loaded (its code would run in this process), and native_library moves on to the next folder; in this
    user's own folder a library file that others can write (an earlier version's, built under a umask of 002), or a
    link, is built anew rather than loaded. A library this user builds under a umask of 002 is not group-writable,
    so the next process takes it."""
    import shutil
    import stat

    from megatron_zaya.data import native_blending
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler here")
    planted = tmp_path / "planted"
    built = native_blending._compile(str(planted), compiler)       # stands for a file another user put there
    with open(built, "ab") as f:                                  # others could have written it
        f.write(b"written by another user of the group")
    os.chmod(built, 0o775)
    size = os.path.getsize(built)
    assert native_blending._compile(str(planted), compiler) == built
    assert not os.stat(built).st_mode & 0o022 and os.path.getsize(built) < size     # built anew
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(tmp_path / "elsewhere.so", linked / os.path.basename(built))
    again = native_blending._compile(str(linked), compiler)
    assert again == str(linked / os.path.basename(built)) and not os.path.islink(again)
    if os.getuid() == 0:              # as root: a folder owned by another user (nobody) is refused too
        os.chown(planted, 65534, 65534)
        assert native_blending._compile(str(planted), compiler) is None
        monkeypatch.setattr(native_blending, "_cache_dirs", lambda: [str(planted), str(tmp_path / "own")])
        native_blending.native_library.cache_clear()
        try:
            assert native_blending.native_blending() is not None and (tmp_path / "own").is_dir()
        finally:
            native_blending.native_library.cache_clear()
    old_umask = os.umask(0o002)
    try:
        fresh = native_blending._compile(str(tmp_path / "umask"), compiler)
    finally:
        os.umask(old_umask)
    assert not os.stat(fresh).st_mode & 0o022 and stat.S_IMODE(os.stat(tmp_path / "umask").st_mode) == 0o700
    assert native_blending._compile(str(tmp_path / "umask"), compiler) == fresh


def test_blend_weights_are_normalised_once_as_in_megatron():
    """`--data-path 64 A 51 B 27 C 31 D 5 E`: weights divided by their sum once (Megatron's normalize), and
    the interleave is the reference loop's on those; normalising a second time moved some weights by an ulp,
    which flipped ties: 6 of these 1000 samples came from another dataset."""
    from megatron_zaya.data.blend import plan_phases
    raw = [64, 51, 27, 31, 5]
    weights, _ = parse_data_path([x for w in raw for x in (str(w), f"p{w}")])
    plan = plan_phases([weights], [1000])
    once = (np.asarray(raw, dtype=np.float64) / sum(raw)).tolist()
    assert np.asarray(plan.dataset_index[0]).tolist() == ref.blending(once, 1000)[0]


def test_a_one_dataset_phase_holds_no_index_arrays():
    """plan_phases: a phase drawn from one dataset maps sample i to that dataset's sample i with a broadcast
    constant and Positions (no 10 bytes per sample), and BlendedDataset counts it without a copy."""
    from megatron_zaya.data.blend import BlendedDataset, Positions, plan_phases
    size = 3_000_000_000       # ZAYA1-scale: arrays would need 30 GB
    plan = plan_phases([[0.0, 1.0]], [size], weighted=[False])
    di, dsi = plan.dataset_index[0], plan.dataset_sample_index[0]
    assert isinstance(dsi, Positions) and di.strides == (0,) and plan.requests == [0, size]
    assert (int(di[size - 1]), dsi[size - 1], len(dsi)) == (1, size - 1, size)
    samples = BlendedDataset([[], range(size)], di, dsi)
    assert len(samples) == size and samples[12345] == 12345


def test_component_counts_are_counted_a_chunk_at_a_time(monkeypatch):
    from megatron_zaya.data import blend
    index = np.random.default_rng(5).integers(0, 6, 10_001).astype(np.int16)
    monkeypatch.setattr(blend, "COUNT_CHUNK", 999)
    assert blend.component_counts(index, 6).tolist() == np.bincount(index, minlength=6).tolist()
    assert blend.component_counts(index[:0], 6).tolist() == [0] * 6


def test_parse_data_path():
    assert parse_data_path(["30", "a", "70", "b"]) == ([0.3, 0.7], ["a", "b"])
    assert parse_data_path("a") == (None, ["a"])
    assert parse_data_path(["a", "b"]) == (None, ["a", "b"])
    for bad in (["1", "a", "2"], ["a", "1", "b"], ["-1", "a", "2", "b"], [], ["0", "a", "0", "b"],
                ["nan", "a", "1", "b"], ["inf", "a", "1", "b"]):
        with pytest.raises(ValueError, match="--data-path"):
            parse_data_path(bad)


@pytest.mark.parametrize("start", [0, 1])
def test_blended_train_split_matches_reference(tmp_path, monkeypatch, start):
    """The same samples whichever dataset this node builds first (cache.build_order)."""
    import megatron_zaya.data.loaders as loaders
    from megatron_zaya.data import cache
    from megatron_zaya.data.gpt_dataset import GPTDataset

    built = []
    monkeypatch.setattr(loaders, "build_order", lambda items, per_node: cache.build_order(items, start=start))
    monkeypatch.setattr(loaders, "GPTDataset", lambda data, *a, **k: built.append(data.path_prefix) or GPTDataset(
        data, *a, **k))
    a, sa = corpus(tmp_path, "a", 0, seed=1)
    b, sb = corpus(tmp_path, "b", 500, seed=2)
    cfg = DataConfig(data_path=["30", a, "70", b], split="90,10,0", data_cache_path=str(tmp_path / "cache"),
                     seed=7, num_workers=0)
    tok = build_tokenizer("NullTokenizer", EOD)
    seq, n = 8, 300
    train, valid, test = build_train_valid_test_datasets(cfg, seq, [n, 20, 0], tok)
    assert test is None and len(train) == n and len(valid) == 20
    assert built[:2] == [a, b][start:] + [a, b][:start]
    bounds = ref.split_bounds("90,10,0", 60)[0]
    comp = [ref.gpt_samples(s, list(range(*bounds)), seq, ref.component_request(n, w), 7)
            for s, w in ((sa, 0.3), (sb, 0.7))]
    di, dsi = ref.blending([0.3, 0.7], n)
    for i in range(n):
        assert train[i]["tokens"].tolist() == comp[di[i]][dsi[i]][:-1]
    import os
    assert any("BlendedDataset-dataset_index" in f for f in os.listdir(tmp_path / "cache"))

    def no_rebuild(*a):
        raise AssertionError("blending indices rebuilt despite the cache")

    monkeypatch.setattr(loaders, "build_blending_indices", no_rebuild)
    again, _, _ = build_train_valid_test_datasets(cfg, seq, [n, 20, 0], tok)  # from the cache
    assert all(np.array_equal(again[i]["tokens"], train[i]["tokens"]) for i in range(0, n, 7))


def test_phases_switch_blend_without_repeating_samples(tmp_path):
    a, _ = corpus(tmp_path, "a", 0, n_docs=200, seed=3)
    b, _ = corpus(tmp_path, "b", 500, n_docs=200, seed=4)
    cfg = DataConfig(phases=[PhaseBlend([a], train_samples=40), PhaseBlend(["50", a, "50", b])],
                     split="100,0,0", data_cache_path=str(tmp_path / "cache"), num_workers=0)
    train, _, _ = build_train_valid_test_datasets(cfg, 8, [100, 0, 0], build_tokenizer("NullTokenizer", EOD))
    assert len(train) == 100
    src = [("a" if int(train[i]["labels"][0]) < 500 or int(train[i]["tokens"][0]) < 500 else "b") for i in range(100)]
    assert src[:40] == ["a"] * 40
    assert src[40:].count("b") == 30 and src[40:].count("a") == 30
    # phase 2 continues component a where phase 1 stopped: the a-samples are all distinct
    comp_a = train.phases[0].datasets[0]
    assert train.phases[1].datasets[0] is comp_a
    a_ids = [int(train.phases[1].dataset_sample_index[j]) + train.phases[1].offsets[0]
             for j in range(60) if train.phases[1].dataset_index[j] == 0]
    assert min(a_ids) == 40 and len(set(a_ids)) == 30
    # the samples read through train[i] (not re-derived indices): phase 1 is a's samples 0..39 and phase 2's
    # a-samples are a's samples 40..69 in order (a blend reading a's sample k without its phase offset served
    # a's samples 0..29 again)
    assert all(np.array_equal(train[i]["tokens"], comp_a[i]["tokens"]) for i in range(40))
    phase2_a = [train[40 + j]["tokens"] for j in range(60) if train.phases[1].dataset_index[j] == 0]
    assert len(phase2_a) == 30
    assert all(np.array_equal(t, comp_a[40 + k]["tokens"]) for k, t in enumerate(phase2_a))
    assert not all(np.array_equal(t, comp_a[k]["tokens"]) for k, t in enumerate(phase2_a))


def simulate(total, gbs, mbs, dp, consumed, steps):
    """Per step, the samples every rank sees, through the real samplers."""
    samplers = [iter(PretrainingBatchSampler(total, consumed, mbs, r, dp)) for r in range(dp)]
    out = []
    for _ in range(steps):
        step = []
        for _ in range(gbs // (mbs * dp)):
            step.append([next(s) for s in samplers])
        out.append(step)
    return out


def test_sampler_shares_and_exact_resume():
    total, gbs, mbs, dp = 1000, 24, 3, 4
    full = simulate(total, gbs, mbs, dp, 0, 10)
    for step in full[:3]:
        ids = sorted(i for micro in step for rank in micro for i in rank)
        assert len(ids) == gbs and len(set(ids)) == gbs  # each global batch covered once, no overlap
    for k in (1, 4, 7):
        resumed = simulate(total, gbs, mbs, dp, k * gbs, 10 - k)
        assert resumed == full[k:]
    with pytest.raises(ValueError, match="consumed_samples 2000"):
        PretrainingBatchSampler(total, 2000, 2, 0, 1)


def test_sampler_partial_last_batch():
    assert list(PretrainingBatchSampler(10, 4, 2, 0, 2, drop_last=True)) == [[4, 5]]
    assert list(PretrainingBatchSampler(11, 4, 2, 1, 2, drop_last=False)) == [[6, 7], [10]]
    assert list(PretrainingBatchSampler(11, 4, 2, 0, 2, drop_last=False)) == [[4, 5], [8, 9]]


def test_a_stop_signal_to_a_loader_worker_leaves_the_loading_to_the_trainer(tmp_path):
    """Slurm (scancel, a time limit) sends SIGTERM / SIGUSR1 / SIGINT to every process of a step, workers
    included: they ignore them and go on loading (torch's worker exited on a SIGTERM its parent did not send,
    and the trainer died of "DataLoader worker is killed" instead of saving its checkpoint)."""
    import os
    import signal
    import time

    a, _ = corpus(tmp_path, "a", 0, seed=5)
    cfg = DataConfig(data_path=[a], split="100,0,0", data_cache_path=str(tmp_path / "cache"), num_workers=1)
    train, _, _ = build_train_valid_test_loaders(cfg, 4, 2, 16, 0, 1, 0, train_samples=32,
                                                 tokenizer=build_tokenizer("NullTokenizer", EOD))
    it = iter(train)
    first = next(it)
    for name in ("SIGTERM", "SIGUSR1", "SIGINT"):
        for worker in it._workers:
            os.kill(worker.pid, getattr(signal, name))
    time.sleep(0.5)
    assert all(w.is_alive() for w in it._workers)
    batches = [next(it) for _ in range(6)]
    assert first["tokens"].shape == batches[-1]["tokens"].shape == (2, 16)


def test_a_process_that_dies_of_an_error_does_not_wait_for_its_loader_workers(tmp_path):
    """An unhandled error leaves the loader iterator alive in the traceback; at exit multiprocessing SIGTERMs
    its workers, which ignore SIGTERM, and joins them: the process hung for ever. The workers are killed
    first (loaders.kill_abandoned_loader_workers): the process ends with the error's status."""
    import subprocess
    import sys
    import textwrap

    a, _ = corpus(tmp_path, "a", 0, seed=5)
    script = textwrap.dedent(f"""
        from megatron_zaya.data.config import DataConfig
        from megatron_zaya.data.loaders import build_train_valid_test_loaders
        from megatron_zaya.data.tokenizer import build_tokenizer
        cfg = DataConfig(data_path=[{a!r}], split="100,0,0", data_cache_path={str(tmp_path / "cache")!r},
                         num_workers=2)
        train, _, _ = build_train_valid_test_loaders(cfg, 4, 2, 16, 0, 1, 0, train_samples=32,
                                                     tokenizer=build_tokenizer("NullTokenizer", {EOD!r}))
        it = iter(train)
        next(it)
        raise RuntimeError("an error in the training step")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "an error in the training step" in done.stderr, done.stderr[-2000:]
    assert "killed by signal" not in done.stderr, done.stderr[-2000:]      # not reported as a worker crash


def test_loaders_resume_with_workers(tmp_path):
    a, _ = corpus(tmp_path, "a", 0, seed=5)
    cfg = DataConfig(data_path=[a], split="98,2,0", data_cache_path=str(tmp_path / "cache"), num_workers=2,
                     eod_mask_loss=True, reset_position_ids=True, prefetch_factor=2)
    tok = build_tokenizer("NullTokenizer", EOD)
    gbs, mbs, dp, seq = 8, 2, 2, 16

    def batches(rank, consumed, count):
        train, valid, test = build_train_valid_test_loaders(cfg, gbs, mbs, seq, rank, dp, consumed,
                                                            train_samples=64, valid_samples=8, tokenizer=tok)
        assert test is None and valid is not None
        it = iter(train)
        return [next(it) for _ in range(count)]

    full = batches(1, 0, 12)
    b = full[0]
    assert set(b) == {"tokens", "labels", "loss_mask", "position_ids"}
    assert b["tokens"].shape == (mbs, seq) and b["tokens"].dtype == torch.int64
    assert b["labels"].dtype == torch.int64 and b["loss_mask"].dtype == torch.float32
    assert b["position_ids"].dtype == torch.int64
    for m in full:
        assert torch.equal(m["tokens"][:, 1:], m["labels"][:, :-1])
        assert torch.equal(m["loss_mask"] == 0, m["tokens"] == EOD)
    resumed = batches(1, 2 * gbs, 8)  # after 2 iterations (4 micro-batches of this rank)
    for x, y in zip(full[4:], resumed):
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_loader_errors_are_clear(tmp_path):
    a, _ = corpus(tmp_path, "a", 0)
    cfg = DataConfig(data_path=[a], split="100,0,0", data_cache_path=str(tmp_path / "cache"), num_workers=0)
    tok = build_tokenizer("NullTokenizer", EOD)
    with pytest.raises(ValueError, match="--global-batch-size 10"):
        build_train_valid_test_loaders(cfg, 10, 4, 8, 0, 1, train_samples=10, tokenizer=tok)
    _, valid, _ = build_train_valid_test_loaders(cfg, 8, 4, 8, 0, 1, train_samples=8, valid_samples=8, tokenizer=tok)
    assert valid == []  # zero split weight: no dataset, as in Megatron
    cfg.split = "999,1,0"  # 60 sequences: the valid range rounds to nothing
    with pytest.raises(ValueError, match="valid split of .* is empty"):
        build_train_valid_test_loaders(cfg, 8, 4, 8, 0, 1, train_samples=8, valid_samples=8, tokenizer=tok)
    with pytest.raises(ValueError, match="--data-path"):
        DataConfig(data_path=[])
    with pytest.raises(ValueError, match="--tokenizer-type"):
        build_train_valid_test_loaders(cfg, 8, 4, 8, 0, 1, train_samples=8)


@pytest.mark.parametrize("weighted", [False, True])
def test_single_path_matches_reference(tmp_path, weighted):
    """`--data-path P` uses the dataset directly; `--data-path 1.0 P` is a one-component blend whose
    component is asked for 0.5% more samples (as in Megatron), which changes the epoch count here."""
    a, sa = corpus(tmp_path, "a", 0, n_docs=40, seed=9)
    cfg = DataConfig(data_path=(["1.0", a] if weighted else [a]), split="100,0,0",
                     data_cache_path=str(tmp_path / "cache"), seed=3, num_workers=0)
    seq = 8
    tokens = sum(len(s) for s in sa)
    n = (tokens - 1) // seq  # exactly one epoch of samples; +0.5% needs a second epoch
    train, _, _ = build_train_valid_test_datasets(cfg, seq, [n, 0, 0], build_tokenizer("NullTokenizer", EOD))
    request = ref.component_request(n, 1.0) if weighted else n
    expected = ref.gpt_samples(sa, list(range(40)), seq, request, 3)
    assert len(train) == n
    assert [train[i]["tokens"].tolist() for i in range(n)] == [e[:-1] for e in expected[:n]]


@pytest.mark.parametrize("weighted", [False, True])
def test_a_per_split_blend_of_one_path_is_that_path(tmp_path, weighted):
    """`--train-data-path P` and `--train-data-path 1.0 P` both read P directly, with no 0.5% surplus
    (Megatron's per-split builder takes a one-path blend as the path; `--data-path 1.0 P` keeps the
    surplus, above): one epoch of samples here, in the reference's order for exactly n samples."""
    a, sa = corpus(tmp_path, "a", 0, n_docs=40, seed=9)
    cfg = DataConfig(train_data_path=(["1.0", a] if weighted else [a]), num_workers=0,
                     data_cache_path=str(tmp_path / "cache"), seed=3)
    seq = 8
    n = (sum(len(s) for s in sa) - 1) // seq
    train, _, _ = build_train_valid_test_datasets(cfg, seq, [n, 0, 0], build_tokenizer("NullTokenizer", EOD))
    expected = ref.gpt_samples(sa, list(range(40)), seq, n, 3)
    assert [train[i]["tokens"].tolist() for i in range(n)] == [e[:-1] for e in expected]


def test_one_blend_per_split_uses_every_document_of_its_datasets(tmp_path):
    """--train-data-path / --valid-data-path (Megatron-LM): the train split samples only corpus a (all of
    its documents, --split ignored), validation only corpus b; no test blend, no test dataset. The
    train samples equal the reference's for a "100,0,0" split of a."""
    a, sa = corpus(tmp_path, "a", 0, seed=5)
    b, _ = corpus(tmp_path, "b", 500, seed=6)
    cfg = DataConfig(train_data_path=[a], valid_data_path=[b], split="90,10,0", num_workers=0,
                     data_cache_path=str(tmp_path / "cache"), seed=7)
    seq, n = 8, 120
    train, valid, test = build_train_valid_test_datasets(cfg, seq, [n, 30, 10], build_tokenizer("NullTokenizer", EOD))
    assert test is None and len(train) == n and len(valid) == 30
    want = ref.gpt_samples(sa, list(range(60)), seq, n, 7)
    assert all(train[i]["tokens"].tolist() == want[i][:-1] for i in range(n))
    assert all(int(t) >= 500 for i in range(30) for t in valid[i]["tokens"] if int(t) != EOD)
    with pytest.raises(ValueError, match="--data-path and --train-data-path"):
        DataConfig(data_path=[a], valid_data_path=[b])
    with pytest.raises(ValueError, match="--train-data-path is required"):
        DataConfig(valid_data_path=[b])


def test_loader_batches_without_memory_maps_match(tmp_path):
    """--no-mmap-bin-files (DataConfig.mmap_bin_files=False) through the DataLoader with a worker
    process: the same batches as the memory-mapped default."""
    a, _ = corpus(tmp_path, "a", 0)
    tok = build_tokenizer("NullTokenizer", EOD)

    def batches(mmap_bin_files):
        cfg = DataConfig(data_path=[a], split="100,0,0", data_cache_path=str(tmp_path / "cache"), num_workers=1,
                         prefetch_factor=2, mmap_bin_files=mmap_bin_files)
        train, _, _ = build_train_valid_test_loaders(cfg, 4, 2, 16, 0, 1, train_samples=24, tokenizer=tok)
        return [b["tokens"] for b in train]

    mapped, reads = batches(True), batches(False)
    assert len(mapped) == 12
    assert all(torch.equal(x, y) for x, y in zip(mapped, reads))


def test_a_cached_blend_is_not_reused_for_other_weights(tmp_path):
    """The blending-index cache key holds the weights: `--data-path 0.2 A 0.8 B` after a run of `0.8 A 0.2 B`
    with the same --data-cache-path reads B 80 of every 100 samples, as the greedy reference (ref.blending)
    puts them and as the same blend built with --no-index-cache does (exactly)."""
    a, _ = corpus(tmp_path, "a", 0)
    b, _ = corpus(tmp_path, "b", 100, seed=1)
    tok, n = build_tokenizer("NullTokenizer", EOD), 100

    def train(weights, **kw):
        cfg = DataConfig(data_path=[str(weights[0]), a, str(weights[1]), b], split="100,0,0", num_workers=0, **kw)
        return build_train_valid_test_datasets(cfg, 8, [n, 0, 0], tok)[0]

    train((0.8, 0.2), data_cache_path=str(tmp_path / "cache"))
    got, want = train((0.2, 0.8), data_cache_path=str(tmp_path / "cache")), train((0.2, 0.8), no_index_cache=True)
    from_b = [int(np.any((got[i]["tokens"] >= 100) & (got[i]["tokens"] != EOD))) for i in range(n)]
    assert from_b == list(ref.blending([0.2, 0.8], n)[0]) and sum(from_b) == 80
    assert all(np.array_equal(got[i]["tokens"], want[i]["tokens"]) for i in range(n))


def test_each_appended_block_is_shuffled_with_its_own_seed(tmp_path):
    """train_samples [24, 16] (a resumed run that needs 16 more samples: data/train_blocks.py): samples 24..39
    are the 16-sample train split of --seed + 1 built alone (the reference), not a replay of the first block's
    --seed order."""
    a, _ = corpus(tmp_path, "a", 0, n_docs=8)
    tok, seq = build_tokenizer("NullTokenizer", EOD), 8
    cfg = DataConfig(data_path=[a], split="100,0,0", seed=5, no_index_cache=True, num_workers=0)
    loader, _, _ = build_train_valid_test_loaders(cfg, 4, 4, seq, 0, 1, train_samples=[24, 16], tokenizer=tok)
    blocks = loader.dataset
    alone = [build_train_valid_test_datasets(DataConfig(data_path=[a], split="100,0,0", seed=s, no_index_cache=True,
                                                        num_workers=0), seq, [n, 0, 0], tok)[0]
             for s, n in ((5, 24), (6, 16))]
    assert len(blocks) == 40
    assert all(np.array_equal(blocks[i]["tokens"], alone[0][i]["tokens"]) for i in range(24))
    assert all(np.array_equal(blocks[24 + i]["tokens"], alone[1][i]["tokens"]) for i in range(16))


def test_sampler_length_is_the_number_of_batches_it_yields():
    """len(loader) (the total of an evaluation's progress line) is the number of micro-batches the sampler
    yields, counted by iterating it."""
    for total, consumed, mbs, dp in ((10, 4, 2, 2), (11, 4, 2, 2), (7, 0, 3, 2), (24, 0, 3, 2)):
        for rank in range(dp):
            sampler = PretrainingBatchSampler(total, consumed, mbs, rank, dp)
            assert len(sampler) == len(list(sampler)), (total, consumed, mbs, dp, rank)


def test_a_phase_is_cut_where_the_runs_samples_end(tmp_path):
    """A phase's train_samples beyond the run's own samples: it holds only those left."""
    a, _ = corpus(tmp_path, "a", 0, n_docs=200, seed=3)
    b, _ = corpus(tmp_path, "b", 500, n_docs=200, seed=4)
    cfg = DataConfig(phases=[PhaseBlend([a], train_samples=40), PhaseBlend([b], train_samples=100)],
                     split="100,0,0", data_cache_path=str(tmp_path / "cache"), num_workers=0)
    train, _, _ = build_train_valid_test_datasets(cfg, 8, [100, 0, 0], build_tokenizer("NullTokenizer", EOD))
    assert len(train) == 100 and [len(p) for p in train.phases] == [40, 60]


def test_a_prefix_named_twice_in_a_blend_gets_both_shares(tmp_path):
    from megatron_zaya.data.loaders import blend_weights

    assert blend_weights(["30", "a", "20", "b", "50", "a"], ["a", "b"]) == pytest.approx([0.8, 0.2])
    assert blend_weights(["a", "b", "a"], ["a", "b"], {"a": 5, "b": 7}.get) == [10, 7]
    assert blend_weights(["b"], ["a", "b"]) == [0.0, 1.0]
    # built: the same samples as the blend with the shares summed, from one component per dataset
    a, _ = corpus(tmp_path, "a", 0, n_docs=200, seed=3)
    b, _ = corpus(tmp_path, "b", 500, n_docs=200, seed=4)
    twice, summed = ([build_train_valid_test_datasets(DataConfig(data_path=blend, split="100,0,0", num_workers=0,
                                                                 data_cache_path=str(tmp_path / name)), 8, [50, 0, 0],
                                                      build_tokenizer("NullTokenizer", EOD))[0]
                      for name, blend in (("twice", ["30", a, "20", b, "50", a]), ("summed", ["80", a, "20", b]))])
    assert len(twice.datasets) == 2 and all(d is not None for d in twice.datasets)
    assert all(torch.equal(torch.as_tensor(twice[i]["tokens"]), torch.as_tensor(summed[i]["tokens"]))
               for i in range(50))


def test_megatron_sample_counts_from_iterations():
    """Megatron-LM's sizes: train iters x GBS; (train iters // eval interval + 1) evaluations of eval iters x
    GBS; eval iters x GBS for the test split."""
    from megatron_zaya.data import megatron_num_samples

    assert megatron_num_samples(100, 8, 10, 2) == [800, (100 // 10 + 1) * 2 * 8, 16]
    assert megatron_num_samples(100, 8, 0, 2) == [800, 0, 16]


def test_a_prefix_of_several_splits_or_named_twice_is_listed_once():
    from megatron_zaya.data.loaders import dataset_prefixes

    cfg = DataConfig(train_data_path=["a", "b"], valid_data_path=["b"], test_data_path=["c", "a"])
    assert dataset_prefixes(cfg) == ["a", "b", "c"]
    # and a prefix named twice in one blend (it was listed twice: opened twice, an empty blend component)
    assert dataset_prefixes(DataConfig(data_path=["30", "a", "20", "b", "50", "a"])) == ["a", "b"]


@pytest.mark.parametrize("train_order", ["ab", "ba"])
def test_a_blend_interleaves_its_datasets_in_its_own_order(tmp_path, train_order):
    """The greedy interleave's ties go to the dataset the blend names first (Megatron-LM numbers a blend's
    datasets in its own order), whatever order the train blend or an earlier phase names them in: the test
    blend "0.5 b 0.5 a" starts with b either way, and its sources follow the reference loop on [b, a]."""
    a, _ = corpus(tmp_path, "a", 0, seed=5)
    b, _ = corpus(tmp_path, "b", 500, seed=6)
    first, second = (a, b) if train_order == "ab" else (b, a)
    cfg = DataConfig(train_data_path=["0.5", first, "0.5", second], test_data_path=["0.5", b, "0.5", a],
                     num_workers=0, no_index_cache=True)
    _, _, test = build_train_valid_test_datasets(cfg, 8, [10, 0, 10], build_tokenizer("NullTokenizer", EOD))
    sources = ["b" if int(test[i]["tokens"][0]) >= 500 else "a" for i in range(10)]
    assert sources == ["ba"[d] for d in ref.blending([0.5, 0.5], 10)[0]] == list("bababababa")
    phased = DataConfig(phases=[PhaseBlend(["0.5", first, "0.5", second], train_samples=10),
                                PhaseBlend(["0.5", b, "0.5", a])], split="100,0,0", num_workers=0,
                        no_index_cache=True)
    train, _, _ = build_train_valid_test_datasets(phased, 8, [20, 0, 0], build_tokenizer("NullTokenizer", EOD))
    assert ["b" if int(train[i]["tokens"][0]) >= 500 else "a" for i in range(10, 20)] == list("bababababa")
