"""Resharding: a checkpoint saved under a 4-process layout (TP2 x EP2 with ZeRO-1, and CP2 x EP2
without) loads under other 4-process layouts, under 2 (ZeRO-1 DP4 -> DP2) and under 1 process, and
training continues with the same losses (fp32, 1e-5 relative: different layouts reduce in different
orders); each rank restores the RNG states its rank saved; the replicas of a model tensor read it once
between them (in row shares, which differ between layouts), each rank JSON is read by one rank, and each
rank reads about its share of the files."""
import json
import os
import subprocess
import sys

import pytest

from ckpt_harness import ROOT, subprocess_env
from megatron_zaya.checkpoint import inspect_checkpoint, load_full_model_state
from tests.parallel.parallel_launcher import free_port

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ckpt_reshard_worker.py")


def _run(cmd, timeout=300, **env):
    result = subprocess.run(cmd, env={**subprocess_env(), **env}, cwd=ROOT, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    return result


def test_save_under_4_processes_load_under_other_layouts_and_1(tmp_path):
    d = str(tmp_path)
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
          "--master-port", str(free_port()), WORKER, d,
          "save:tp2-ep2-zero", "load:cp2-ep2", "load:dp-zero", "save:cp2-ep2:b", "load:tp2-ep2-zero:b",
          "save:tp4-zero:c", "load:tp2-ep2-zero:c", "loadfail:dp-zero", "loadfailstep:dp-zero", "save:dp-zero:e",
          "load:dp-zero:e", "loadbadjson:dp-zero:e", "save:dp-zero:f", "save:dp-zero:w:whole", "load:dp-zero:w"],
         CKPT_TEST_MIN_SHARE_BYTES="0")     # tensors over an even share: row shares
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
          "--master-port", str(free_port()), WORKER, d, "load:dp-zero:f"])
    _run([sys.executable, WORKER, d, "load:single", "load:single:b", "load:single:c"])
    results = {r["task"]: r for r in json.load(open(os.path.join(d, "losses.json")))}
    for saver, loaders in (("save:tp2-ep2-zero", ["load:cp2-ep2", "load:dp-zero", "load:single"]),
                           ("save:cp2-ep2:b", ["load:tp2-ep2-zero:b", "load:single:b"]),
                           # TP4 > 2 KV heads: each KV head is replicated on two ranks, and both write it.
                           ("save:tp4-zero:c", ["load:tp2-ep2-zero:c", "load:single:c"]),
                           ("save:dp-zero:f", ["load:dp-zero:f"]),
                           ("save:dp-zero:w:whole", ["load:dp-zero:w"])):
        want = results[saver]["losses"]
        for loader in loaders:
            got = results[loader]["losses"]
            assert sorted(got) == ["3", "4"], (loader, got)
            for step in got:
                assert abs(got[step] / want[step] - 1) < 1e-5, (saver, loader, step, got[step], want[step])
            # Each rank restores its own RNG states (torch, numpy, Python), saved by the rank of its number.
            saved = results[saver]["rng"]
            assert all(len(set(draws)) == len(draws) for draws in saved), saved     # the ranks' states differ
            world = results[loader]["world"]
            assert results[loader]["rng"] == [draws[:world] for draws in saved], (saver, loader)
    # Replicated model tensors are read by their owners in their group, in row shares for those over the group's
    # even share, and broadcast (replica_owners): under DP4 each element is read once in all, spread evenly over
    # the ranks (27% at most, 25% even); under CP2 x EP2 fewer than every rank reading all.
    dp4, cp2ep2, single = results["load:dp-zero"], results["load:cp2-ep2"], results["load:single"]
    assert sum(dp4["model_reads"]) == dp4["model_elements"] and max(dp4["model_reads"]) < dp4["model_elements"] * 0.3
    assert sum(cp2ep2["model_reads"]) < cp2ep2["model_elements"] * 2 and min(cp2ep2["model_reads"]) > 0
    assert single["model_reads"] == [single["model_elements"]]
    # Without ZeRO-1 (CP2 x EP2) the replicated optimizer state is read by owners too: a dense piece once in
    # all, an expert piece once per expert-parallel rank, so fewer than twice what one process reads.
    assert 0 < sum(cp2ep2["optim_reads"]) < 2 * single["optim_reads"][0]
    assert dp4["json_reads"] == [1, 1, 1, 1] and single["json_reads"] == [4]    # each rank JSON read once
    # Another TP layout: each rank reads the saved pieces that overlap its blocks (several runs per dimension:
    # the fused gate/up weight, KV-head replicas), not whole tensors: TP4 -> TP2 x EP2 under 2x the model.
    tp4_to_tp2 = results["load:tp2-ep2-zero:c"]["model_file_elements"]
    assert sum(tp4_to_tp2) < 2 * single["model_elements"], (tp4_to_tp2, single["model_elements"])
    # Tensors saved whole (before row shares, or under a larger group) read in row shares: each owner reads the
    # bytes of its rows alone (RankFile.get_box), each element once in all.
    whole = [json.load(open(os.path.join(d, "w", "iter_0000002", f"rank_{rank:05d}.json")))["entries"]
             for rank in range(4)]
    assert all(e["ranges"][0] == [[0, e["shape"][0]]] for entries in whole for k, e in entries.items()
               if k.startswith("model/") and e["shape"])           # saved whole (the library's 16 MiB floor)
    assert sum(results["load:dp-zero:w"]["model_file_elements"]) == dp4["model_elements"]
    # ZeRO-1 state under another TP / EP layout (TP2 x EP2 -> DP4): each rank's flat pieces from the overlapping
    # parts of the saved ones (blocks.flat_part_from_pieces), its quarter of the state, where it read all of it.
    total_state = single["optim_elements"][0]
    assert max(dp4["optim_elements"]) < 0.26 * total_state, (dp4["optim_elements"], total_state)
    # ZeRO-1 under half the data-parallel ranks: each rank reads the saved flat pieces that overlap its shards,
    # about half of the optimizer state (the DP4 ranks read a quarter each), not every piece of its parameters.
    state = sum(results["load:dp-zero:e"]["optim_elements"])
    assert max(results["load:dp-zero:f"]["optim_elements"]) < 0.55 * state, (results["load:dp-zero:f"], state)
    # A load under the layout of the save opens the rank's own tensor file alone: the step counts, in most rank
    # files, and the balancer state, in rank 0's, are read once in all and exchanged (SharedReads.whole_tensors).
    assert results["load:dp-zero:e"]["files_read"] == [1, 1, 1, 1] and results["load:dp-zero:e"]["losses"] == {
        step: loss for step, loss in results["save:dp-zero:e"]["losses"].items() if step in ("3", "4")}
    writers = {}                 # a DP4 save: each model row written once, by all four ranks between them
    for rank in range(4):
        with open(os.path.join(d, "e", "iter_0000002", f"rank_{rank:05d}.json")) as f:
            for key, entry in json.load(f)["entries"].items():
                if key.startswith("model/"):
                    rows = entry["ranges"][0] if entry["shape"] else [[0, 1]]
                    writers.setdefault(key, []).extend((a, b, rank) for a, b in rows)
    assert len(writers) == dp4["model_tensors"]
    for key, rows in writers.items():
        edges = sorted(rows)
        assert edges[0][0] == 0 and all(prev[1] == nxt[0] for prev, nxt in zip(edges, edges[1:])), (key, rows)
    assert sorted({rank for rows in writers.values() for *_, rank in rows}) == [0, 1, 2, 3]
    assert max(len(rows) for rows in writers.values()) > 1          # at least one tensor saved in row shares
    damaged = [open(os.path.join(d, f"loadbadjson_{rank}.txt")).read() for rank in range(4)]
    assert all("iter_0000002/rank_00002.json: corrupt (does not match the manifest" in m for m in damaged), damaged
    assert "found by rank" not in damaged[2] and all("(found by rank 2)" in damaged[r] for r in (0, 1, 3)), damaged
    for task, what in (("loadfail", "model/"), ("loadfailstep", "optim/")):
        failed = [open(os.path.join(d, f"{task}_{rank}.txt")).read() for rank in range(4)]
        assert failed[1].startswith("injected failure reading " + what), failed
        assert all(m == "another rank could not read its share of the checkpoint (see its error)"
                   for m in failed[:1] + failed[2:]), failed
    assert results["load:single"]["loaded_from"]["use_distributed_optimizer"]
    assert results["load:single"]["loaded_from"]["tensor_model_parallel_size"] == 2
    # The layout is described; the full model assembles on one CPU process.
    report = inspect_checkpoint(os.path.join(d, "ckpt"))
    assert report["ok"] and report["layout"]["world_size"] == 4 and len(report["ranks"]) == 4
    state, config, info = load_full_model_state(os.path.join(d, "ckpt"))
    assert state["layers.0.moe.experts.gate_up_weight"].shape[0] == config.num_experts
    assert info["layout"]["expert_model_parallel_size"] == 2
    # The TP4 checkpoint (overlapping KV-head replicas) assembles too: the path of convert_checkpoint to-hf.
    state, _config, info = load_full_model_state(os.path.join(d, "c"))
    assert info["layout"]["tensor_model_parallel_size"] == 4
    assert state["layers.0.attention.conv_depthwise.weight"].shape[0] == 6 * 32


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "megatron_zaya", "training", "distributed_runtime.py")),
                    reason="the distributed training runtime has not landed yet")
