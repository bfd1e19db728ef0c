"""safetensors files with plain Python: an 8-byte header length, a JSON header, raw little-endian data.

No `safetensors` package needed. Reading validates what src/model/safetensors.cpp validates (header
size, dtypes, offsets inside the file, element counts, tensors tiling the data) and names the file in
every error. Files carry attnres's payload checksums (docs/reliability.md, "Checksums of weights and
checkpoints"): XXH3-64 of each tensor's bytes and of the other metadata, under the metadata key
``attnres.checksum``. Reading verifies them, naming the first tensor in file order whose bytes differ;
a file without them loads with an ``UnverifiedWarning``. Writing adds them and is atomic (temporary
file, fsync, rename), as attnres writes its own files.

XXH3-64 comes from the ``xxhash`` module (Debian's python3-xxhash, which scripts/install-deps.sh
installs) or, without it, from libxxhash itself (libxxhash0, the C library attnres builds with).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import struct
import tempfile
import warnings
from typing import Callable, Dict, Mapping, Optional, Tuple

import numpy as np

_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
           "U8": "u1", "BOOL": "?"}
_TO_ST = {np.dtype("<f8"): "F64", np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i8"): "I64",
          np.dtype("<i4"): "I32", np.dtype("<i2"): "I16", np.dtype("i1"): "I8", np.dtype("u1"): "U8",
          np.dtype("?"): "BOOL"}
_MAX_HEADER = 100 << 20


# The metadata key of the digests and their algorithm (src/util/checksum.hpp, src/model/safetensors.hpp).
CHECKSUM_KEY = "attnres.checksum"
CHECKSUM_ALGORITHM = "xxh3-64"


class SafetensorsError(ValueError):
    """A malformed, corrupt or unexpected safetensors file; the message names the file (and tensor)."""


class UnverifiedWarning(UserWarning):
    """A file without attnres's payload checksums (written before attnres added them, or by another tool)."""


def _xxh3_from_module() -> Optional[Callable]:
    try:
        import xxhash
    except ImportError:
        return None
    return xxhash.xxh3_64_hexdigest


def _xxh3_from_library() -> Optional[Callable]:
    for name in (ctypes.util.find_library("xxhash"), "libxxhash.so.0"):
        if not name:
            continue
        try:
            fn = ctypes.CDLL(name).XXH3_64bits
        except (OSError, AttributeError):
            continue
        fn.restype, fn.argtypes = ctypes.c_uint64, [ctypes.c_void_p, ctypes.c_size_t]

        def digest(data, fn=fn) -> str:
            a = np.frombuffer(data, dtype=np.uint8)  # no copy, whatever the buffer
            return f"{fn(a.ctypes.data, a.size):016x}"
        return digest
    return None


_XXH3_BACKENDS = {"module": _xxh3_from_module, "library": _xxh3_from_library}
_xxh3 = None


def xxh3_64_hex(data) -> str:
    """XXH3-64 (seed 0) of a bytes-like object as 16 lower-case hex digits: the digest attnres writes."""
    global _xxh3
    if _xxh3 is None:
        _xxh3 = _XXH3_BACKENDS["module"]() or _XXH3_BACKENDS["library"]()
        if _xxh3 is None:
            raise SafetensorsError("no XXH3-64 implementation to check or write payload checksums with: install "
                                   "Debian's python3-xxhash (scripts/install-deps.sh) or libxxhash0, or "
                                   "`pip install xxhash`")
    return _xxh3(data)


