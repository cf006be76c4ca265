"""GPU buffers from any framework: the address and size behind ``__cuda_array_interface__`` or DLPack.

torch tensors, cupy arrays, numba device arrays and anything else exposing either protocol are accepted,
as long as their memory is one contiguous range on a CUDA device. A plain ``(pointer, nbytes)`` tuple of
ints is accepted as well, for memory allocated otherwise; nothing keeps such memory alive.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

# DLPack's device types (dlpack.h): the ones that are CUDA device memory.
_KDL_CUDA = 2
_KDL_CUDA_MANAGED = 13
_DLPACK_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host (pinned)", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                        9: "VPI", 10: "ROCm", 11: "ROCm host", 13: "CUDA managed", 14: "oneAPI"}


@dataclass(frozen=True)
class DeviceBuffer:
    """One contiguous range of GPU memory.

    ``owner`` is the object the range was taken from (kept referenced by whoever holds this);
    ``device`` is the CUDA device ordinal when the protocol said so, else None; ``dtype`` the element
    type's name (``"float32"``, ``"bfloat16"``, ``"uint8"``, ...) when the protocol gave one the package
    knows (None for raw ranges, other byte orders and types such as structs), and ``itemsize`` its bytes.
    """

    ptr: int
    nbytes: int
    owner: Any
    device: Optional[int] = None
    dtype: Optional[str] = None
    itemsize: int = 1

    @property
    def count(self) -> int:
        """The number of elements (bytes for a range without an element type)."""
        return self.nbytes // self.itemsize


def _contiguous(shape: Sequence[int], strides: Optional[Sequence[int]], itemsize: int) -> bool:
    """Whether strides (in bytes; None means C order) describe one dense C-ordered range."""
    if strides is None:
        return True
    expected = itemsize
    for dim, stride in zip(reversed(list(shape)), reversed(list(strides))):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


# The kinds of an array-interface typestr that name plain numbers, and DLPack's type codes (dlpack.h).
_TYPESTR_KINDS = {"i": "int", "u": "uint", "f": "float", "c": "complex"}
_DLPACK_CODES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex"}
_DLPACK_BOOL = 6


def _typestr_dtype(typestr: str) -> Optional[str]:
    """``"<f4"`` -> ``"float32"``; None for a byte order other than this machine's (every CUDA machine is
    little-endian) and for kinds that are not plain numbers."""
    order, kind, size = typestr[0], typestr[1], int(typestr[2:])
    if order == ">" and size > 1:
        return None
    if kind == "b":
        return "bool"
    base = _TYPESTR_KINDS.get(kind)
    return f"{base}{size * 8}" if base else None


def _from_cai(obj: Any, cai: dict) -> DeviceBuffer:
    shape = tuple(cai["shape"])
    typestr = cai["typestr"]
    itemsize = int(typestr[2:])
    if cai.get("mask") is not None:
        raise TypeError("a masked __cuda_array_interface__ buffer cannot be connected")
    if not _contiguous(shape, cai.get("strides"), itemsize):
        raise ValueError(f"the buffer is not contiguous (shape {shape}, strides {cai.get('strides')}); "
                         "pass a contiguous one (e.g. tensor.contiguous())")
    ptr = int(cai["data"][0])
    return DeviceBuffer(ptr=ptr, nbytes=math.prod(shape) * itemsize, owner=obj, dtype=_typestr_dtype(typestr),
                        itemsize=itemsize)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(obj: Any) -> DeviceBuffer:
    if hasattr(obj, "__dlpack_device__"):
        dev_type, dev_id = obj.__dlpack_device__()
        if int(dev_type) not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
            where = _DLPACK_DEVICE_NAMES.get(int(dev_type), f"device type {int(dev_type)}")
            raise TypeError(f"the buffer is in {where} memory; CUDA device memory is needed")
    # The legacy (unversioned) capsule: the DLManagedTensor starts with its DLTensor. The capsule is not
    # consumed: its destructor calls the producer's deleter once the capsule goes, after the owner is no
    # longer needed (both are kept together).
    capsule = obj.__dlpack__()
    if not _capsule_is_valid(capsule, b"dltensor"):
        raise TypeError("__dlpack__() did not return a DLPack tensor capsule")
    t = _DLTensor.from_address(_capsule_get_pointer(capsule, b"dltensor"))
    if t.device.device_type not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        where = _DLPACK_DEVICE_NAMES.get(t.device.device_type, f"device type {t.device.device_type}")
        raise TypeError(f"the buffer is in {where} memory; CUDA device memory is needed")
    shape = [t.shape[i] for i in range(t.ndim)]
    itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
    strides = None if not t.strides else [t.strides[i] * itemsize for i in range(t.ndim)]
    if not _contiguous(shape, strides, itemsize):
        raise ValueError(f"the buffer is not contiguous (shape {shape}); pass a contiguous one")
    ptr = (t.data or 0) + t.byte_offset
    dtype = None
    if t.dtype.lanes == 1:
        base = _DLPACK_CODES.get(t.dtype.code)
        dtype = "bool" if t.dtype.code == _DLPACK_BOOL else (f"{base}{t.dtype.bits}" if base else None)
    return DeviceBuffer(ptr=ptr, nbytes=math.prod(shape) * itemsize, owner=(obj, capsule),
                        device=t.device.device_id, dtype=dtype, itemsize=max(itemsize, 1))


def device_buffer(obj: Any) -> DeviceBuffer:
    """The contiguous GPU memory of ``obj``: an object with ``__cuda_array_interface__`` (preferred) or
    ``__dlpack__``, a :class:`DeviceBuffer`, or a ``(pointer, nbytes)`` tuple of ints.

    Raises ``TypeError`` for anything else (host memory included) and ``ValueError`` for a
    non-contiguous or empty buffer.
    """
    buf = device_array(obj)
    if buf.nbytes <= 0:
        raise ValueError("the buffer is empty; a connection needs at least one byte")
    if buf.ptr <= 0:
        raise ValueError(f"the buffer's address is {buf.ptr:#x}")
    return buf


def device_array(obj: Any) -> DeviceBuffer:
    """As :func:`device_buffer`, but an empty array (which collectives accept, as a call that does nothing)
    is not an error."""
    if isinstance(obj, DeviceBuffer):
        buf = obj
    elif isinstance(obj, tuple) and len(obj) == 2 and all(isinstance(x, int) for x in obj):
        buf = DeviceBuffer(ptr=obj[0], nbytes=obj[1], owner=None)
    else:
        reasons = []
        found: Optional[DeviceBuffer] = None
        try:
            cai = obj.__cuda_array_interface__
        except AttributeError:
            cai = None
        except Exception as e:  # torch refuses tensors that require grad, for one
            reasons.append(f"__cuda_array_interface__: {e}")
            cai = None
        if cai is not None:
            found = _from_cai(obj, cai)
        elif hasattr(obj, "__dlpack__"):
            try:
                found = _from_dlpack(obj)
            except (TypeError, ValueError):
                raise
            except Exception as e:
                reasons.append(f"__dlpack__: {e}")
        if found is None:
            why = f" ({'; '.join(reasons)})" if reasons else ""
            raise TypeError(
                f"{type(obj).__name__} is not a GPU buffer{why}: pass a CUDA torch tensor, a cupy array, another "
                "object with __cuda_array_interface__ or __dlpack__, or a (pointer, nbytes) tuple"
            )
        buf = found
    return buf


def stream_handle(stream: Any) -> int:
    """A ``cudaStream_t`` as an int, from ``None``/0 (the default stream), an int, a torch stream
    (``.cuda_stream``), a cupy stream (``.ptr``) or any object with ``__cuda_stream__`` (the CUDA stream
    protocol: a method returning ``(version, handle)``)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if callable(proto):
        return int(proto()[1])
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise TypeError(f"{type(stream).__name__} is not a CUDA stream (expected None, an int handle, a torch or "
                    "cupy stream)")