def test_pretrain_under_torchrun_sigusr1_saves_and_resumes(ckpt_corpus, ckpt_cache, tmp_path):
    """A SIGUSR1 to every training process (2 ranks, ZeRO-1): a complete checkpoint, exit code 0;
    --load resumes, here in one process (resharding through the real trainer)."""
    import signal
    import time
    from ckpt_harness import RUNNER, flags
    from megatron_zaya.checkpoint.format import read_latest
    save = str(tmp_path / "dist")
    losses = str(tmp_path / "losses.json")
    env = subprocess_env()
    piddir = tmp_path / "pids"
    piddir.mkdir()
    env.update(CKPT_TEST_SLOW_STEP="0.05", CKPT_TEST_LOSSES=losses, CKPT_TEST_PIDDIR=str(piddir))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), RUNNER,
           *flags(ckpt_corpus, 500, "--save", save, "--use-distributed-optimizer", cache=ckpt_cache)]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 150
        while not (os.path.exists(losses) and len(json.load(open(losses))) >= 2):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-4000:]
            time.sleep(0.1)
        for pid_file in piddir.iterdir():       # every training process, as Slurm signals the job step's tasks
            os.kill(int(pid_file.read_text()), signal.SIGUSR1)
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-4000:]
    saved = read_latest(save)
    assert saved is not None and inspect_checkpoint(save)["ok"]
    assert inspect_checkpoint(save)["layout"]["world_size"] == 2
    # Resume in ONE process from the 2-process ZeRO-1 checkpoint (DistributedMuon + sharded AdamW state).
    from ckpt_harness import train
    resumed = train(flags(ckpt_corpus, saved + 1, "--save", save, "--load", save, cache=ckpt_cache))
    assert resumed.trainer.checkpointer.loaded["iteration"] == saved
    assert resumed.trainer.checkpointer.loaded["optimizer"] and sorted(resumed.losses) == [saved + 1]
    assert read_latest(save) == saved + 1
    momentum = [s for s in resumed.trainer.optimizer.optimizers["muon"].state.values() if "momentum_buffer" in s]
    assert momentum and all(s["momentum_buffer"].abs().sum() > 0 for s in momentum)


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "megatron_zaya", "training", "distributed_runtime.py")),
                    reason="the distributed training runtime has not landed yet")
