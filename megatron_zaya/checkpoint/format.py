"""On-disk format of megatron-zaya's sharded checkpoints, and the low-level I/O.

    SAVE/
      latest_checkpointed_iteration.txt     "100" (Megatron's name and content), replaced atomically
      iter_0000100/
        rank_00000.safetensors              this rank's tensors (model / optimizer / RNG / balancer)
        rank_00000.json                     how each tensor is sliced + non-tensor state + checksum
        ...                                 one pair per rank
        metadata.json                       iteration, samples, config, layout, file manifest (rank 0)
        COMPLETE                            the marker, written last
      iter_0000100.partial-<run id>/        a save in progress (or interrupted): never loaded
      iter_0000100.replaced-<run id>/       the previous iter_0000100 while a save of the same iteration swaps in
      iter_0000100.deleting-<run id>/       a pruned checkpoint being removed (renamed first: never loaded)

A tensor entry describes where its data sits in the GLOBAL (single-device) tensor: `ranges` gives,
per dimension, the list of [start, end) runs of global indices that make up the local block (a TP
split of the gate/up experts weight is two runs), and `flat` = [a, b] says the entry holds only
elements a..b of the block's row-major flattening (ZeRO-1 pieces); null means the whole block.
Any layout can therefore be assembled from any other (blocks.py). Replicated tensors are written by their owners.

Files are written to a temporary name, fsynced, then renamed; a rank's JSON is written after its
tensor file (its appearance means "this rank is done"); rank 0 writes metadata.json, COMPLETE,
renames the folder into place and only then updates latest_checkpointed_iteration.txt (which never
moves backwards past a complete checkpoint).
Nothing is ever unpickled: tensors are read with safetensors, everything else is JSON.
"""
from __future__ import annotations

import json
import os
import re
import struct
import zlib
from dataclasses import dataclass, field

import torch

from megatron_zaya.checkpoint.blocks import (Ranges, block_from_pieces, flat_part_from_pieces, ranges_shape,
                                             read_block, write_block)

FORMAT_VERSION = 1
LATEST_FILE = "latest_checkpointed_iteration.txt"
COMPLETE_MARKER = "COMPLETE"
METADATA_FILE = "metadata.json"
ITER_RE = re.compile(r"^iter_(\d{7,})$")
# The saver's working folders: exactly iter_NNNNNNN.<kind>-<run id> (10 hex digits, see
# TrainingCheckpointer._agree_run_id); nothing else in a --save folder is ever touched.
_RUN_ID = r"[0-9a-f]{10}"
PARTIAL_RE = re.compile(rf"^iter_(\d{{7,}})\.partial-({_RUN_ID})$")       # a save in progress / interrupted
REPLACED_RE = re.compile(rf"^iter_(\d{{7,}})\.replaced-({_RUN_ID})$")     # a same-iteration save's predecessor
DELETING_RE = re.compile(rf"^iter_(\d{{7,}})\.deleting-({_RUN_ID})$")     # pruned: renamed, then removed

_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
           torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
           torch.bool: "BOOL"}
DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the folder or file."""


def iter_dir_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def rank_stem(rank: int) -> str:
    return f"rank_{rank:05d}"


# -- durable writes ---------------------------------------------------------------------------------
def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write to `path.tmp`, fsync, rename over `path`, fsync the folder."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def atomic_write_json(path: str, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def file_crc32(path: str, chunk: int = 1 << 24) -> tuple[int, int]:
    """(crc32, size in bytes) of a file."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                return crc, size
            crc = zlib.crc32(block, crc)
            size += len(block)


# -- safetensors writer (streaming, checksummed, GIL released during the big writes) ------------------
def tensor_bytes(t: torch.Tensor) -> memoryview:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.view(torch.uint8).numpy()).cast("B")


def write_safetensors(path: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> dict:
    """Write `tensors` in the safetensors format to `path` (via `path.tmp` + fsync + rename).
    Returns {"bytes": size, "crc32": crc of the whole file}."""
    header, offset = {}, 0
    names = sorted(tensors)
    for name in names:
        t = tensors[name]
        if t.dtype not in _DTYPES:
            raise TypeError(f"{path}: tensor {name!r} has unsupported dtype {t.dtype}")
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    prefix = struct.pack("<Q", len(head)) + head
    crc = zlib.crc32(prefix)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(prefix)
            for name in names:
                data = tensor_bytes(tensors[name])
                if len(data):
                    f.write(data)
                    crc = zlib.crc32(data, crc)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))
    return {"bytes": len(prefix) + offset, "crc32": crc}


