"""training/cpu_allocator.py: a loop that makes and frees two 64 MiB tensors per iteration, as a
training step does with its large activations. With freed memory kept, the iterations after a warm-up
reuse pages already faulted in (the kernel's minor-fault counter barely moves); with glibc's defaults
(blocks over 32 MiB are mmapped and unmapped) every iteration faults all their pages in again. Each
case runs in a fresh interpreter. The training setup applies it on CPU: after `build_runtime` the
same loop does not fault its pages in again."""
import os
import subprocess
import sys

import pytest

KEEP = """
from megatron_zaya.training.cpu_allocator import keep_freed_memory
kept = keep_freed_memory()
assert keep_freed_memory() == kept          # applied once per process, the same answer again
"""
BUILD_RUNTIME = """
from types import SimpleNamespace
from megatron_zaya.training.setup import build_runtime
run = SimpleNamespace(parallel=SimpleNamespace(world_size=1, use_distributed_optimizer=False),
                      train=SimpleNamespace(bf16=False))
assert build_runtime(run).device.type == "cpu"
kept = 1
"""
PROBE = r"""
import resource, sys, torch
{setup}
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
source = torch.ones(16 << 20, dtype=torch.bfloat16)
def step():
    y = source.float() * 2                 # two 64 MiB fp32 tensors, freed at the end
    del y
for _ in range(10):
    step()
before = faults()
for _ in range(10):
    step()
print(int(kept), (faults() - before) // 10)
"""


def run_probe(keep: str, setup: str = KEEP) -> tuple[int, int]:
    env = dict(os.environ, MEGATRON_ZAYA_KEEP_FREED_MEMORY=keep, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", PROBE.replace("{setup}", setup)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kept, faults = out.stdout.split()
    return int(kept), int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_kept_memory_is_not_faulted_in_again():
    kept, faults_kept = run_probe("1")
    assert kept == 1
    off, faults_default = run_probe("0")
    assert off == 0
    pages = (64 << 20) // 4096             # of one tensor; faults per iteration are compared
    assert faults_default > pages / 2, faults_default      # glibc unmapped and faulted again
    assert faults_kept < pages / 4, faults_kept             # reused (measured 0 to 1/10 of them)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_training_setup_keeps_freed_memory_on_cpu():
    _, faults = run_probe("1", BUILD_RUNTIME)
    assert faults < (64 << 20) // 4096 / 4, faults
