"""preprocess.Progress and the input's position on disk (sources.ReadPosition) behind its share and ETA, for plain,
.gz, .zst and Parquet inputs alike.

    python -m pytest -q tests/data/test_preprocess_progress.py
"""
import gzip
import json
import random
import re

import pytest

from megatron_zaya.data import preprocess as pre
from megatron_zaya.data.sources import ReadPosition, iter_records


def test_progress_logs_when_the_interval_is_reached(capsys):
    progress = pre.Progress(None, False, log_interval=3)
    stats = pre.Stats(documents=3, tokens=30, bytes=100)
    progress.update(stats, 100)
    assert "processed 3 documents" in capsys.readouterr().err
    stats.documents = 5
    progress.update(stats, 200)                # next line at 6
    assert capsys.readouterr().err == ""


def test_progress_logs_at_least_once_a_minute(capsys, monkeypatch):
    """Long documents (books) reach --log-interval's 100,000 rarely: without a terminal a line comes at least
    every LOG_SECONDS too (a 130 MB corpus printed none in its whole run)."""
    clock = iter([0.0, 30.0, 61.0, 90.0, 122.0])
    monkeypatch.setattr(pre.time, "time", lambda: next(clock))
    progress = pre.Progress(None, False, log_interval=100_000)         # started at 0 s
    for documents in (10, 20, 30, 40):                                  # at 30, 61, 90 and 122 s
        progress.update(pre.Stats(documents=documents, tokens=10, bytes=100), 100 * documents)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" documents")[0] for line in lines] == ["processed 20", "processed 40"], lines


def test_progress_lines_give_the_share_read_and_an_eta(capsys, monkeypatch):
    """Without a terminal (a Slurm or CI log) the lines say how much of the input on disk is read and when it
    ends, as the bar does; without a known size, only the rates."""
    clock = iter([100.0, 110.0, 130.0, 200.0, 210.0])
    monkeypatch.setattr(pre.time, "time", lambda: next(clock))
    progress = pre.Progress(4_000_000_000, False, log_interval=1)     # started at 100 s
    progress.update(pre.Stats(documents=1, tokens=10, bytes=1_000_000_000), 1_000_000_000)   # at 110 s: 25%
    assert capsys.readouterr().err.rstrip().endswith(", 25% of 3.73 GiB, ETA 30s")
    progress.update(pre.Stats(documents=2, tokens=20, bytes=9_000_000_000), 3_000_000_000)   # at 130 s: 75%
    assert capsys.readouterr().err.rstrip().endswith(", 75% of 3.73 GiB, ETA 10s")
    unknown = pre.Progress(None, False, log_interval=1)
    unknown.update(pre.Stats(documents=1, tokens=10, bytes=5), 5)
    assert capsys.readouterr().err.rstrip().endswith("MB/s)")


def _lines(count):
    rng = random.Random(0)      # hex: compresses about 2:1, so that a compressed file spans several reads
    return [json.dumps({"text": "%064x" % rng.getrandbits(256)}) + "\n" for _ in range(count)]


def _write(tmp_path, kind, lines):
    data = "".join(lines).encode()
    if kind == "parquet":
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        path = tmp_path / "in.parquet"
        pq.write_table(pa.Table.from_pylist([json.loads(line) for line in lines]), str(path), row_group_size=500)
    elif kind == "zst":
        zstandard = pytest.importorskip("zstandard")
        path = tmp_path / "in.jsonl.zst"
        path.write_bytes(zstandard.ZstdCompressor(level=1).compress(data))
    elif kind == "gz":
        path = tmp_path / "in.jsonl.gz"
        path.write_bytes(gzip.compress(data, compresslevel=1))
    else:
        path = tmp_path / "in.txt"      # read as plain text, a record per line
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("kind", ["plain", "gz", "zst", "parquet"])
def test_the_read_position_follows_the_file_on_disk(tmp_path, kind):
    """Half the records read is about half the file on disk (within the decompressor's read-ahead: 256 KB
    reads of a 1.3 MB .zst), it never goes back, and it ends at the files' sizes; a second file starts after the
    first."""
    lines = _lines(40_000)
    (tmp_path / "a").mkdir()
    first = _write(tmp_path / "a", kind, lines)
    second = _write(tmp_path, kind, lines[:10])
    total = first.stat().st_size + second.stat().st_size
    position, seen = ReadPosition(), []
    for number, _ in enumerate(iter_records([str(first), str(second)], "line", ["text"], position), 1):
        seen.append(position.bytes)
        if number == 20_000:
            assert 0.3 < position.bytes / first.stat().st_size < 0.75, (kind, position.bytes, first.stat().st_size)
    assert seen == sorted(seen) and len(seen) == 40_010
    assert first.stat().st_size <= seen[-1] <= total and position.bytes == total


def test_the_log_lines_of_a_parquet_input_under_two_workers_give_its_share_read(tmp_path, capsys):
    """preprocess.run's lines give the share of the input read at the end of the chunk that each line follows,
    in the order the workers' results come (Parquet: the share of its rows; before, no share at all)."""
    path = _write(tmp_path, "parquet", [json.dumps({"text": f"{i % 90} {i % 7}"}) for i in range(1000)])
    cfg = pre.PreprocessConfig(input=[str(path)], output_prefix=str(tmp_path / "o"), tokenizer_type="NullTokenizer",
                               tokenizer_model="100", progress=False, log_interval=100, chunk_bytes=2000, workers=2)
    pre.run(cfg)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("processed")]
    shares = [(int(m.group(1).replace(",", "")), int(m.group(2)))
              for m in (re.match(r"processed ([\d,]+) documents .*, (\d+)% of ", line) for line in lines) if m]
    assert len(shares) == len(lines) >= 9, lines
    for documents, percent in shares:        # a line comes at the end of a chunk of about 28 documents
        assert abs(percent - documents / 10) <= 1, lines
