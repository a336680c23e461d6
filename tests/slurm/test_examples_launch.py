"""examples/: the ZAYA1-base three-phase recipe, the single-node 8-GPU and the CPU examples.

    python -m pytest -q tests/slurm/test_examples_launch.py

The YAML configs are parsed by pretrain_zaya.py's own argument parser at the world size they are
meant for; the recipe script is run against a recording stand-in for sbatch; the CPU quickstart
really trains (a few iterations on a small generated corpus).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys

import pytest
import yaml

from slurm_jobs import REPO

EX = os.path.join(REPO, "examples")
RECIPE = os.path.join(EX, "zaya1_base", "run_zaya1_base.sh")
TRAINER_READY = os.path.isfile(os.path.join(REPO, "pretrain_zaya.py")) and os.path.isfile(
    os.path.join(REPO, "megatron_zaya", "arguments.py"))
needs_trainer = pytest.mark.skipif(not TRAINER_READY, reason="pretrain_zaya.py / megatron_zaya.arguments not there yet")


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "ZAYA_"))}
    env.update(extra)
    return env


def load(name: str) -> dict:
    with open(os.path.join(EX, name)) as f:
        return {k.replace("_", "-"): v for k, v in yaml.safe_load(f).items()}


PARSE = r"""
import json, os, sys
from megatron_zaya.arguments import parse_args
out = {}
for config, world in json.loads(sys.argv[1]):
    os.environ["WORLD_SIZE"] = str(world)
    r = parse_args(["--config", config, "--data-path", sys.argv[2],   # any tokenizer: the files name none
                    "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "800",
                    "--dry-run"])      # (checked as a login node checks a GPU job: no host-memory refusal)
    out[os.path.basename(config)] = dict(
        seq=r.model.seq_length, rope=r.model.rotary_base, cp=r.parallel.context_parallel_size,
        dp=r.parallel.data_parallel_size, gbs=r.train.global_batch_size, mbs=r.train.micro_batch_size,
        iters=r.train.train_iters, exit=r.train.exit_interval, layers=r.model.num_layers)
