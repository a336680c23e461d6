"""Train a SentencePiece tokenizer (BPE or unigram, byte fallback) or a TikTokenizer vocabulary on
JSONL, Parquet or text corpora.

    python tools/train_tokenizer.py --input data/shakespeare.jsonl --vocab-size 32000 \
        --output-prefix data/tokenizer/sp32k [--model-type bpe|unigram] [--json-keys text]
    python tools/train_tokenizer.py --input data/shakespeare.jsonl --vocab-size 31000 \
        --output-prefix data/tokenizer/tt32k --model-type tiktoken [--tiktoken-pattern v2]

SentencePiece (bpe, unigram): writes P.model and P.vocab. Ids: <unk>=0, <s>=1 (BOS), </s>=2 (EOS,
used as EOD by GPTSentencePieceTokenizer), <pad>=3. Use the model with
`--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model P.model`.
tiktoken: a byte-level BPE of --vocab-size ranks (the 256 bytes and the merges, fewer when the
corpus runs out of pairs seen twice), split by Megatron-LM's --tiktoken-pattern, written as P.json
(Megatron's TikTokenizer file). Use it with `--tokenizer-type TikTokenizer --tokenizer-model P.json
--tiktoken-pattern v2 --vocab-size R+S`, R the ranks written and S = --tiktoken-num-special-tokens
(default 1000); the script prints the exact flags.
SentencePiece is fed documents line by line, at most --input-sentence-size lines sampled uniformly with --seed
(one pass, memory for the sample only); tiktoken the first --input-sentence-size pieces of documents, whole
lines with their newlines up to 64K characters a piece (its tokens hold newlines), streamed.
Inputs are read as in preprocess_data.py (JSONL by suffix or by a first line that is a JSON object,
.parquet with pyarrow, otherwise plain text; directories give their .jsonl/.json/.ndjson/.txt/.parquet
files). Bad records (malformed
JSON, missing keys, not UTF-8, lone surrogates) are skipped and counted; an input that fails to read (a truncated
or corrupt .gz/.zst, an unreadable Parquet file) stops the run naming it, exit 2. Existing outputs are refused unless
--overwrite is given, also ones that another run of the same output writes while this one trains (one line
naming the file, exit 2); training writes to a temporary prefix and renames into place (.vocab, then
.model; or the .json), so a failed run leaves any old tokenizer untouched (the hidden temporary folder of a
run killed by SIGKILL is removed by the next run for the same output, megatron_zaya/leftovers.py; a live run
touches its folder every minute while it trains, so a run on another machine sharing the folder leaves it). Ctrl-C
or SIGTERM removes it and ends with exit status 130; one that comes while the new files are renamed into place
waits for both, and once they are in place the line says so (the old tokenizer is replaced) instead of "no
output written".
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from megatron_zaya.data.sources import (InputError, check_json_keys, check_parquet_columns, expand_inputs,  # noqa: E402
                                         iter_records)
from megatron_zaya.interrupts import interrupt_on_sigterm, signals_held  # noqa: E402
from megatron_zaya.leftovers import kept_fresh, remove_leftovers  # noqa: E402
from megatron_zaya.publish import put_in_place, written_meanwhile  # noqa: E402


CHUNK_CHARS = 1 << 16      # tiktoken training: documents in pieces of whole lines up to this size


def text_chunks(text: str, size: int = CHUNK_CHARS):
    """`text` in pieces of whole lines, newlines kept, each up to `size` characters (a longer line alone):
    byte-level BPE learns tokens that hold newlines, and the trainer's memory stays bounded (a 50 MB document
    fed whole took 4 GB)."""
    if len(text) <= size:
        yield text
        return
    piece, length = [], 0
    for line in text.splitlines(keepends=True):
        if piece and length + len(line) > size:
            yield "".join(piece)
            piece, length = [], 0
        piece.append(line)
        length += len(line)
    if piece:
        yield "".join(piece)


def iter_lines(paths, json_keys, text_mode, counts, whole_documents: bool = False):
    """The non-blank lines of every document (`whole_documents`: its text, newlines kept, in text_chunks)."""
    for rec in iter_records(paths, text_mode, list(json_keys)):
        try:
            text = rec.raw.decode("utf-8")
        except UnicodeDecodeError:
            counts["not UTF-8"] = counts.get("not UTF-8", 0) + 1
            continue
        if rec.is_json:
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except (ValueError, RecursionError):   # JSONDecodeError, or e.g. a 5000-digit integer
                counts["malformed JSON"] = counts.get("malformed JSON", 0) + 1
                continue
            if not isinstance(obj, dict):
                counts["not a JSON object"] = counts.get("not a JSON object", 0) + 1
                continue
            texts = [obj.get(k) for k in json_keys]
            texts = [t for t in texts if isinstance(t, str)]
            if not texts:
                reason = f"no string under --json-keys {' '.join(json_keys)}"
                counts[reason] = counts.get(reason, 0) + 1
                continue
        else:
            texts = [text]
        try:
            for t in texts:
                t.encode("utf-8")
        except UnicodeEncodeError:        # a lone surrogate escape (\ud83d) in the JSON
            counts["invalid Unicode"] = counts.get("invalid Unicode", 0) + 1
            continue
        counts["documents"] = counts.get("documents", 0) + 1
        for t in texts:
            if whole_documents:
                for chunk in text_chunks(t):
                    if chunk.strip():
                        counts["lines"] = counts.get("lines", 0) + 1
                        yield chunk
                continue
            for line in t.splitlines():
                if line.strip():
                    counts["lines"] = counts.get("lines", 0) + 1
                    yield line


def _kept_errors(lines, errors: list):
    """`lines`, with a read error they raise kept in `errors`: raised inside SentencePiece's trainer (which reads
    the lines itself), it comes out as a RuntimeError ('INTERNAL: InputError: ...' and a Python stack)."""
    try:
        yield from lines
    except InputError as e:
        errors.append(e)
        raise


def uniform_sample(lines, size: int, seed: int):
    """At most `size` of `lines`, each kept with the same chance, drawn with `seed` (reservoir sampling:
    one pass, memory for the sample only); `lines` itself when size is 0. SentencePiece's own sampling
    ignores its seed, so two runs on one corpus gave different vocabularies."""
    if not size:
        return lines
    rng, sample = random.Random(seed), []
    for i, line in enumerate(lines):
        if i < size:
            sample.append(line)
        else:
            j = rng.randrange(i + 1)
            if j < size:
                sample[j] = line
    return sample


def vocab_size_hint(message: str) -> str:
    """Which way to move --vocab-size, from SentencePiece's error text ("" when it is not about it)."""
    if "smaller than required_chars" in message:
        return (" (--vocab-size must cover the 256 byte-fallback pieces, the special pieces and the corpus's "
                "characters: raise it, or lower --character-coverage)")
    if "Vocabulary size too high" in message:
        return " (the corpus is too small for this --vocab-size: lower it or add text)"
    return ""