@dataclass
class Entry:
    """One tensor (or piece of one) to write: `tensor` holds elements `flat` of block `ranges` of a
    global tensor of shape `shape`."""
    key: str
    tensor: torch.Tensor
    shape: list[int]
    ranges: Ranges
    flat: list[int] | None = None
    local: bool = False            # rank-specific (RNG): never resharded

    def describe(self) -> dict:
        return {"shape": list(self.shape), "ranges": self.ranges, "flat": self.flat, "local": self.local,
                "dtype": _DTYPES[self.tensor.dtype]}


@dataclass
class RankFile:
    """A saved rank's JSON (parsed) and lazy access to its tensors."""
    folder: str
    rank: int
    meta: dict
    verified: bool = False
    _handle: object = field(default=None, repr=False)

    @property
    def tensor_path(self) -> str:
        return os.path.join(self.folder, rank_stem(self.rank) + ".safetensors")

    def verify(self) -> None:
        if self.verified:
            return
        path = self.tensor_path
        if not os.path.isfile(path):
            raise CheckpointError(f"{path}: missing (listed in {rank_stem(self.rank)}.json)")
        want = self.meta["file"]
        crc, size = file_crc32(path)
        if size != want["bytes"] or crc != want["crc32"]:
            raise CheckpointError(f"{path}: corrupt ({size} bytes, crc32 {crc:08x}; expected {want['bytes']} bytes, "
                                  f"crc32 {want['crc32']:08x})")
        self.verified = True

    def _open(self, verify: bool):
        if verify:
            self.verify()
        if self._handle is None:
            from safetensors import safe_open
            try:
                self._handle = safe_open(self.tensor_path, framework="pt", device="cpu")
            except Exception as err:
                raise CheckpointError(f"{self.tensor_path}: unreadable safetensors file ({err})") from err
        return self._handle

    def get(self, key: str, verify: bool = True) -> torch.Tensor:
        handle = self._open(verify)
        try:
            return handle.get_tensor(key)
        except Exception as err:
            raise CheckpointError(f"{self.tensor_path}: cannot read tensor {key!r} ({err})") from err

    def get_box(self, key: str, box: list[tuple[int, int]], shape: list[int]) -> torch.Tensor:
        """The part [start, stop) per dimension of tensor `key` (a block of `shape`), reading only its
        bytes (rows of a large piece that a rank needs a few of: a replicated tensor saved whole, read in
        row shares)."""
        index = tuple(slice(a, b) for a, b in box)
        handle = self._open(True)
        try:
            part = handle.get_slice(key)
            if list(part.get_shape()) == list(shape):
                return part[index]
            return handle.get_tensor(key).view(shape)[index]     # stored in another shape: read whole
        except Exception as err:
            raise CheckpointError(f"{self.tensor_path}: cannot read tensor {key!r} ({err})") from err


def read_json(path: str) -> dict:
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: missing")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: corrupt JSON ({err})") from err


# -- checkpoint folders -------------------------------------------------------------------------------
def list_complete(save_dir: str) -> list[int]:
    """Iterations of the complete checkpoints in save_dir (marker present), ascending."""
    if not os.path.isdir(save_dir):
        return []
    out = []
    for name in os.listdir(save_dir):
        m = ITER_RE.match(name)
        if m and os.path.isfile(os.path.join(save_dir, name, COMPLETE_MARKER)):
            out.append(int(m.group(1)))
    return sorted(out)


def read_latest(save_dir: str) -> int | None:
    path = os.path.join(save_dir, LATEST_FILE)
    if not os.path.isfile(path):
        return None
    try:
        text = open(path).read().strip()
        return int(text)
    except (OSError, ValueError):
        return None        # Megatron also writes "release"; unreadable -> scan the folders


def unreadable_latest_file(save_dir: str) -> str | None:
    """A description of a latest_checkpointed_iteration.txt that exists but names no iteration (damaged,
    or edited by hand), for a warning; None when it is absent or readable."""
    path = os.path.join(save_dir, LATEST_FILE)
    if not os.path.isfile(path) or read_latest(save_dir) is not None:
        return None
    try:
        text = open(path, errors="replace").read(64).strip()
    except OSError as err:
        return f"{path}: unreadable ({err.strerror})"
    return f"{path}: holds {text!r}, not an iteration number"


