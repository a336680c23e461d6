"""Importing the model leaves torch._dynamo unimported: it costs 1.5 s of every process's start (the tools, a
--dry-run, every subprocess the tests start), and only an optimizer or torch.compile needs it."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_importing_the_model_and_its_context_parallel_attention_does_not_import_dynamo():
    code = ("import sys, megatron_zaya.model, megatron_zaya.parallel.context; "
            "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo'))[:3])")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "[]", run.stdout
