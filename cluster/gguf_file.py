"""A GGUF file's metadata and tensor table, read straight from its memory-mapped header.
The gguf package's reader builds objects for every element of every array, seconds for a
vocabulary of ~50k tokens and merges in each process that opens the model; this reads them
as plain lists in milliseconds. Tensor bytes stay in the map until they are dequantized."""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF value types: the fixed-size ones by struct format, then string and array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    name: str
    ggml_type: int  # a gguf.GGMLQuantizationType value
    shape: tuple[int, ...]  # as GGUF lists it: the innermost (contiguous) dimension first
    offset: int  # of its first byte in the file


@dataclass(frozen=True, slots=True)
class GGUFFile:
    metadata: dict[str, Any]
    tensors: list[GGUFTensor]
    buffer: mmap.mmap

    def tensor_data(self, tensor: GGUFTensor) -> np.ndarray:
        """The tensor's values (float and integer types) or its quantized blocks (uint8, rows
        of blocks), shaped as ``gguf.quants.dequantize`` takes them; a read-only view of the map."""
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import quant_shape_to_byte_shape

        qtype = GGMLQuantizationType(tensor.ggml_type)
        shape = tuple(reversed(tensor.shape))
        plain = {
            GGMLQuantizationType.F16: np.float16,
            GGMLQuantizationType.F32: np.float32,
            GGMLQuantizationType.F64: np.float64,
            GGMLQuantizationType.I8: np.int8,
            GGMLQuantizationType.I16: np.int16,
            GGMLQuantizationType.I32: np.int32,
            GGMLQuantizationType.I64: np.int64,
        }
        if qtype in plain:
            return np.frombuffer(self.buffer, plain[qtype], math.prod(shape), tensor.offset).reshape(shape)
        raw = np.frombuffer(self.buffer, np.uint8, _nbytes(tensor), tensor.offset)
        return raw.reshape(quant_shape_to_byte_shape(shape, qtype))


class _Cursor:
    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer = buffer
        self.at = 0

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from("<" + fmt, self.buffer, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values

    def string(self) -> str:
        (length,) = self.unpack("Q")
        text = self.buffer[self.at : self.at + length].decode("utf-8")
        self.at += length
        return text

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])[0]
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.unpack("IQ")
            if etype in _SCALARS:
                dtype = np.dtype("<" + _SCALARS[etype])
                values = np.frombuffer(self.buffer, dtype, count, self.at).tolist()
                self.at += count * dtype.itemsize
                return values
            return [self.value(etype) for _ in range(count)]
        raise ValueError(f"unknown GGUF value type {vtype} at byte {self.at}")


@lru_cache(maxsize=4)
def read_gguf(path: Path) -> GGUFFile:
    """The file's metadata (each value as a Python scalar, string or list) and tensor table;
    ValueError (or struct.error) on a file that is not GGUF v2/v3, is cut short, or names a
    tensor type we do not know. One per file and process: the config, the tokenizer and the
    weights all read it."""
    with open(path, "rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if buffer[:4] != MAGIC:
        raise ValueError("it does not start with the GGUF magic")
    cursor = _Cursor(buffer)
    cursor.at = 4
    version, tensor_count, kv_count = cursor.unpack("IQQ")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
    metadata = {}
    for _ in range(kv_count):
        key = cursor.string()
        (vtype,) = cursor.unpack("I")
        metadata[key] = cursor.value(vtype)
    infos = []
    for _ in range(tensor_count):
        name = cursor.string()
        (dims,) = cursor.unpack("I")
        shape = cursor.unpack("Q" * dims)
        ggml_type, offset = cursor.unpack("IQ")
        infos.append((name, ggml_type, tuple(shape), offset))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-cursor.at // alignment) * alignment
    tensors = [GGUFTensor(name, t, shape, data_start + offset) for name, t, shape, offset in infos]
    for tensor in tensors:
        end = tensor.offset + _nbytes(tensor)
        if end > len(buffer):
            raise ValueError(f"tensor {tensor.name} ends at byte {end}, past the end of the file ({len(buffer)} bytes)")
    return GGUFFile(metadata, tensors, buffer)


def _nbytes(tensor: GGUFTensor) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.ggml_type)]
    return math.prod(tensor.shape) * size // block