def check_args(args) -> str | None:
    """The first bad flag value as a one-line message, or None. Cheap: runs before any input is read."""
    if args.vocab_size < 8:
        return f"--vocab-size {args.vocab_size} is too small"
    if args.model_type == "tiktoken" and args.vocab_size < 256:
        return f"--vocab-size {args.vocab_size}: a tiktoken vocabulary holds at least the 256 byte tokens"
    if args.model_type == "tiktoken" and args.user_defined_symbols:
        return ("--user-defined-symbols: a tiktoken vocabulary holds ranks only; its special tokens come "
                "from --tokenizer-special-tokens when it is used")
    if not 0 <= args.seed <= 2**32 - 1:      # SentencePiece's generator takes an unsigned 32-bit seed
        return f"--seed must be in [0, 2**32 - 1], got {args.seed}"
    if args.input_sentence_size < 0:
        return f"--input-sentence-size must be >= 0 (0 = use every line), got {args.input_sentence_size}"
    if not 10 <= args.max_sentence_length <= 1 << 30:      # SentencePiece's own bounds, said only after the input
        return (f"--max-sentence-length must be in [10, {1 << 30}] (SentencePiece's bounds), got "
                f"{args.max_sentence_length}")
    if not 0 < args.character_coverage <= 1:
        return f"--character-coverage must be in (0, 1], got {args.character_coverage}"
    if len(set(args.json_keys)) != len(args.json_keys):
        return f"--json-keys {' '.join(args.json_keys)}: a key is given more than once"
    return None


def output_extensions(model_type: str) -> tuple[str, ...]:
    """The files training writes after the prefix, in the order they are renamed into place."""
    return (".json",) if model_type == "tiktoken" else (".vocab", ".model")


def check_output(prefix: str, overwrite: bool, extensions=(".model", ".vocab")) -> str | None:
    """Refuse existing outputs (unless `overwrite`) and an unwritable folder, before training."""
    if not os.path.basename(prefix) or os.path.isdir(prefix):
        return (f"--output-prefix {prefix}: a folder; give a name in it (e.g. {os.path.join(prefix, 'sp32k')}: the "
                f"tool writes NAME.model and NAME.vocab, or NAME.json for tiktoken)")
    if not overwrite:
        for ext in extensions:
            if os.path.lexists(prefix + ext):
                return f"--output-prefix {prefix}: {prefix + ext} already exists (pass --overwrite to replace it)"
    parent = os.path.dirname(os.path.abspath(prefix))
    try:
        os.makedirs(parent, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".write_test")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        return f"--output-prefix {prefix}: cannot write to {parent} ({e.strerror or e})"
    return None


