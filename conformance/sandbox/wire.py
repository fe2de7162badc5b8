"""What crosses between verify and the process the port runs in: trees of arrays as JSON beside
array files, in a directory verify owns.

A tree is JSON: numbers, strings, booleans, None, lists, string-keyed objects, and tagged
objects: ``{"__array__": "3/7.npy", "dtype": "bfloat16"}`` (a large array, NumPy's format
read with ``allow_pickle=False``, mapped), ``{"__array__": "3/p1.bin", "dtype": "float32",
"offset": 128, "shape": [2, 5]}`` (a small one, raw bytes at that offset of a pack file that
holds the small arrays of one tree: a file each cost a file's creation, a quarter of a
millisecond on ext4, for arrays of a few hundred bytes, and a deep config's taps number in the
hundreds of thousands); bfloat16, which NumPy's format cannot name, travels as its uint16
bits; ``{"__taps__": {...}, ...}`` (a captured forward's ``Taps`` with what it could not see,
its findings and a second pass), ``{"__unreadable__": "why"}`` (a value that is no array),
``{"__tuple__": [...]}`` and ``{"__array__float__": "inf"}`` (a float JSON cannot hold).
Nothing is unpickled: what the port's process writes is read as numbers or refused.
"""

from __future__ import annotations

import errno
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from conformance.returned import Quantized, Taps

# dtypes an array may cross in (the numeric ones a port may emit)
DTYPES = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
    + ["float16", "bfloat16", "float32", "float64", "complex64", "complex128"]
)
# a numbered directory under the root, a numbered array file or pack
_FILE = re.compile(r"^[0-9]{1,9}/([0-9]{1,9}\.npy|p[0-9]{1,9}\.bin)$")
MAX_MESSAGE = 64 * 2**20  # bytes of JSON in one answer
# Arrays of at least this many bytes are mapped, smaller ones read: a mapping holds a file
# descriptor for as long as the array lives, and a deep config's taps number in the hundreds of
# thousands (a full-size stage is megabytes: its pages are what mapping is for).
MAP_AT_LEAST = 1 << 20
# A pack file is closed at this size and the next one begun: an array read from a pack keeps the
# whole pack's bytes alive, so a few long-lived small arrays never hold a tree's every tap.
PACK_BYTES = 16 << 20
_ALIGN = 64  # each packed array starts at a multiple of 64 bytes (any dtype's alignment)


class WireError(Exception):
    """What the port's process sent cannot be read (the tool's side refuses it)."""


class Refused:
    """A value the port's process would not write (``conformance.sandbox.portable``), and why:
    it crosses as ``{"__unreadable__": why}``."""

    def __init__(self, why: str):
        self.why = why