def metadata_digest(metadata: Mapping[str, str]) -> str:
    """The digest of the metadata (without the checksum entry): XXH3-64 of its compact JSON object with sorted
    keys, as attnres's nlohmann::json writes a std::map."""
    text = json.dumps(dict(metadata), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return xxh3_64_hex(text.encode("utf-8"))


def _read_header(path: str) -> Tuple[dict, Dict[str, str], Optional[str], int]:
    """(tensor entries, metadata without the checksum entry, the checksum entry or None, data offset)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorsError(f"'{path}': not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER:
            raise SafetensorsError(f"'{path}': not a safetensors file (header of {n} bytes)")
        raw = f.read(n)
    if len(raw) < n:
        raise SafetensorsError(f"'{path}': truncated header")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"'{path}': malformed JSON header: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"'{path}': the header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise SafetensorsError(f"'{path}': __metadata__ must map strings to strings")
    checksum = meta.pop(CHECKSUM_KEY, None)
    return header, meta, checksum, 8 + n


def read_header(path: str) -> Tuple[dict, Dict[str, str], int]:
    """(tensor entries, metadata, offset of the data section) without reading the data (so unverified).
    The metadata leaves out the checksum entry, as load's does."""
    header, meta, _, begin = _read_header(path)
    return header, meta, begin


def _verify(path: str, checksum: str, meta: Mapping[str, str], order: list, data) -> None:
    """Checks the digests of `checksum` (the metadata value) against the payload, as
    src/model/safetensors.cpp does: `order` is (first byte, last byte, name) of every tensor in file order."""
    def bad(what):
        return SafetensorsError(f"'{path}': {what}")
    try:
        sums = json.loads(checksum)
    except json.JSONDecodeError as e:
        raise bad(f"corrupt '{CHECKSUM_KEY}' metadata: {e}") from None
    if not isinstance(sums, dict):
        raise bad(f"the '{CHECKSUM_KEY}' metadata is not a JSON object")
    if not isinstance(sums.get("algorithm"), str):
        raise bad(f"the '{CHECKSUM_KEY}' metadata names no algorithm")
    if sums["algorithm"] != CHECKSUM_ALGORITHM:
        raise bad(f"checksum algorithm '{sums['algorithm']}' is not supported (attnres writes and reads "
                  f"{CHECKSUM_ALGORITHM})")
    tensors = sums.get("tensors")
    if not isinstance(tensors, dict):
        raise bad(f"the '{CHECKSUM_KEY}' metadata has no \"tensors\" object")
    names = {name for _, _, name in order}
    for name in tensors:
        if name not in names:
            raise bad(f"the '{CHECKSUM_KEY}' metadata names tensor '{name}', which the file does not hold")

    def stored(obj, key, what):
        v = obj.get(key)
        if not isinstance(v, str) or len(v) != 16:
            raise bad(f"the '{CHECKSUM_KEY}' metadata has no valid digest for {what}")
        return v
    for lo, hi, name in order:
        want = stored(tensors, name, f"tensor '{name}'")
        got = xxh3_64_hex(memoryview(data)[lo:hi])
        if got != want:
            raise bad(f"tensor '{name}' does not match its checksum ({CHECKSUM_ALGORITHM} {got}, stored {want}): "
                      "the file is corrupt")
    want = stored(sums, "metadata", "the metadata")
    got = metadata_digest(meta)
    if got != want:
        raise bad(f"the metadata does not match its checksum ({CHECKSUM_ALGORITHM} {got}, stored {want}): the file "
                  "is corrupt")


def load(path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """({name: array}, metadata). Arrays are writable copies in their stored dtype (BF16 becomes float32).
    The payload checksums are verified (SafetensorsError naming the first tensor that differs); a file
    without them loads with an UnverifiedWarning. The metadata leaves out the checksum entry."""
    header, meta, checksum, begin = _read_header(path)
    with open(path, "rb") as f:
        f.seek(begin)
        data = f.read()
    out, order = {}, []
    for name, info in header.items():
        try:
            dtype, shape = info["dtype"], [int(s) for s in info["shape"]]
            lo, hi = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"'{path}': tensor '{name}' has a malformed header entry") from None
        if not 0 <= lo <= hi <= len(data):
            raise SafetensorsError(f"'{path}': tensor '{name}' lies outside the file (offsets {lo}..{hi}, "
                                   f"{len(data)} data bytes)")
        raw = data[lo:hi]
        if dtype == "BF16":
            if len(raw) % 2:
                raise SafetensorsError(f"'{path}': tensor '{name}': odd byte count for BF16")
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dtype in _DTYPES:
            size = np.dtype(_DTYPES[dtype]).itemsize
            if len(raw) % size:
                raise SafetensorsError(f"'{path}': tensor '{name}': {len(raw)} bytes is not a whole number of {dtype}")
            arr = np.frombuffer(raw, dtype=_DTYPES[dtype])
        else:
            raise SafetensorsError(f"'{path}': tensor '{name}' has unsupported dtype '{dtype}'")
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise SafetensorsError(f"'{path}': tensor '{name}': {arr.size} elements for shape {shape}")
        out[name] = arr.reshape(shape).copy()
        order.append((lo, hi, name))
    # The tensors tile the data exactly: no holes, no overlaps (as the safetensors format requires).
    order.sort()
    covered = 0
    for lo, hi, name in order:
        if lo != covered:
            raise SafetensorsError(f"'{path}': tensor '{name}' " + ("overlaps another tensor" if lo < covered else
                                                                   "leaves a hole in the data before it"))
        covered = hi
    if covered != len(data):
        raise SafetensorsError(f"'{path}': file size does not match its tensors ({len(data)} data bytes, tensors "
                               f"cover {covered})")
    if checksum is None:
        warnings.warn(f"'{path}' carries no payload checksum (written before attnres added them, or by another "
                      "tool): loaded unverified", UnverifiedWarning, stacklevel=2)
    else:
        _verify(path, checksum, meta, order, data)
    return out, meta


def save(path: str, tensors: Mapping[str, np.ndarray], metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes numpy arrays (or anything np.asarray takes, e.g. CPU tensors via .numpy()) atomically, with
    attnres's payload checksums in the metadata (key ``attnres.checksum``, reserved)."""
    header, chunks, offset = {}, [], 0
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    if CHECKSUM_KEY in meta:
        raise SafetensorsError(f"'{path}': metadata key '{CHECKSUM_KEY}' is reserved (save writes the checksums)")
    sums = {"algorithm": CHECKSUM_ALGORITHM, "metadata": metadata_digest(meta), "tensors": {}}
    header["__metadata__"] = meta
    for name, t in tensors.items():
        a = np.asarray(t)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        if a.dtype not in _TO_ST:
            raise SafetensorsError(f"'{path}': tensor '{name}' has unsupported dtype {a.dtype}")
        b = a.tobytes(order="C")
        if name == "__metadata__" or name in header:
            raise SafetensorsError(f"'{path}': bad or repeated tensor name '{name}'")
        header[name] = {"dtype": _TO_ST[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        sums["tensors"][name] = xxh3_64_hex(b)
        chunks.append(b)
        offset += len(b)
    meta[CHECKSUM_KEY] = json.dumps(sums, separators=(",", ":"))
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)  # the data section starts 8-byte aligned
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=directory)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would differ from an ordinary file's mode
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            for b in chunks:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
