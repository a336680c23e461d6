"""The inference tools' cheap flag checks (megatron_zaya/inference/cli_checks.py) at their boundaries:
the last id inside a vocabulary, the position limit met exactly, a tokenizer exactly the size of the
embedding, output paths that are folders or read-only files, and the atomic --output-json write."""
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.errors import UserInputError
from megatron_zaya.inference.cli_checks import (check_prompts_fit, check_tokenizer_fits, check_writable_output,
                                             write_output_json)

CONFIG = model_config_from_preset("zaya1-tiny", vocab_size=512, seq_length=64, max_position_embeddings=64)


def test_prompt_ids_and_eod_at_the_last_id_of_the_vocabulary_are_accepted():
    check_prompts_fit(CONFIG, [[0, 511]], 1, eod_id=511)
    check_prompts_fit(CONFIG, [[0, 499]], 1, eod_id=499, tokenizer_vocab=500)   # the tokenizer's last id


@pytest.mark.parametrize("prompt, eod, tokenizer_vocab, said", [
    ([0, 512], None, None, "token ids [512] outside the checkpoint's vocabulary [0, 512)"),
    ([0, 500], None, 500, "token ids [500] outside the tokenizer's vocabulary [0, 500)"),
    ([0], 512, None, "--eod-id=512 is outside the checkpoint's vocabulary [0, 512)"),
    ([0], 500, 500, "--eod-id=500 is outside the tokenizer's vocabulary [0, 500)"),
    ([0], -1, None, "--eod-id=-1"),
])
def test_ids_one_past_the_vocabulary_are_refused(prompt, eod, tokenizer_vocab, said):
    with pytest.raises(UserInputError, match=re.escape(said)):
        check_prompts_fit(CONFIG, [prompt], 1, eod_id=eod, tokenizer_vocab=tokenizer_vocab)


def test_a_prompt_may_fill_the_positions_exactly():
    check_prompts_fit(CONFIG, [[1] * 60], 4, eod_id=None)            # 60 + 4 == 64 positions
    with pytest.raises(UserInputError, match="exceeds the checkpoint's max_position_embeddings 64"):
        check_prompts_fit(CONFIG, [[1] * 60], 5, eod_id=None)


def test_a_tokenizer_as_large_as_the_embedding_fits():
    args = SimpleNamespace(tokenizer_type="NullTokenizer", tokenizer_model="511")
    check_tokenizer_fits(SimpleNamespace(vocab_size=512), CONFIG, args)
    check_tokenizer_fits(None, CONFIG, args)
    with pytest.raises(UserInputError, match="vocabulary 513 is larger than the checkpoint's 512 embedding rows"):
        check_tokenizer_fits(SimpleNamespace(vocab_size=513), CONFIG, args)


def test_writable_output_refuses_a_folder_for_a_file_and_a_file_for_a_folder(tmp_path):
    check_writable_output("--output-json", str(tmp_path / "out.json"))
    check_writable_output("--tensorboard-dir", str(tmp_path / "new" / "deeper"), is_dir=True)
    with pytest.raises(UserInputError, match="is a folder, expected a file name"):
        check_writable_output("--output-json", str(tmp_path))
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserInputError, match="exists and is not a folder"):
        check_writable_output("--tensorboard-dir", str(tmp_path / "file"), is_dir=True)


def test_an_output_inside_the_load_folder_is_refused(tmp_path):
    """--output-json ckpt/iter_N/metadata.json (or an HF folder's config.json) replaced a file of the checkpoint
    being read, which then no longer loaded; also through a link to the folder. Beside it is fine."""
    load = tmp_path / "ckpt"
    (load / "iter_0000002").mkdir(parents=True)
    (tmp_path / "link").symlink_to(load)
    for path in (load / "iter_0000002" / "metadata.json", load / "results.json", tmp_path / "link" / "x.json"):
        with pytest.raises(UserInputError, match="inside the --load folder .*: writing there would change"):
            check_writable_output("--output-json", str(path), load=str(load))
    check_writable_output("--output-json", str(tmp_path / "ckpt_results.json"), load=str(load))
    check_writable_output("--output-json", str(load / "results.json"), load=str(load / "iter_0000002"))


def test_writable_output_refuses_an_existing_file_that_cannot_be_written(tmp_path, monkeypatch):
    """A read-only --output-json (chmod 444, another user's file) is refused up front; as root chmod blocks
    nothing, so os.access stands in for it."""
    target = tmp_path / "results.json"
    target.write_text('{"old": true}')
    check_writable_output("--output-json", str(target))
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == target else real_access(path, mode))
    with pytest.raises(UserInputError, match="results.json: exists and cannot be written"):
        check_writable_output("--output-json", str(target))