class Writer:
    """Encodes trees into ``root/sub`` (``sub`` a number), an ``.npy`` file per large array and
    pack files of the small ones, each named relative to ``root``."""

    def __init__(self, root: str | Path, sub: int | str):
        self.root, self.sub = Path(root), str(int(sub))
        (self.root / self.sub).mkdir(exist_ok=True)
        self.count = 0
        self.packs, self.packed = 0, PACK_BYTES  # the current pack and its size (none begun)

    def array(self, a) -> dict:
        try:
            a = np.asarray(a)
        except Exception as e:  # noqa: BLE001 - a port may return anything
            return {"__unreadable__": f"output is not an array: {type(a).__name__} ({e})"}
        name = str(a.dtype)
        if name not in DTYPES:
            return {"__unreadable__": f"dtype {name}, not a numeric array"}
        stored = a.view(np.uint16) if name == "bfloat16" else a
        stored = stored if stored.flags.c_contiguous else stored.copy(order="C")  # a 0-d array stays 0-d
        if stored.nbytes < MAP_AT_LEAST:
            return self._pack(stored, name)
        self.count += 1
        file = f"{self.sub}/{self.count}.npy"
        try:
            np.save(self.root / file, stored, allow_pickle=False)
        except OSError as e:
            if e.errno is None:  # NumPy's short write ("N requested and M written"): the disk is full
                raise OSError(errno.ENOSPC, f"no space left on the device ({e})", str(self.root / file)) from None
            raise
        return {"__array__": file, "dtype": name}

    def _pack(self, stored: np.ndarray, name: str) -> dict:
        if self.packed >= PACK_BYTES:
            self.packs, self.packed = self.packs + 1, 0
        file = f"{self.sub}/p{self.packs}.bin"
        offset = -(-self.packed // _ALIGN) * _ALIGN
        with open(self.root / file, "ab") as f:  # appended whole before the tree that names it is sent
            f.write(b"\0" * (offset - self.packed))
            f.write(stored.tobytes())
        self.packed = offset + stored.nbytes
        return {"__array__": file, "dtype": name, "offset": offset, "shape": list(stored.shape)}

    def encode(self, obj):

        if isinstance(obj, Taps):
            return {
                "__taps__": {str(k): self.encode(v) for k, v in obj.items()},
                "unseen": dict(obj.unseen),
                "findings": [list(f) for f in obj.findings],
                "sources": dict(obj.sources),
                "dtypes": dict(obj.dtypes),
                "from_second": sorted(obj.from_second),
                "path": obj.path,
                "second": None if obj.second is None else self.encode(obj.second),
                "quantized": None
                if obj.quantized is None
                else {
                    **{part: self.encode(getattr(obj.quantized, part)) for part in obj.quantized.PARTS},
                    "what": str(obj.quantized.what),
                    "named": dict(obj.quantized.named),
                    "input_levels": {k: int(v) for k, v in obj.quantized.input_levels.items()},
                    "coarse": {k: float(v) for k, v in obj.quantized.coarse.items()},
                },
            }
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, Refused):
            return {"__unreadable__": obj.why}
        if isinstance(obj, (int, float)) and not isinstance(obj, np.generic):
            return obj if np.isfinite(obj) else {"__array__float__": repr(float(obj))}
        if isinstance(obj, Mapping):
            return {str(k): self.encode(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)) and not _numeric_sequence(obj):
            return (
                {"__tuple__": [self.encode(v) for v in obj]}
                if isinstance(obj, tuple)
                else [self.encode(v) for v in obj]
            )
        return self.array(obj)


def _numeric_sequence(obj) -> bool:
    return bool(obj) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in obj)