def _format_counts(counts: dict) -> str:
    skipped = {k: v for k, v in counts.items() if k not in ("documents", "lines")}
    return ", ".join(f"{v:,} {k}" for k, v in skipped.items())


def _announce_end(lines, counts: dict, t0: float):
    """Pass `lines` through, then print a line when the input is exhausted (SentencePiece reads it all)."""
    yield from lines
    skipped = _format_counts(counts)
    print(f"read {counts.get('documents', 0):,} documents ({counts.get('lines', 0):,} lines) in "
          f"{time.time() - t0:.1f}s" + (f"; skipped {skipped}" if skipped else "") + "; training...",
          file=sys.stderr, flush=True)


def _install(tmp_prefix: str, prefix: str, extensions=(".vocab", ".model"), installed: list | None = None,
             overwrite: bool = True) -> None:
    """Rename the trained files into place: .vocab first, .model (what users load) last; a signal waits for
    both (a new .vocab beside the old .model otherwise) and then stops the run (KeyboardInterrupt). The files
    put in place are appended to `installed` ("P.model (replaced)" where an old one was there), for the
    interruption's line: from here on the output is written, whatever interrupts the run. Not `overwrite`: no
    existing file is replaced; one another run wrote since check_output is a FileExistsError naming it, with
    none of this run's files in place (publish.put_in_place)."""
    installed = [] if installed is None else installed
    with signals_held() as held:
        replaced = [os.path.exists(prefix + ext) for ext in extensions]
        put_in_place([(tmp_prefix + ext, prefix + ext) for ext in extensions], overwrite)
        installed.extend(prefix + ext + (" (replaced)" if old else "") for ext, old in zip(extensions, replaced))
    if held:
        raise KeyboardInterrupt     # acted on now that the new tokenizer is whole


def _written_meanwhile(prefix: str, err: FileExistsError) -> int:
    """The line for an output that another run of it (a job submitted twice) wrote while this one trained."""
    print(f"error: {written_meanwhile(prefix, err)}", file=sys.stderr)
    return 2


def train_tiktoken(args, lines, tmp_prefix: str) -> int:
    """A TikTokenizer vocabulary of at most --vocab-size ranks into tmp_prefix.json; the ranks written."""
    from megatron_zaya.data.tiktoken_vocab import train_tiktoken_ranks, write_tiktoken_vocab

    tokens = train_tiktoken_ranks(lines, args.vocab_size, args.tiktoken_pattern)
    write_tiktoken_vocab(tokens, tmp_prefix + ".json")
    return len(tokens)


def main(argv=None) -> int:
    # Ctrl-C and SIGTERM (scancel, a time limit) remove the temporary folder and end with one line, exit 130;
    # once the new files are in place (after _install) the line names them instead of "no output written"
    installed: list[str] = []
    return interrupt_on_sigterm(lambda argv: _main(argv, installed), argv, "train_tokenizer.py",
                                in_place=lambda: ", ".join(installed) + " written, complete" if installed else None)


