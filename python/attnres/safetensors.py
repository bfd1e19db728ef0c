"""safetensors files with plain Python: an 8-byte header length, a JSON header, raw little-endian data.

No `safetensors` package needed. Reading validates what src/model/safetensors.cpp validates (header
size, dtypes, offsets inside the file, element counts) and names the file in every error. Writing is
atomic (temporary file, fsync, rename), as attnres writes its own files.
"""
from __future__ import annotations

import json
import os
import struct
import tempfile
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
           "U8": "u1", "BOOL": "?"}
_TO_ST = {np.dtype("<f8"): "F64", np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i8"): "I64",
          np.dtype("<i4"): "I32", np.dtype("<i2"): "I16", np.dtype("i1"): "I8", np.dtype("u1"): "U8",
          np.dtype("?"): "BOOL"}
_MAX_HEADER = 100 << 20


class SafetensorsError(ValueError):
    """A malformed or unexpected safetensors file; the message names the file."""


def read_header(path: str) -> Tuple[dict, Dict[str, str], int]:
    """(tensor entries, metadata, offset of the data section) without reading the data."""
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
    return header, meta, 8 + n


def load(path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """({name: array}, metadata). Arrays are writable copies in their stored dtype (BF16 becomes float32)."""
    header, meta, begin = read_header(path)
    with open(path, "rb") as f:
        f.seek(begin)
        data = f.read()
    out = {}
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
    return out, meta


def save(path: str, tensors: Mapping[str, np.ndarray], metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes numpy arrays (or anything np.asarray takes, e.g. CPU tensors via .numpy()) atomically."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        a = np.asarray(t)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        if a.dtype not in _TO_ST:
            raise SafetensorsError(f"'{path}': tensor '{name}' has unsupported dtype {a.dtype}")
        b = a.tobytes(order="C")
        header[name] = {"dtype": _TO_ST[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        chunks.append(b)
        offset += len(b)
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