class Reader:
    """Decodes trees whose arrays are under ``root``; anything else is a ``WireError``."""

    def __init__(self, root: str | Path, mmap: bool = False):
        self.root, self.mmap = Path(root), mmap  # mmap: arrays mapped read-only (they cannot be made writable)
        self._packs: dict[Path, bytes] = {}  # each pack read once

    def array(self, tree: Mapping) -> np.ndarray:
        file, dtype = tree.get("__array__"), tree.get("dtype")
        if not isinstance(file, str) or not _FILE.match(file) or dtype not in DTYPES:
            raise WireError(f"an array reference that is not one: {dict(tree)!r:.200}")
        path = self.root / file
        if file.endswith(".bin"):
            a = self._packed(path, tree, np.dtype(np.uint16 if dtype == "bfloat16" else dtype))
        else:
            a = self._file(path)
        if dtype == "bfloat16":
            import ml_dtypes

            if a.dtype != np.uint16:
                raise WireError(f"{file}: bfloat16 bits must be uint16, got {a.dtype}")
            return a.view(ml_dtypes.bfloat16)
        if str(a.dtype) != dtype:
            raise WireError(f"{file}: dtype {a.dtype}, announced {dtype}")
        return a

    def _packed(self, path: Path, tree: Mapping, dtype: np.dtype) -> np.ndarray:
        """An array of a pack: read-only (backed by the pack's immutable bytes), or a copy of it
        where the reader does not map."""
        offset, shape = tree.get("offset"), tree.get("shape")
        if not (
            type(offset) is int
            and offset >= 0
            and isinstance(shape, list)
            and all(type(n) is int and n >= 0 for n in shape)
        ):
            raise WireError(f"a packed array's offset and shape must be non-negative integers: {dict(tree)!r:.200}")
        if path not in self._packs:
            self._packs[path] = path.read_bytes()
        data, count = self._packs[path], math.prod(shape)  # exact: a shape of huge sizes cannot wrap around
        if offset + count * dtype.itemsize > len(data):
            raise WireError(
                f"{path.name}: an array of {count} x {dtype} at {offset} ends past the pack's {len(data)} bytes"
            )
        a = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
        return a if self.mmap else a.copy()

    def _file(self, path: Path) -> np.ndarray:
        mapped = self.mmap and path.stat().st_size >= MAP_AT_LEAST
        try:
            a = np.load(path, allow_pickle=False, mmap_mode="r" if mapped else None)
        except (OSError, ValueError) as e:  # out of descriptors or mappings, or empty (unmappable): read it
            if not mapped or isinstance(e, OSError) and e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                raise
            a = np.load(path, allow_pickle=False)
        if self.mmap and not mapped:  # read-only for good, as a mapped array is: backed by immutable bytes
            a = np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape)
        return a

    def decode(self, tree):

        if tree is None or isinstance(tree, (bool, int, float, str)):
            return tree
        if isinstance(tree, list):
            return [self.decode(v) for v in tree]
        if not isinstance(tree, dict):
            raise WireError(f"unexpected {type(tree).__name__} in an answer")
        if "__array__" in tree:
            return self.array(tree)
        if "__array__float__" in tree:
            return float(tree["__array__float__"])
        if "__unreadable__" in tree:
            from conformance.numerics.compare import Unreadable  # only verify's side reads one

            return Unreadable(str(tree["__unreadable__"]))
        if "__tuple__" in tree:
            return tuple(self.decode(v) for v in tree["__tuple__"])
        if "__taps__" in tree:
            taps = Taps(
                {k: self.decode(v) for k, v in tree["__taps__"].items()},
                unseen=_strings(tree.get("unseen", {})),
                findings=[(str(s), str(r)) for s, r in tree.get("findings", [])],
                sources=_strings(tree.get("sources", {})),
            )
            taps.dtypes = _strings(tree.get("dtypes", {}))
            taps.from_second = set(map(str, tree.get("from_second", [])))
            taps.path = None if tree.get("path") is None else str(tree["path"])
            taps.second = None if tree.get("second") is None else self.decode(tree["second"])
            q = tree.get("quantized")
            if q is not None:
                parts = [self.decode(q.get(part)) for part in Quantized.PARTS]
                if not all(isinstance(p, dict) and set(p) == set(parts[0]) for p in parts):
                    raise WireError(f"a quantized port's weights must be objects {Quantized.PARTS} of the same keys")
                levels = q.get("input_levels", {})
                if not isinstance(levels, dict) or not all(isinstance(v, int) and v > 0 for v in levels.values()):
                    raise WireError("a quantized port's input levels must be positive integers")
                coarse = q.get("coarse", {})
                if not isinstance(coarse, dict) or not all(isinstance(v, float) and v > 1 for v in coarse.values()):
                    raise WireError("a quantized port's coarse grids must be ratios above 1")
                what, named = str(q.get("what", "")), _strings(q.get("named", {}))
                taps.quantized = Quantized(*parts, what, named, levels, {str(k): v for k, v in coarse.items()})
            return taps
        return {str(k): self.decode(v) for k, v in tree.items()}


def _strings(mapping) -> dict[str, str]:
    if not isinstance(mapping, dict):
        raise WireError("expected an object of strings")
    return {str(k): str(v) for k, v in mapping.items()}


def dumps(message) -> bytes:
    return json.dumps(message, allow_nan=False).encode() + b"\n"


def loads(line: bytes):
    if len(line) > MAX_MESSAGE:
        raise WireError(f"an answer of {len(line)} bytes (at most {MAX_MESSAGE})")
    try:
        return json.loads(line)
    except ValueError as e:
        raise WireError(f"an answer that is not JSON: {e}") from None