def _main(argv=None, installed: list | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="files, directories or globs (.jsonl[.gz|.zst], .parquet or text)")
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--output-prefix", required=True)
    p.add_argument("--model-type", choices=("bpe", "unigram", "tiktoken"), default="bpe",
                   help="SentencePiece bpe or unigram, or a TikTokenizer vocabulary (P.json)")
    p.add_argument("--tiktoken-pattern", choices=("v1", "v2"), default="v2",
                   help="--model-type tiktoken: Megatron-LM's pre-tokenization pattern (use the same when training)")
    p.add_argument("--json-keys", nargs="+", default=["text"])
    p.add_argument("--text-mode", choices=("file", "paragraph", "line"), default="file")
    p.add_argument("--character-coverage", type=float, default=0.9995)
    p.add_argument("--input-sentence-size", type=int, default=2_000_000,
                   help="lines sampled uniformly with --seed (tiktoken: the first document pieces); 0: all")
    p.add_argument("--max-sentence-length", type=int, default=16384, help="longer lines (bytes) are skipped")
    p.add_argument("--no-byte-fallback", action="store_true")
    p.add_argument("--user-defined-symbols", nargs="*", default=[], help="e.g. <think> </think>")
    p.add_argument("--num-threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--overwrite", action="store_true", help="replace existing outputs (P.model/P.vocab or P.json)")
    args = p.parse_args(argv)

    import sentencepiece as spm

    extensions = output_extensions(args.model_type)
    problem = check_args(args) or check_output(args.output_prefix, args.overwrite, extensions)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        paths = expand_inputs(args.input)
        check_parquet_columns(paths, args.json_keys)
        check_json_keys(paths, args.json_keys)
        counts: dict[str, int] = {}
        t0 = time.time()
        lines = iter_lines(paths, args.json_keys, args.text_mode, counts, whole_documents=args.model_type == "tiktoken")
        first = next(lines, None)   # detect "no text" here, not as a SentencePiece internal error
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if first is None:
        skipped = _format_counts(counts)
        print(f"error: --input {' '.join(args.input)}: no text found"
              + (f" ({skipped})" if skipped else " (the input is empty)"), file=sys.stderr)
        return 1
    if hasattr(spm, "set_random_generator_seed"):
        spm.set_random_generator_seed(args.seed)
    parent = os.path.dirname(os.path.abspath(args.output_prefix))
    hidden = f".{os.path.basename(args.output_prefix)}.train_tokenizer.tmp"   # + process id: found if SIGKILLed
    remove_leftovers(parent, re.compile(re.escape(hidden) + r"(?P<pid>\d+)-\w+"), args.output_prefix)
    tmp_dir = tempfile.mkdtemp(dir=parent, prefix=f"{hidden}{os.getpid()}-")
    tmp_prefix = os.path.join(tmp_dir, "sp")
    if args.model_type == "tiktoken":
        try:
            with kept_fresh(tmp_dir):   # touched while training: a run on another machine sees it live
                sample = _announce_end(itertools.chain([first], lines), counts, t0)   # streamed: its first pieces
                if args.input_sentence_size:
                    sample = itertools.islice(sample, args.input_sentence_size)
                ranks = train_tiktoken(args, sample, tmp_prefix)
            _install(tmp_prefix, args.output_prefix, extensions, installed, args.overwrite)
        except InputError as e:       # an input that fails to read part-way (a truncated .gz or .zst)
            print(f"error: {e}", file=sys.stderr)
            return 2
        except FileExistsError as e:
            return _written_meanwhile(args.output_prefix, e)
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
        skipped = _format_counts(counts)
        print(f"trained tiktoken vocabulary of {ranks} ranks ({args.tiktoken_pattern}) on {counts.get('documents', 0)} "
              f"documents in {time.time() - t0:.1f}s -> {args.output_prefix}.json"
              + (f"; skipped {skipped}" if skipped else "")
              + f"\nuse: --tokenizer-type TikTokenizer --tokenizer-model {args.output_prefix}.json "
                f"--tiktoken-pattern {args.tiktoken_pattern} --vocab-size {ranks + 1000} (1000 special tokens, "
                f"or --tiktoken-num-special-tokens S with --vocab-size {ranks} + S)")
        return 0
    read_errors: list[InputError] = []
    try:
        with kept_fresh(tmp_dir):   # empty until SentencePiece writes at the end: touched meanwhile
            sample = uniform_sample(_announce_end(_kept_errors(itertools.chain([first], lines), read_errors),
                                                  counts, t0), args.input_sentence_size, args.seed)
            spm.SentencePieceTrainer.Train(
                sentence_iterator=iter(sample),
                model_prefix=tmp_prefix,
                vocab_size=args.vocab_size,
                model_type=args.model_type,
                byte_fallback=not args.no_byte_fallback,
                character_coverage=args.character_coverage,
                input_sentence_size=0,            # the sample above, all of it
                max_sentence_length=args.max_sentence_length,
                unk_id=0, bos_id=1, eos_id=2, pad_id=3,
                user_defined_symbols=args.user_defined_symbols or [],
                num_threads=max(1, args.num_threads),
                minloglevel=2,
            )
        _install(tmp_prefix, args.output_prefix, installed=installed, overwrite=args.overwrite)
    except (RuntimeError, InputError) as e:
        if read_errors:           # an input that fails to read part-way, as SentencePiece's own RuntimeError
            print(f"error: {read_errors[0]}", file=sys.stderr)
            return 2
        msg = str(e) + vocab_size_hint(str(e))
        print(f"error: SentencePiece training failed: {msg}", file=sys.stderr)
        return 1
    except FileExistsError as e:
        return _written_meanwhile(args.output_prefix, e)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    skipped = _format_counts(counts)
    print(
        f"trained {args.model_type} vocab {args.vocab_size} on {counts.get('documents', 0)} documents "
        f"in {time.time() - t0:.1f}s -> {args.output_prefix}.model"
        + (f"; skipped {skipped}" if skipped else "")
    )
    from megatron_zaya.checkpoint.hf_tokenizer import sentencepiece_export_problem
    why = sentencepiece_export_problem(spm.SentencePieceProcessor(model_file=args.output_prefix + ".model"))
    if why:
        print(f"note: tools/convert_checkpoint.py to-hf cannot write this tokenizer for transformers (the model "
              f"exports without it): {why}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
