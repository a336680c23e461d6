"""tools/text_generation_cli.py, the server's command-line client, starts without torch (1.1 s of its 1.2 s start
on this machine): it checks its flags with inference/request_fields.py, and the inference package loads its
model modules only when one of their names is used."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_client_checks_its_flags_without_importing_torch():
    code = ("import runpy, sys\n"
            "sys.argv = ['text_generation_cli.py', '--top-k', '2000', 'localhost:1']\n"
            "try:\n"
            "    runpy.run_path('tools/text_generation_cli.py', run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    print('exit', e.code, 'torch' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "exit 2 False", run.stdout + run.stderr[-3000:]
    assert "--top-k=2000: the server takes an integer in [0, 1000]" in run.stderr


def test_the_package_still_gives_its_names():
    from megatron_zaya import inference
    from megatron_zaya.inference.decode import generate

    assert inference.generate is generate and "SamplingParams" in inference.__all__