def list_replaced_complete(save_dir: str) -> dict[int, str]:
    """{iteration: folder name} of complete `iter_N.replaced-<id>` folders: the only copy of iteration N
    when a save crashed between moving the old iter_N aside and renaming the new one into place."""
    if not os.path.isdir(save_dir):
        return {}
    out = {}
    for name in sorted(os.listdir(save_dir)):
        m = REPLACED_RE.match(name)
        if m and os.path.isfile(os.path.join(save_dir, name, COMPLETE_MARKER)):
            out.setdefault(int(m.group(1)), name)
    return out


def write_latest(save_dir: str, iteration: int) -> bool:
    """Point latest_checkpointed_iteration.txt at `iteration`. It never moves backwards past a complete
    checkpoint: when it already names a later iteration whose folder is complete, it is left as it is
    and False is returned (the caller logs it)."""
    current = read_latest(save_dir)
    if (current is not None and current > iteration
            and os.path.isfile(os.path.join(save_dir, iter_dir_name(current), COMPLETE_MARKER))):
        return False
    atomic_write_bytes(os.path.join(save_dir, LATEST_FILE), f"{iteration}\n".encode())
    return True


def is_iteration_folder(path: str) -> bool:
    """Whether PATH is one iteration's checkpoint folder (named iter_NNNNNNN, or holding a metadata
    file), not a --save folder of them."""
    return bool(ITER_RE.match(os.path.basename(os.path.normpath(path)))) or \
        os.path.isfile(os.path.join(path, METADATA_FILE))


def interrupted_publication(save_dir: str) -> int | None:
    """The iteration of a complete checkpoint newer than the one latest_checkpointed_iteration.txt names and
    completed after that file was last written: a save interrupted between publishing its folder and
    updating the file (saver.CheckpointWriter.finalize), which is the run's latest. None otherwise: a file
    written after that checkpoint was edited on purpose (going back), which preflight.check_save_folder
    refuses to overwrite the newer checkpoint for."""
    latest = read_latest(save_dir)
    newer = [it for it in list_complete(save_dir) if latest is not None and it > latest]
    if not newer:
        return None
    try:
        named_at = os.stat(os.path.join(save_dir, LATEST_FILE)).st_mtime_ns
        completed_at = os.stat(os.path.join(save_dir, iter_dir_name(max(newer)), COMPLETE_MARKER)).st_mtime_ns
    except OSError:
        return None
    return max(newer) if completed_at >= named_at else None


def named_latest(save_dir: str) -> int | None:
    """The iteration a --load of save_dir continues from: the one latest_checkpointed_iteration.txt names, or
    a newer one whose publication was interrupted (interrupted_publication)."""
    interrupted = interrupted_publication(save_dir)
    return interrupted if interrupted is not None else read_latest(save_dir)


def checkpoint_candidates(path: str) -> list[str]:
    """Folders to try for --load PATH, best first: the latest one (named_latest), then every other complete
    one before it, newest first. PATH may also be one iter_NNNNNNN folder."""
    path = os.path.abspath(path)
    if is_iteration_folder(path):
        return [path]
    latest = named_latest(path)
    complete = list_complete(path)
    order = []
    if latest is not None:
        order.append(os.path.join(path, iter_dir_name(latest)))
    order += [os.path.join(path, iter_dir_name(it)) for it in sorted(complete, reverse=True)
              if latest is None or it < latest]
    return order


def readable_copy(folder: str) -> str:
    """`folder`, or where an interrupted save of its iteration left the only copy (`iter_N.replaced-<id>`,
    which the checkpointer renames back before it loads: saver.recover_replaced)."""
    parent, name = os.path.split(folder)
    match = ITER_RE.match(name)
    if os.path.isdir(folder) or match is None:
        return folder
    replaced = list_replaced_complete(parent).get(int(match.group(1)))
    return folder if replaced is None else os.path.join(parent, replaced)


