"""Streaming, parallel tokenization of raw corpora into Megatron `.bin/.idx` files.

The main process reads raw records (JSONL lines or text documents) and groups them into chunks of
about `chunk_bytes`; worker processes decode, parse, optionally trim and tokenize a chunk and send
back compact numpy arrays; the main process appends them, in input order, to one
`IndexedDatasetWriter` per JSON key. At most one chunk per worker is in flight, so memory does not
depend on the input size. Bad records are counted per reason (with the first few locations) and
never abort the run. See docs/DATA.md.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from megatron_zaya.paths import nearest_existing
from megatron_zaya.publish import written_meanwhile

from .dataset_tokenizer import remove_record, tokenizer_record, write_record
from .indexed import IndexedDatasetWriter, existing_outputs, optimal_dtype, remove_temporaries
from .preprocess_progress import Progress
from .sources import (ReadPosition, Record, check_json_keys, check_parquet_columns, expand_inputs,
                      holds_json_records, input_size, iter_records)
from .tokenizer import build_tokenizer, check_tokenizer_flags, tokenizer_flags
from .trimming import OUTCOMES, ReasoningTrimmer
from .workers import OrderedWorkers

MAX_EXAMPLES = 5  # locations remembered per skip reason
KEPT, EMPTY, TRIMMED_AWAY = 0, 1, 2  # per-document status of one key's tokens


@dataclass
class PreprocessConfig:
    input: list[str]
    output_prefix: str
    tokenizer_type: str
    tokenizer_model: str | None   # GPT2BPETokenizer: optional folder holding vocab.json + merges.txt
    json_keys: list[str] = field(default_factory=lambda: ["text"])
    append_eod: bool = False
    workers: int = 1
    text_mode: str = "file"
    vocab_extra_ids: int = 0
    trim_max_length: int | None = None
    reasoning_markers: tuple[str, str] = ("<think>", "</think>")
    chunk_bytes: int = 1 << 20
    log_interval: int = 100000
    progress: bool | None = None  # None: a bar when stderr is a terminal, log lines otherwise
    strict: bool = False
    overwrite: bool = False  # replace existing outputs instead of refusing them
    vocab_file: str | None = None   # GPT2BPETokenizer: --vocab-file
    merge_file: str | None = None   # GPT2BPETokenizer: --merge-file
    tiktoken: dict = field(default_factory=dict)   # TikTokenizer: data.tokenizer.tiktoken_options of the flags


@dataclass
class Stats:
    documents: int = 0
    tokens: int = 0
    bytes: int = 0
    records: int = 0
    skipped: collections.Counter = field(default_factory=collections.Counter)
    examples: dict = field(default_factory=dict)
    trimming: collections.Counter = field(default_factory=collections.Counter)
    key_tokens: collections.Counter = field(default_factory=collections.Counter)
    empty_keys: collections.Counter = field(default_factory=collections.Counter)   # kept records, per key
    empty_key_examples: dict = field(default_factory=dict)

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] += 1
        _remember(self.examples, reason, [where])

    def empty_in_key(self, key: str, where: str) -> None:
        """A kept record with no tokens in `key`: written there as a document of no sequences."""
        self.empty_keys[key] += 1
        _remember(self.empty_key_examples, key, [where])

    def merge(self, other: "Stats") -> None:
        self.documents += other.documents
        self.tokens += other.tokens
        self.bytes += other.bytes
        self.records += other.records
        self.skipped.update(other.skipped)
        self.trimming.update(other.trimming)
        self.key_tokens.update(other.key_tokens)
        self.empty_keys.update(other.empty_keys)
        for mine, theirs in ((self.examples, other.examples), (self.empty_key_examples, other.empty_key_examples)):
            for k, v in theirs.items():
                _remember(mine, k, v)


def _remember(examples: dict, reason: str, where: list) -> None:
    """Up to MAX_EXAMPLES locations per reason, the first ones seen."""
    ex = examples.setdefault(reason, [])
    ex.extend(where[: MAX_EXAMPLES - len(ex)])


class RecordError(ValueError):
    """A record that stops the run (message starts with its file:line); returned, not raised, by workers."""


class StrictError(RecordError):
    """A bad record under --strict."""


class Encoder:
    """Turns a chunk of raw records into per-key token arrays (runs inside a worker)."""

    def __init__(self, cfg: PreprocessConfig):
        self.cfg = cfg
        kw = {"vocab_extra_ids": cfg.vocab_extra_ids} if cfg.tokenizer_type == "SentencePieceTokenizer" else {}
        self.tokenizer = build_tokenizer(cfg.tokenizer_type, cfg.tokenizer_model, vocab_file=cfg.vocab_file,
                                         merge_file=cfg.merge_file, **kw, **cfg.tiktoken)
        self.dtype = optimal_dtype(self.tokenizer.vocab_size)
        # What the tokenizer makes of no text: [] for most, [BOS] for Llama2Tokenizer or a tokenizer.json whose
        # post-processor adds one. A sequence of just these tokens holds no text: an empty one.
        self.empty_text_list = list(self.tokenizer.encode(""))
        self.trimmer = None
        if cfg.trim_max_length:
            open_m, close_m = cfg.reasoning_markers
            self.trimmer = ReasoningTrimmer(self.tokenizer.encode, self.tokenizer.decode, cfg.trim_max_length,
                                            open_m, close_m, extra_tokens=1 if cfg.append_eod else 0)

    def encode_chunk(self, records: list[Record]):
        cfg = self.cfg
        stats = Stats()
        keys = cfg.json_keys
        docs: dict[str, list] = {k: [] for k in keys}  # per key: list of (where, [sentences])
        for rec in records:
            stats.records += 1
            stats.bytes += len(rec.raw)
            where = f"{rec.source}:{rec.line}"
            try:
                text = rec.raw.decode("utf-8")
            except UnicodeDecodeError as e:
                self._skip(stats, "not UTF-8", where, f"invalid byte at offset {e.start}")
                continue
            if not rec.is_json:
                docs[keys[0]].append((where, [text]))
                continue
            if not text.strip():
                self._skip(stats, "blank line", where)
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                self._skip(stats, "malformed JSON", where, f"{e.msg.removesuffix(' at')} at column {e.colno}")
                continue
            except RecursionError:
                self._skip(stats, "malformed JSON", where, "nested too deeply")
                continue
            except ValueError as e:  # e.g. an integer longer than sys.get_int_max_str_digits()
                self._skip(stats, "malformed JSON", where, str(e).split(":")[0])
                continue
            if not isinstance(obj, dict):
                self._skip(stats, "not a JSON object", where)
                continue
            missing = [k for k in keys if k not in obj]
            if missing:
                self._skip(stats, f"missing key {missing[0]!r}", where)
                continue
            values = {}
            for k in keys:
                v = obj[k]
                if isinstance(v, str):
                    values[k] = [v]
                elif isinstance(v, list) and all(isinstance(s, str) for s in v):
                    values[k] = v  # a list of sentences: one sequence each, as in Megatron
                else:
                    values[k] = None
                    self._skip(stats, f"key {k!r} is not a string", where)
                    break
            if any(v is None for v in values.values()):
                continue
            if "\\u" in text:  # only a JSON \u escape can smuggle in a lone surrogate (raw bytes are checked above)
                bad = _lone_surrogate(values)
                if bad is not None:
                    self._skip(stats, "invalid Unicode", where, f"lone surrogate in key {bad!r}")
                    continue
            for k in keys:
                docs[k].append((where, values[k]))
        # Every key holds the same records; a record is written for all keys or for none, so the
        # outputs stay aligned document by document (docs/DATA.md, "Several keys"). A record empty in
        # some keys is written there as a document of no sequences, as Megatron does; one empty in
        # every key is skipped, and one that trimming removes from any key is dropped from all.
        encoded = {k: self._encode_key(docs[k], stats) for k in keys}
        status = np.stack([encoded[k][2] for k in keys])
        empty_everywhere = (status == EMPTY).all(axis=0)
        keep = ~empty_everywhere & ~(status == TRIMMED_AWAY).any(axis=0)
        for i in np.nonzero(empty_everywhere)[0]:
            self._skip(stats, "empty document", docs[keys[0]][i][0], "every key" if len(keys) > 1 else "")
        for k, key_status in zip(keys, status):
            for i in np.nonzero((key_status == EMPTY) & keep)[0]:
                stats.empty_in_key(k, docs[k][i][0])
        out = {}
        for k in keys:
            out[k] = self._finish(*encoded[k][:2], encoded[k][3], keep)
            stats.tokens += int(out[k][0].size)
            stats.key_tokens[k] += int(out[k][0].size)
        stats.documents += int(keep.sum())
        return out, stats

    def _skip(self, stats: Stats, reason: str, where: str, detail: str = "") -> None:
        if self.cfg.strict:
            raise StrictError(f"{where}: {reason}" + (f" ({detail})" if detail else ""))
        stats.skip(reason, f"{where} ({detail})" if detail else where)

    def _encode_key(self, docs: list, stats: Stats):
        """Tokens of one key's documents, before any record is dropped: (tokens, lengths of the
        non-empty sequences, status per document (KEPT / EMPTY / TRIMMED_AWAY), document of each
        sequence). No EOD yet."""
        if self.trimmer is None and hasattr(self.tokenizer, "encode_batch_flat"):
            return self._encode_key_flat(docs)
        tok = self.tokenizer
        flat = [s for _, sents in docs for s in sents]
        encoded = self._guarded(tok.encode_batch, flat, docs) if flat else []
        pieces, seq_lens, seq_doc = [], [], []
        status = np.full(len(docs), KEPT, dtype=np.int8)
        it = iter(encoded)
        for d, (where, sents) in enumerate(docs):
            doc_ids = [next(it) for _ in sents]
            if self.trimmer is not None and sents:      # (an empty list of sentences: an empty document)
                if len(sents) != 1:
                    ids, outcome = doc_ids[0], "fit"  # sentence lists are not trimmed
                else:
                    ids, outcome = self.trimmer(sents[0], doc_ids[0])
                    doc_ids = [ids] if ids is not None else []
                stats.trimming[outcome] += 1
                if ids is None:
                    status[d] = TRIMMED_AWAY
                    continue
            empty = self.empty_text_list
            doc_ids = [x for x in doc_ids if len(x) > 0 and (len(x) != len(empty) or list(x) != empty)]
            if not doc_ids:
                status[d] = EMPTY
                continue
            pieces.extend(doc_ids)
            seq_lens.extend(len(x) for x in doc_ids)
            seq_doc.extend([d] * len(doc_ids))
        seq_lens = np.asarray(seq_lens, np.int64)
        tokens = np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int64, count=int(seq_lens.sum()))
        seq_doc = np.asarray(seq_doc, np.int64)
        self._check_ids(tokens, seq_lens, seq_doc, docs)
        return tokens, seq_lens, status, seq_doc

    def _encode_key_flat(self, docs: list):
        """Vectorized twin of `_encode_key` (no trimming): same output, numpy all the way."""
        n_docs = len(docs)
        flat = [s for _, sents in docs for s in sents]
        if not flat:
            return (np.zeros(0, np.int64), np.zeros(0, np.int64), np.full(n_docs, EMPTY, np.int8),
                    np.zeros(0, np.int64))
        toks, lens = self._guarded(self.tokenizer.encode_batch_flat, flat, docs)
        sent_counts = np.fromiter((len(sents) for _, sents in docs), dtype=np.int64, count=n_docs)
        doc_of = np.repeat(np.arange(n_docs), sent_counts)
        nonempty = self._holds_text(lens, toks)
        if not nonempty.all():
            toks = toks[np.repeat(nonempty, lens)]
        status = np.where(np.bincount(doc_of[nonempty], minlength=n_docs) > 0, KEPT, EMPTY).astype(np.int8)
        seq_lens, seq_doc = lens[nonempty].astype(np.int64), doc_of[nonempty]
        self._check_ids(toks, seq_lens, seq_doc, docs)
        return toks, seq_lens, status, seq_doc

    def _holds_text(self, lens: np.ndarray, toks: np.ndarray) -> np.ndarray:
        """Per sequence of the flat `toks` (lengths `lens`), whether it holds tokens of text: it is not empty
        and not just `empty_text_list` (a tokenizer's BOS alone)."""
        empty, k = np.asarray(self.empty_text_list, np.int64), len(self.empty_text_list)
        holds = (lens > 0) & (lens != k)
        maybe_empty = np.nonzero((lens > 0) & (lens == k))[0]
        if maybe_empty.size:
            starts = np.cumsum(lens)[maybe_empty] - k
            holds[maybe_empty] = (toks[starts[:, None] + np.arange(k)] != empty).any(axis=1)
        return holds

    def _guarded(self, encode, flat: list, docs: list):
        """`encode(flat)`, turning a tokenizer's ValueError (NullTokenizer on text that is not
        integers) into a `RecordError` naming the first record it fails on."""
        try:
            return encode(flat)
        except ValueError as e:
            for where, sents in docs:
                try:
                    self.tokenizer.encode_batch(sents)
                except ValueError as e2:
                    raise RecordError(f"{where}: cannot tokenize with {self.cfg.tokenizer_type} ({e2})") from None
            raise RecordError(f"cannot tokenize with {self.cfg.tokenizer_type} ({e})") from None

    def _check_ids(self, toks: np.ndarray, seq_lens: np.ndarray, seq_doc: np.ndarray, docs: list) -> None:
        """Every token id must lie in [0, vocab_size): an id outside would wrap around when cast to the
        output dtype. Raises `RecordError` naming the first record holding one."""
        vocab = self.tokenizer.vocab_size
        if toks.size == 0 or (int(toks.min()) >= 0 and int(toks.max()) < vocab):
            return
        bad = int(np.nonzero((toks < 0) | (toks >= vocab))[0][0])
        seq = int(np.searchsorted(np.cumsum(seq_lens), bad, side="right"))
        where = docs[int(seq_doc[seq])][0]
        raise RecordError(f"{where}: token id {int(toks[bad])} is outside the vocabulary [0, {vocab - 1}] of "
                          f"--tokenizer-type {self.cfg.tokenizer_type} --tokenizer-model {self.cfg.tokenizer_model}")

    def _finish(self, toks: np.ndarray, seq_lens: np.ndarray, seq_doc: np.ndarray, keep: np.ndarray):
        """Drop the sequences of records not kept, append EOD, cast: (tokens, lengths, sequences per document)."""
        seq_keep = keep[seq_doc]
        if not seq_keep.all():
            toks = toks[np.repeat(seq_keep, seq_lens)]
            seq_lens, seq_doc = seq_lens[seq_keep], seq_doc[seq_keep]
        per_doc = np.bincount(seq_doc, minlength=len(keep))[keep].astype(np.int64)
        seq_lens = seq_lens.copy()
        if self.cfg.append_eod:
            last_seq = (np.cumsum(per_doc) - 1)[per_doc > 0]     # a document of no sequences gets no EOD
            toks = np.insert(toks, np.cumsum(seq_lens)[last_seq], self.tokenizer.eod)
            seq_lens[last_seq] += 1
        return toks.astype(self.dtype, copy=False), seq_lens, per_doc


def _lone_surrogate(values: dict) -> str | None:
    """The first key whose text holds a lone surrogate (unencodable as UTF-8, so untokenizable)."""
    for k, sents in values.items():
        for t in sents:
            try:
                t.encode("utf-8")
            except UnicodeEncodeError:
                return k
    return None


_WORKER: Encoder | None = None


def _init_worker(cfg: PreprocessConfig) -> None:
    global _WORKER
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per worker process
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C and stops the workers
    _WORKER = Encoder(cfg)


def _work(records):
    try:
        return _WORKER.encode_chunk(records)
    except RecordError as e:
        return e


def _chunks(records, chunk_bytes: int):
    buf, size = [], 0
    for rec in records:
        buf.append(rec)
        size += len(rec.raw) + 64
        if size >= chunk_bytes:
            yield buf
            buf, size = [], 0
    if buf:
        yield buf


def output_prefix_for(prefix: str, key: str) -> str:
    return f"{prefix}_{key}_document"


def run(cfg: PreprocessConfig, should_stop: Callable[[], bool] = lambda: False) -> dict:
    """Tokenize `cfg.input` into `{output_prefix}_{key}_document.{bin,idx}`; returns a summary dict.

    Raises ValueError/FileNotFoundError (bad flags or inputs) and `EmptyInputError` (no documents);
    on any failure no output file is left behind. `should_stop` is asked after every chunk and once
    before the outputs are swapped in: True stops the run there with KeyboardInterrupt (a signal
    handler that only sets a flag, rather than raising wherever the main thread happens to be, as in
    the middle of starting a worker process).
    """
    check_config(cfg)
    paths = expand_inputs(cfg.input)
    if len(cfg.json_keys) > 1 and not all(holds_json_records(p) for p in paths):
        text = next(p for p in paths if not holds_json_records(p))
        raise ValueError(f"--json-keys with several keys needs JSONL or Parquet input only ({text} is plain text, "
                         "which would fill only the first key and misalign the outputs)")
    check_parquet_columns(paths, list(cfg.json_keys))
    check_json_keys(paths, list(cfg.json_keys))
    main_encoder = Encoder(cfg)  # validates the tokenizer and trimming flags before any work
    dtype = main_encoder.dtype
    progress = Progress(input_size(paths), cfg.progress, cfg.log_interval)
    writers: dict[str, IndexedDatasetWriter] = {}
    stats = Stats()
    t0 = time.time()
    try:
        for k in cfg.json_keys:   # inside the try: an interrupt here still removes the writers' files
            writers[k] = IndexedDatasetWriter(output_prefix_for(cfg.output_prefix, k), dtype)
        position, read_to = ReadPosition(), collections.deque()

        def chunks():             # each chunk's end on disk, for the progress when its result comes
            for chunk in _chunks(iter_records(paths, cfg.text_mode, list(cfg.json_keys), position), cfg.chunk_bytes):
                read_to.append(position.bytes)
                yield chunk

        def consume(result):
            if isinstance(result, Exception):
                raise result
            out, st = result
            for k, (tokens, lens, per_doc) in out.items():
                writers[k].add_documents(tokens, lens, per_doc)
            stats.merge(st)
            progress.update(stats, read_to.popleft())
            if should_stop():
                raise KeyboardInterrupt

        if cfg.workers == 1:
            for chunk in chunks():
                try:
                    consume(main_encoder.encode_chunk(chunk))
                except RecordError as e:
                    raise ValueError(str(e)) from None
        else:
            with OrderedWorkers(cfg.workers, _work, initializer=_init_worker, initargs=(cfg,)) as workers:
                for result in workers.imap(chunks()):
                    if isinstance(result, RecordError):
                        raise ValueError(str(result))
                    consume(result)
        if stats.documents == 0:
            raise EmptyInputError(f"--input {' '.join(cfg.input)}: no documents to write ({_why_empty(cfg, stats)})")
        textless = [k for k in cfg.json_keys if not stats.key_tokens.get(k)]
        if textless:       # a misspelt or unused key of several: its output would hold empty documents only
            raise EmptyInputError(f"--json-keys {' '.join(cfg.json_keys)}: no record has text under "
                                  f"{textless[0]!r} ({stats.documents:,} documents, every one empty there)")
        # Every output is complete on disk before any existing file is touched (see commit()). The old
        # tokenizer record goes first and the new one comes last: an interruption between them leaves a
        # dataset without a record (not checked), never one with another dataset's. Without --overwrite
        # nothing is replaced: an output another run wrote since check_config (a job submitted twice) stops
        # this run before its record or any further file, and that run's files stay as it wrote them.
        record = tokenizer_record(main_encoder.tokenizer, recorded_flags(cfg))
        if should_stop():   # the last point at which nothing has been replaced
            raise KeyboardInterrupt
        for w in writers.values():
            w.prepare()
        for w in writers.values():
            if cfg.overwrite:
                remove_record(w.path_prefix)
            try:
                w.commit(replace=cfg.overwrite)
            except FileExistsError as err:
                raise FileExistsError(written_meanwhile(cfg.output_prefix, err)) from None
            write_record(w.path_prefix, record)
    except BaseException:   # the workers are already stopped: OrderedWorkers kills them on the way out
        for k in cfg.json_keys:
            if k in writers:
                writers[k].abort()
            else:   # interrupted while being built: its files may exist, the object does not
                remove_temporaries(output_prefix_for(cfg.output_prefix, k))
        raise
    finally:
        progress.close()
    elapsed = time.time() - t0
    return {
        "outputs": [output_prefix_for(cfg.output_prefix, k) for k in cfg.json_keys],
        "dtype": np.dtype(dtype).name,
        "vocab_size": main_encoder.tokenizer.vocab_size,
        "records": stats.records,
        "documents": stats.documents,
        "tokens": stats.tokens,
        "tokens_per_key": {k: stats.key_tokens.get(k, 0) for k in cfg.json_keys},
        "bytes": stats.bytes,
        "skipped": dict(stats.skipped),
        "skip_examples": stats.examples,
        "empty_in_key": {k: stats.empty_keys[k] for k in cfg.json_keys if stats.empty_keys[k]},
        "empty_in_key_examples": stats.empty_key_examples,
        "trimming": {k: stats.trimming.get(k, 0) for k in OUTCOMES} if cfg.trim_max_length else None,
        "seconds": elapsed,
        "documents_per_s": stats.documents / max(elapsed, 1e-9),
        "tokens_per_s": stats.tokens / max(elapsed, 1e-9),
    }


def recorded_flags(cfg: PreprocessConfig) -> dict:
    """The tokenizer flags of this preprocessing, files as absolute paths, for the dataset's tokenizer record."""
    def where(path):
        return os.path.abspath(path) if path is not None and os.path.exists(path) else path

    flags = tokenizer_flags({"tokenizer_type": cfg.tokenizer_type, "tokenizer_model": where(cfg.tokenizer_model),
                             "vocab_file": where(cfg.vocab_file), "merge_file": where(cfg.merge_file), **cfg.tiktoken})
    return {**flags, **({"--vocab-extra-ids": cfg.vocab_extra_ids} if cfg.vocab_extra_ids else {})}


class EmptyInputError(ValueError):
    """The input produced no documents."""


def check_config(cfg: PreprocessConfig) -> None:
    """Cheap checks of every flag, before any input is read: raises ValueError naming the flag, or
    FileExistsError naming an output that exists (unless `cfg.overwrite`)."""
    check_tokenizer_flags(cfg.tokenizer_type, cfg.tokenizer_model, cfg.vocab_file, cfg.merge_file, **cfg.tiktoken)
    if cfg.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {cfg.workers}")
    most = max(4 * (os.cpu_count() or 1), 64)
    if cfg.workers > most:      # each is a process: 100000 forked for minutes, deaf to SIGTERM meanwhile
        raise ValueError(f"--workers {cfg.workers}: more processes than this machine's "
                         f"{os.cpu_count() or 'unknown number of'} CPUs can use; give at most {most}")
    if not cfg.json_keys:
        raise ValueError("--json-keys needs at least one key")
    dup = sorted({k for k in cfg.json_keys if cfg.json_keys.count(k) > 1})
    if dup:
        raise ValueError(f"--json-keys {' '.join(cfg.json_keys)}: key {dup[0]!r} is given more than once")
    if cfg.vocab_extra_ids < 0:
        raise ValueError(f"--vocab-extra-ids must be >= 0, got {cfg.vocab_extra_ids}")
    if cfg.trim_max_length is not None and cfg.trim_max_length < 1:
        raise ValueError(f"--trim-max-length must be >= 1 (omit it to turn trimming off), got {cfg.trim_max_length}")
    if cfg.chunk_bytes < 1:
        raise ValueError(f"--chunk-bytes must be >= 1, got {cfg.chunk_bytes}")
    folder = nearest_existing(os.path.dirname(os.path.abspath(cfg.output_prefix)),   # where its folder is made
                              f"--output-prefix {cfg.output_prefix}")
    if not os.path.isdir(folder):
        raise ValueError(f"--output-prefix {cfg.output_prefix}: {folder} is a file, not a folder")
    if not cfg.overwrite:
        for k in cfg.json_keys:
            existing = existing_outputs(output_prefix_for(cfg.output_prefix, k))
            if existing:
                raise FileExistsError(f"--output-prefix {cfg.output_prefix}: {existing[0]} already exists "
                                      f"(pass --overwrite to replace it)")


def _why_empty(cfg: PreprocessConfig, stats: Stats) -> str:
    """Why no document was written: the skip reasons, the documents trimming removed, or an empty input."""
    reasons = [f"{n} {r}" for r, n in stats.skipped.items()]
    dropped = stats.trimming.get("dropped", 0)
    if dropped:
        reasons.append(f"{dropped} removed by --trim-max-length {cfg.trim_max_length}: "
                       f"longer than {cfg.trim_max_length} tokens even after trimming")
    return ", ".join(reasons) or "the input is empty"


def format_summary(s: dict) -> str:
    n_out = len(s["outputs"])
    per_key = s.get("tokens_per_key") or {}
    lines = [
        f"documents: {s['documents']:,} (from {s['records']:,} records)"
        + (f", the same records in each of the {n_out} outputs" if n_out > 1 else ""),
        f"tokens:    {s['tokens']:,} ({s['dtype']}, vocab {s['vocab_size']:,})"
        + (" = " + " + ".join(f"{v:,} {k}" for k, v in per_key.items()) if n_out > 1 else ""),
        f"bytes:     {s['bytes']:,}",
        f"time:      {s['seconds']:.1f}s, {s['documents_per_s']:,.0f} docs/s, {s['tokens_per_s'] / 1e6:.2f}M tokens/s",
    ]
    if s["skipped"]:
        lines.append(f"skipped:   {sum(s['skipped'].values()):,}")
        for reason, n in sorted(s["skipped"].items(), key=lambda kv: -kv[1]):
            ex = ", ".join(s["skip_examples"].get(reason, []))
            lines.append(f"  {reason}: {n:,}" + (f"  e.g. {ex}" if ex else ""))
    else:
        lines.append("skipped:   0")
    for key, n in (s.get("empty_in_key") or {}).items():
        ex = ", ".join(s["empty_in_key_examples"].get(key, []))
        lines.append(f"empty:     {n:,} records have no tokens in key {key!r}: an empty document there, as in "
                     f"Megatron-LM" + (f"  e.g. {ex}" if ex else ""))
    if s["trimming"] is not None:
        lines.append("trimming:  " + ", ".join(f"{k} {v:,}" for k, v in s["trimming"].items()))
    for p in s["outputs"]:
        lines.append(f"wrote:     {p}.bin / {p}.idx")
    return "\n".join(lines)