def test_output_json_is_replaced_whole_or_kept_and_a_failed_write_is_one_line(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    target.write_text('{"old": true}')
    write_output_json("--output-json", str(target), {"new": Path("p")})     # default=str for odd values
    assert json.loads(target.read_text()) == {"new": "p"}

    def refuse(src, dst):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(UserInputError, match=r"--output-json .*results.json: cannot write \(Operation not permitted"):
        write_output_json("--output-json", str(target), {"newer": 1})
    assert json.loads(target.read_text()) == {"new": "p"} and os.listdir(tmp_path) == ["results.json"]


def test_output_json_through_a_symlink_or_into_a_pipe(tmp_path):
    """A symlinked --output-json replaces the file it names (the link stays); a pipe (`--output-json >(jq .)`,
    /dev/fd/N; /dev/stdout) is written as it is, not renamed over."""
    (tmp_path / "real.json").write_text("{}\n")
    (tmp_path / "link.json").symlink_to("real.json")
    write_output_json("--output-json", str(tmp_path / "link.json"), {"a": 1})
    assert (tmp_path / "link.json").is_symlink() and json.loads((tmp_path / "real.json").read_text()) == {"a": 1}
    read_end, write_end = os.pipe()
    try:
        check_writable_output("--output-json", f"/dev/fd/{write_end}")
        write_output_json("--output-json", f"/dev/fd/{write_end}", {"b": 2})
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            assert json.loads(pipe.read()) == {"b": 2}
    finally:
        for fd in (read_end, write_end):
            try:
                os.close(fd)
            except OSError:
                pass


def test_threads_zero_keeps_torchs_default():
    """--threads 0 is allowed (torch's default); -1 is refused."""
    from megatron_zaya.errors import UserInputError
    from megatron_zaya.inference.cli_checks import check_threads
    check_threads(0)
    check_threads(None)
    with pytest.raises(UserInputError):
        check_threads(-1)


def test_a_missing_folder_is_named(tmp_path):
    """The message says the folder does not exist."""
    with pytest.raises(UserInputError, match=r"folder .*nope does not exist"):
        check_writable_output("--output-json", str(tmp_path / "nope" / "x.json"))


def test_an_unwritable_folder_is_refused(tmp_path, monkeypatch):
    """A folder the user cannot write in is refused up front (as root, os.access stands in for chmod)."""
    real = os.access
    monkeypatch.setattr(os, "access",
                        lambda p, mode: False if Path(p) == tmp_path and mode & os.W_OK else real(p, mode))
    with pytest.raises(UserInputError, match="cannot write in"):
        check_writable_output("--output-json", str(tmp_path / "x.json"))


def test_output_json_to_dev_stdout_redirected_to_a_log_appends_to_it(tmp_path):
    """`--output-json /dev/stdout` in a job whose stdout is its log file (Slurm's, `> log`): the JSON goes after
    what was printed, and what is printed later follows it (a rename over the log lost both)."""
    import subprocess
    import sys
    (tmp_path / "out.json").symlink_to("/dev/stdout")
    code = ("import os, sys\n"
            "from megatron_zaya.inference.cli_checks import write_output_json\n"
            "print('line 1', flush=True)\n"
            "write_output_json('--output-json', sys.argv[1].replace('PID', str(os.getpid())), {'a': 1})\n"
            "print('line 2', flush=True)\n")
    # by its name, through a symlink to it, and as /proc/<pid>/fd/1 (both resolve to the log itself)
    for name in ("/dev/stdout", str(tmp_path / "out.json"), "/proc/PID/fd/1"):
        log = tmp_path / "job.log"
        with open(log, "w") as out:
            subprocess.run([sys.executable, "-c", code, name], stdout=out, check=True, timeout=120)
        assert log.read_text() == 'line 1\n{\n  "a": 1\n}\nline 2\n', name


def test_output_json_to_a_stream_needs_no_writable_dev_folder(monkeypatch):
    """`--output-json /dev/stdout` of a user who may not write in /dev (everyone but root) is accepted: a
    stream is written in place, so only the stream itself must be writable."""
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == "/dev" else real_access(p, mode))
    check_writable_output("--output-json", "/dev/stdout")
    check_writable_output("--output-json", "/dev/stderr")


def test_output_json_to_a_regular_file_under_dev_shm_is_replaced(tmp_path):
    """Only a stream is written in place: a regular file is replaced whole wherever it is (tmpfs under /dev)."""
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    target = f"/dev/shm/megatron-zaya-test-{os.getpid()}.json"
    try:
        with open(target, "w") as f:
            f.write('{"old": true}\n')
        write_output_json("--output-json", target, {"new": 1})
        assert json.loads(open(target).read()) == {"new": 1}
    finally:
        os.remove(target)