def read_rank_meta(folder: str, rank: int, manifest: dict) -> dict:
    """Rank `rank`'s JSON, checked against the manifest (its crc32 and size, and its tensor file's size;
    the tensor file's crc32 is RankFile.verify's)."""
    name = rank_stem(rank) + ".json"
    path = os.path.join(folder, name)
    try:
        with open(path, "rb") as f:
            data = f.read()          # read once: checked, then parsed
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except OSError as err:
        raise CheckpointError(f"{path}: unreadable ({err})") from err
    want = manifest.get(name)
    if want is None or zlib.crc32(data) != want["crc32"] or len(data) != want["bytes"]:
        raise CheckpointError(f"{path}: corrupt (does not match the manifest in {METADATA_FILE})")
    try:
        meta = json.loads(data)
    except ValueError as err:
        raise CheckpointError(f"{path}: corrupt JSON ({err})") from err
    name = rank_stem(rank) + ".safetensors"
    path = os.path.join(folder, name)
    if manifest.get(name) != {"bytes": meta["file"]["bytes"], "crc32": meta["file"]["crc32"]}:
        raise CheckpointError(f"{path}: manifest and rank JSON disagree")
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: missing")
    if os.path.getsize(path) != meta["file"]["bytes"]:
        raise CheckpointError(f"{path}: corrupt (size {os.path.getsize(path)}, expected {meta['file']['bytes']})")
    return meta


def manifest_size_problems(folder: str, manifest: dict) -> list[str]:
    """The files of a checkpoint folder's manifest that are missing or of another size than it records, one
    line each: a look at the sizes only (the loader checks every crc32)."""
    problems = []
    for name, entry in manifest.items():
        path = os.path.join(folder, name)
        try:
            size = os.path.getsize(path)
        except OSError:
            problems.append(f"{path}: missing")
            continue
        if isinstance(entry, dict) and size != entry.get("bytes", size):      # (a malformed entry: the loader's)
            problems.append(f"{path}: corrupt (size {size}, expected {entry['bytes']})")
    return problems


def metadata_problems(meta, path: str) -> list[str]:
    """What makes a metadata.json unusable (a missing part, wrong JSON types), one line each naming `path`."""
    if not isinstance(meta, dict):
        return [f"{path}: expected a JSON object, found {type(meta).__name__}"]
    problems = []
    for key in ("layout", "train_state", "files", "model_config"):
        if not isinstance(meta.get(key), dict):
            what = "missing" if key not in meta else f"{type(meta[key]).__name__}, expected an object"
            problems.append(f"{path}: {key!r} is {what}")
    world_size = meta["layout"].get("world_size") if isinstance(meta.get("layout"), dict) else 1
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        problems.append(f"{path}: layout.world_size is {world_size!r}, expected an integer >= 1")
    files = meta.get("files")
    if isinstance(files, dict):
        for name, entry in files.items():
            if not (isinstance(entry, dict) and isinstance(entry.get("bytes"), int)
                    and isinstance(entry.get("crc32"), int)):
                problems.append(f"{path}: files[{name!r}] is {entry!r}, expected {{bytes, crc32}} integers")
                break
    return problems


def read_folder_metadata(folder: str) -> dict:
    """metadata.json of a complete checkpoint folder (COMPLETE present, this format version, its parts there)."""
    if not os.path.isdir(folder):
        raise CheckpointError(f"{folder}: " + ("a file, not a checkpoint folder" if os.path.exists(folder) else
                                              "no such checkpoint folder"))
    marker = os.path.join(folder, COMPLETE_MARKER)
    if not os.path.isfile(marker):
        raise CheckpointError(f"{marker}: missing - the save of {folder} did not complete")
    path = os.path.join(folder, METADATA_FILE)
    metadata = read_json(path)
    if isinstance(metadata, dict) and metadata.get("format_version") != FORMAT_VERSION:     # (its parts may differ)
        raise CheckpointError(f"{path}: format version {metadata.get('format_version')} (this code reads "
                              f"{FORMAT_VERSION})")
    problems = metadata_problems(metadata, path)
    if problems:
        raise CheckpointError("; ".join(problems))
    return metadata