print(json.dumps(out))
"""
CONFIGS = [("zaya1_base/phase1_4k.yaml", 1024), ("zaya1_base/phase2_4k_mix.yaml", 1024),
           ("zaya1_base/phase3_32k.yaml", 1024), ("single_node_8gpu.yaml", 8), ("cpu_zaya1_tiny.yaml", 2)]


@pytest.fixture(scope="module")
def data_prefix(tmp_path_factory):
    """A real (tiny) indexed dataset, since the parser checks that --data-path exists."""
    d = tmp_path_factory.mktemp("exdata")
    sys.path.insert(0, REPO)
    from megatron_zaya.data.synthetic import TextGenerator

    gen = TextGenerator(seed=2, lexicon_size=1500)
    with open(d / "c.jsonl", "w") as f:
        for _ in range(200):
            f.write(json.dumps({"text": gen.document(max_sentences=8)}) + "\n")
    subprocess.run([sys.executable, "tools/train_tokenizer.py", "--input", str(d / "c.jsonl"), "--vocab-size", "800",
                    "--output-prefix", str(d / "sp"), "--num-threads", "1"], cwd=REPO, check=True, capture_output=True)
    subprocess.run([sys.executable, "tools/preprocess_data.py", "--input", str(d / "c.jsonl"), "--output-prefix",
                    str(d / "c"), "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model",
                    str(d / "sp.model"), "--append-eod", "--no-progress"], cwd=REPO, check=True, capture_output=True)
    return {"prefix": str(d / "c_text_document"), "jsonl": str(d / "c.jsonl"), "dir": str(d)}


@pytest.fixture(scope="module")
def parsed(data_prefix) -> dict:
    """Every example config through pretrain_zaya.py's parser, each at the world size it is meant for."""
    combos = [(os.path.join(EX, c), w) for c, w in CONFIGS]
    r = subprocess.run([sys.executable, "-c", PARSE, json.dumps(combos), data_prefix["prefix"]], cwd=REPO,
                       env=clean_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@needs_trainer
def test_recipe_configs_parse_at_1024_ranks_and_chain(parsed):
    p1, p2, p3 = parsed["phase1_4k.yaml"], parsed["phase2_4k_mix.yaml"], parsed["phase3_32k.yaml"]
    assert p1["layers"] == 40                                   # the zaya1-base preset
    assert (p1["seq"], p1["rope"], p1["cp"], p1["dp"]) == (4096, 10000, 1, 1024)
    assert (p2["seq"], p2["rope"], p2["cp"]) == (4096, 10000, 1)
    assert (p3["seq"], p3["rope"], p3["cp"], p3["dp"]) == (32768, 1_000_000, 2, 512)
    # 16.8M tokens per step in every phase; one schedule, each phase ends where the next begins.
    assert {p["gbs"] * p["seq"] for p in (p1, p2, p3)} == {4096 * 4096}
    assert p1["iters"] == p2["iters"] == p3["iters"] == 834465
    assert (p1["exit"], p2["exit"], p3["exit"]) == (476837, 715256, None)
    # 8T + 4T + 2T tokens.
    assert abs(476837 * 4096 * 4096 - 8e12) < 4096 * 4096
    assert abs((715256 - 476837) * 4096 * 4096 - 4e12) < 4096 * 4096
    assert abs((834465 - 715256) * 4096 * 4096 - 2e12) < 4096 * 4096
    # The schedule keys are identical across phases (only data, context and layout change).
    c1, c2, c3 = (load(f"zaya1_base/{n}") for n in ("phase1_4k.yaml", "phase2_4k_mix.yaml", "phase3_32k.yaml"))
    for key in ("train-iters", "lr", "min-lr", "lr-warmup-iters", "lr-decay-style", "lr-wsd-decay-iters", "optimizer",
                "weight-decay", "seed", "preset", "tokenizer-type"):
        assert c1[key] == c2[key] == c3[key], key
    # The END_ITERs of the recipe script match the configs.
    script = open(RECIPE).read()
    assert re.search(r"END_ITERS=\(\"\" 476837 715256 834465\)", script)


@needs_trainer
def test_single_node_and_cpu_configs_parse(parsed):
    s = parsed["single_node_8gpu.yaml"]
    assert s["dp"] == 8 and s["gbs"] % (s["mbs"] * 8) == 0 and s["layers"] == 40
    c = parsed["cpu_zaya1_tiny.yaml"]
    assert c["dp"] == 2 and c["layers"] == 4


def fake_sbatch(tmp_path) -> tuple[str, str]:
    """A stand-in sbatch on PATH that records its arguments and the recipe's environment."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "sbatch.json"
    script = bindir / "sbatch"
    script.write_text("#!/usr/bin/env python3\nimport json, os, sys\n"
                      f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(record)!r}, 'w'))\n"
                      "print('Submitted batch job 4242')\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(bindir), str(record)


def test_recipe_script_submits_phases_with_their_settings(tmp_path):
    bindir, record = fake_sbatch(tmp_path)
    root = tmp_path / "ckpt"
    env = clean_env(PATH=bindir + os.pathsep + os.environ["PATH"], CKPT_ROOT=str(root), DATA_ROOT="/data/z",
                    TOKENIZER_MODEL="/tok/gemma3", SBATCH_ARGS="--account=proj --partition=mi300x")
    r = subprocess.run(["bash", RECIPE, "all"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rec = json.load(open(record))
    assert rec["argv"] == ["--job-name=zaya1-base-p1", f"--chdir={REPO}", "--account=proj", "--partition=mi300x",
                           os.path.join(REPO, "run_mi300x.sh")]
    e = rec["env"]
    assert e["CONFIG"] == os.path.join(EX, "zaya1_base", "phase1_4k.yaml")
    assert e["DATA_PATH"].split()[:2] == ["70", "/data/z/web_text_document"]
    assert e["CKPT_DIR"] == str(root / "phase1") and "INIT_CKPT_DIR" not in e
    assert e["END_ITER"] == "476837"
    assert e["ON_SUCCESS_CMD"] == f"bash {RECIPE} phase2 --chain"

    # Phase 2 refuses to start before phase 1 is complete ...
    r = subprocess.run(["bash", RECIPE, "phase2", "--chain"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "phase 1 is not complete" in r.stderr
    # ... and starts from phase 1's checkpoint once it is, keeping nodes found bad out.
    (root / "phase1" / "latest_checkpointed_iteration.txt").write_text("476837\n")
    env["ZAYA_EXCLUDE"] = "node017"
    r = subprocess.run(["bash", RECIPE, "phase2", "--chain"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rec = json.load(open(record))
    assert "--exclude=node017" in rec["argv"]
    e = rec["env"]
    assert e["CONFIG"].endswith("phase2_4k_mix.yaml") and e["INIT_CKPT_DIR"] == str(root / "phase1")
    assert e["CKPT_DIR"] == str(root / "phase2") and e["END_ITER"] == "715256"
    assert e["ON_SUCCESS_CMD"] == f"bash {RECIPE} phase3 --chain"
    assert e["DATA_PATH"].split()[:4] == ["30", "/data/z/web_text_document", "25", "/data/z/code_text_document"]

    # Phase 3 is the last: nothing chained after it.
    (root / "phase2").mkdir(exist_ok=True)
    (root / "phase2" / "latest_checkpointed_iteration.txt").write_text("715256\n")
    r = subprocess.run(["bash", RECIPE, "phase3"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    e = json.load(open(record))["env"]
    assert e["CONFIG"].endswith("phase3_32k.yaml") and "ON_SUCCESS_CMD" not in e and e["END_ITER"] == "834465"


def test_recipe_never_resubmits_a_complete_phase(tmp_path):
    """A phase resumed at its end iteration would train past it (--exit-interval is checked after a
    step): `all` goes on with the first phase not complete, a phase asked for by name is refused."""
    bindir, record = fake_sbatch(tmp_path)
    root = tmp_path / "ckpt"
    env = clean_env(PATH=bindir + os.pathsep + os.environ["PATH"], CKPT_ROOT=str(root), DATA_ROOT="/data/z",
                    TOKENIZER_MODEL="/tok/gemma3")
    for phase, end in (("phase1", 476837), ("phase2", 715256)):
        (root / phase).mkdir(parents=True)
        (root / phase / "latest_checkpointed_iteration.txt").write_text(f"{end}\n")
    r = subprocess.run(["bash", RECIPE, "phase1"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "phase 1 is already complete" in r.stderr, r.stderr
    assert not os.path.exists(record)
    r = subprocess.run(["bash", RECIPE, "all"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rec = json.load(open(record))
    assert rec["argv"][0] == "--job-name=zaya1-base-p3" and rec["env"]["END_ITER"] == "834465"
    assert rec["env"]["INIT_CKPT_DIR"] == str(root / "phase2")
    assert "going on with phase 2" in r.stderr and "going on with phase 3" in r.stderr
    os.remove(record)
    (root / "phase3").mkdir(exist_ok=True)     # the submission made it
    (root / "phase3" / "latest_checkpointed_iteration.txt").write_text("834465\n")
    r = subprocess.run(["bash", RECIPE, "phase3", "--chain"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "every phase is complete" in r.stderr, r.stderr
    assert not os.path.exists(record)


def test_recipe_counts_a_final_save_interrupted_before_its_latest_file(tmp_path):
    """Phase 1's final save published iter_0476837 (COMPLETE written) but stopped before the latest file moved
    on from 476800: the launcher and the trainer count 476837, so the recipe does too, and phase 2 goes (it
    was refused as 'phase 1 is not complete', and phase 1's resubmission trained nothing, for ever)."""
    bindir, record = fake_sbatch(tmp_path)
    root = tmp_path / "ckpt"
    env = clean_env(PATH=bindir + os.pathsep + os.environ["PATH"], CKPT_ROOT=str(root), DATA_ROOT="/data/z",
                    TOKENIZER_MODEL="/tok/gemma3")
    (root / "phase1" / "iter_0476837").mkdir(parents=True)
    latest = root / "phase1" / "latest_checkpointed_iteration.txt"
    latest.write_text("476800\n")
    os.utime(latest, (1_700_000_000, 1_700_000_000))         # written before the newer folder completed
    (root / "phase1" / "iter_0476837" / "COMPLETE").write_text("")
    r = subprocess.run(["bash", RECIPE, "phase2"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rec = json.load(open(record))
    assert rec["argv"][0] == "--job-name=zaya1-base-p2" and rec["env"]["INIT_CKPT_DIR"] == str(root / "phase1")


def test_recipe_dry_run_shows_the_phase_a_real_run_submits(tmp_path):
    """Phase 1 complete: `all --dry-run` shows phase 2, as `all` submits it; `phase1 --dry-run` says that a real
    run refuses it."""
    root = tmp_path / "ckpt"
    (root / "phase1").mkdir(parents=True)
    (root / "phase1" / "latest_checkpointed_iteration.txt").write_text("476837\n")
    env = clean_env(CKPT_ROOT=str(root), DATA_ROOT="/data/z", TOKENIZER_MODEL="/tok/gemma3")
    r = subprocess.run(["bash", RECIPE, "all", "--dry-run"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("# phase 2: phase2_4k_mix.yaml"), r.stdout + r.stderr
    assert "refused" not in r.stdout
    r = subprocess.run(["bash", RECIPE, "phase1", "--dry-run"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "# note: without --dry-run this is refused: phase 1 is already complete" in r.stdout


def test_recipe_and_single_node_dry_runs():
    r = subprocess.run(["bash", RECIPE, "phase3", "--dry-run"], env=clean_env(CKPT_ROOT="/ckpt/z"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    srun = [line for line in r.stdout.splitlines() if line.startswith("srun ")]
    assert len(srun) == 1
    assert "--config " + os.path.join(EX, "zaya1_base", "phase3_32k.yaml") in srun[0]
    assert "--save /ckpt/z/phase3 --load /ckpt/z/phase2" in srun[0]
    # a preview before the checkpoints exist, which says what a real run would refuse
    assert "# note: without --dry-run this is refused: phase 2 is not complete: /ckpt/z/phase2 is at iteration 0" \
        in r.stdout, r.stdout
    r = subprocess.run(["bash", os.path.join(EX, "single_node_8gpu.sh"), "--train-iters", "5"],
                       env=clean_env(DRY_RUN="1", DATA_PATH="/d/x_text_document", TOKENIZER_MODEL="/tok"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--nproc-per-node 8" in r.stdout and "single_node_8gpu.yaml" in r.stdout
    assert r.stdout.rstrip().endswith("--train-iters 5") and "--tokenizer-type" not in r.stdout


def test_single_node_example_takes_a_sentencepiece_model_with_tokenizer_type(data_prefix):
    """The config names HuggingFaceTokenizer; TOKENIZER_TYPE=GPTSentencePieceTokenizer makes a SentencePiece .model
    work (the printed command's dry run passes), and without it the error says what the file is and which
    --tokenizer-type reads it (the config's type is not on the command line the user typed)."""
    model = os.path.join(data_prefix["dir"], "sp.model")
    for tokenizer_type in ("GPTSentencePieceTokenizer", ""):
        r = subprocess.run(["bash", os.path.join(EX, "single_node_8gpu.sh"), "--train-iters", "50", "--lr-warmup-iters",
                            "5", "--lr-wsd-decay-iters", "10"],
                           env=clean_env(DRY_RUN="1", DATA_PATH=data_prefix["prefix"], TOKENIZER_MODEL=model,
                                         TOKENIZER_TYPE=tokenizer_type),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        command = shlex.split(r.stdout)
        trainer = command[command.index(os.path.join(REPO, "pretrain_zaya.py")):]
        dry = subprocess.run([sys.executable, *trainer, "--dry-run", "--data-cache-path",
                              os.path.join(data_prefix["dir"], "cache")], cwd=REPO,
                             env=clean_env(WORLD_SIZE="8"), capture_output=True, text=True, timeout=180)
        if tokenizer_type:
            assert "--tokenizer-type GPTSentencePieceTokenizer" in r.stdout
            assert dry.returncode == 0, dry.stderr[-2000:]
        else:
            assert dry.returncode == 2, dry.stderr[-2000:]
            assert (f"--tokenizer-model {model}: not a valid Hugging Face tokenizer.json, which --tokenizer-type "
                    "HuggingFaceTokenizer reads") in dry.stderr, dry.stderr[-2000:]
            assert "it is a SentencePiece model: pass --tokenizer-type GPTSentencePieceTokenizer" in dry.stderr