def test_kill9_one_rank_during_a_save_keeps_the_previous_checkpoint(ckpt_corpus, ckpt_cache, tmp_path):
    import signal
    import time
    from ckpt_harness import RUNNER, flags, train
    from megatron_zaya.checkpoint.format import list_complete, read_latest
    save = str(tmp_path / "dist")
    piddir = tmp_path / "pids"
    piddir.mkdir()
    env = subprocess_env()
    env.update(CKPT_TEST_HANG_SAVE_AT="4", CKPT_TEST_HANG_SAVE_RANK="1", CKPT_TEST_PIDDIR=str(piddir))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), RUNNER,
           *flags(ckpt_corpus, 6, "--save", save, "--save-interval", "2", cache=ckpt_cache)]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 150

        def writing_iter4():
            parts = [n for n in os.listdir(save) if n.startswith("iter_0000004.partial")] if os.path.isdir(save) else []
            return parts and os.path.exists(os.path.join(save, parts[0], "rank_00001.safetensors"))
        while not writing_iter4():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-4000:]
            time.sleep(0.05)
        os.kill(int((piddir / "1.pid").read_text()), signal.SIGKILL)      # rank 1 dies in the middle of the save
        proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0
    assert read_latest(save) == 2 and list_complete(save) == [2]
    assert inspect_checkpoint(save)["ok"]
    resumed = train(flags(ckpt_corpus, 3, "--load", save, cache=ckpt_cache))   # 2 ranks -> 1 process
    assert resumed.trainer.checkpointer.loaded["iteration"] == 2 and sorted(resumed.losses) == [3]