class CheckpointFolder:
    """A complete checkpoint folder, opened and checked: metadata, manifest, every rank's JSON.
    `metadata` and `rank_metas`: metadata.json and the rank JSONs, already read and checked by
    read_folder_metadata and read_rank_meta (a training run's ranks each read a share of the rank JSONs:
    TrainingCheckpointer.open_for_load)."""

    def __init__(self, folder: str, verify_all: bool = False, metadata: dict | None = None,
                 rank_metas: list[dict] | None = None):
        self.folder = folder
        self.metadata = read_folder_metadata(folder) if metadata is None else metadata
        manifest = self.metadata["files"]
        world = self.metadata["layout"]["world_size"]
        if rank_metas is None:
            rank_metas = [read_rank_meta(folder, rank, manifest) for rank in range(world)]
        self.ranks: list[RankFile] = [RankFile(folder, rank, meta) for rank, meta in enumerate(rank_metas)]
        for rf in self.ranks if verify_all else []:
            rf.verify()
        # key -> [(rank file, entry description)]
        self.index: dict[str, list[tuple[RankFile, dict]]] = {}
        for rf in self.ranks:
            for key, desc in rf.meta["entries"].items():
                self.index.setdefault(key, []).append((rf, desc))

    @property
    def iteration(self) -> int:
        return self.metadata["iteration"]

    def keys(self, prefix: str = "") -> list[str]:
        return [k for k in self.index if k.startswith(prefix)]

    def has(self, key: str) -> bool:
        return key in self.index

    def global_shape(self, key: str) -> list[int]:
        return self.index[key][0][1]["shape"]

    def full(self, key: str) -> torch.Tensor:
        """The global tensor, assembled from every piece of every rank."""
        pieces = self.index.get(key)
        if not pieces:
            raise CheckpointError(f"{self.folder}: no tensor {key!r} in any rank file")
        shape = pieces[0][1]["shape"]
        dtype = DTYPE_NAMES[pieces[0][1]["dtype"]]
        if len(shape) == 0:
            return pieces[0][0].get(key).clone()
        full = torch.empty(shape, dtype=dtype)
        # Coverage is tracked per element, not counted: ranks that replicate a slice (a KV head shared
        # by TP ranks when TP > KV heads) each write it, so pieces may overlap.
        covered = torch.zeros(shape, dtype=torch.bool)
        for rf, desc in pieces:
            data = rf.get(key)
            block_shape = ranges_shape(desc["ranges"])
            if desc["flat"] is None:
                write_block(full, desc["ranges"], data.view(block_shape))
                write_block(covered, desc["ranges"], torch.ones(block_shape, dtype=torch.bool))
            else:
                a, b = desc["flat"]
                for target, values in ((full, data.view(-1)), (covered, True)):
                    block = read_block(target, desc["ranges"])
                    block.view(-1)[a:b] = values
                    write_block(target, desc["ranges"], block)
        if not bool(covered.all()):
            raise CheckpointError(f"{self.folder}: tensor {key!r} is incomplete ({int(covered.sum())} of "
                                  f"{full.numel()} elements in {sorted({rf.tensor_path for rf, _ in pieces})})")
        return full

    def piece(self, key: str, ranges: Ranges, flat: list[int] | None, cache: dict | None = None) -> torch.Tensor:
        """The block `ranges` (flattened piece `flat` of it) of tensor `key`, for any target layout.
        Uses a saved entry with exactly that slicing when there is one (same layout: no assembly), else
        the saved pieces that overlap the block (or the flat piece of a block saved in flat pieces), else
        the whole tensor, assembled (kept in `cache` for the next block of it)."""
        pieces = self.index.get(key, [])
        dtype = DTYPE_NAMES[pieces[0][1]["dtype"]] if pieces else None
        for rf, desc in pieces:
            if desc["ranges"] == ranges and desc["flat"] == flat:
                return rf.get(key).view(ranges_shape(ranges) if flat is None else [flat[1] - flat[0]]).clone()
        if flat is None:
            block = block_from_pieces(key, pieces, ranges, dtype) if ranges else None
        else:
            block = flat_part_from_pieces(key, pieces, ranges, flat, dtype)
        if block is not None:
            return block
        if cache is not None and key in cache:
            full = cache[key]
        else:
            full = self.full(key)
            if cache is not None:
                cache.clear()          # keep one assembled tensor at a time
                cache[key] = full
        if full.dim() == 0:
            return full.clone()
        block = read_block(full, ranges)
        if flat is not None:
            return block.reshape(-1)[flat[0]:flat[1]].clone()
        return block
