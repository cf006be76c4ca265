"""The few CUDA driver calls the package makes itself, through ctypes on ``libcuda.so.1``.

The package needs them for three things: which GPU a buffer lives on, making that GPU's primary context
(the one the CUDA runtime, and so torch and cupy, use) current around library calls, and the device copy
of the connection table that kernels take. The driver is loaded on first use; on a machine without one
(where only the host-only parts work) :func:`available` is False and nothing here is called.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Iterator, Optional

_lock = threading.Lock()
_driver: Optional[ctypes.CDLL] = None
_load_error: Optional[str] = None

CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9


class DriverError(RuntimeError):
    """A CUDA driver call made by the package failed."""


def _load() -> Optional[ctypes.CDLL]:
    global _driver, _load_error
    with _lock:
        if _driver is not None or _load_error is not None:
            return _driver
        try:
            d = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            _load_error = f"the CUDA driver (libcuda.so.1) cannot be loaded: {e}"
            return None
        p, i = ctypes.c_void_p, ctypes.c_int
        for name, argtypes in {
            "cuInit": [ctypes.c_uint],
            "cuGetErrorName": [i, ctypes.POINTER(ctypes.c_char_p)],
            "cuDeviceGetCount": [ctypes.POINTER(i)],
            "cuDevicePrimaryCtxRetain": [ctypes.POINTER(p), i],
            "cuDevicePrimaryCtxRelease_v2": [i],
            "cuCtxPushCurrent_v2": [p],
            "cuCtxPopCurrent_v2": [ctypes.POINTER(p)],
            "cuCtxGetCurrent": [ctypes.POINTER(p)],
            "cuCtxGetDevice": [ctypes.POINTER(i)],
            "cuPointerGetAttribute": [p, i, ctypes.c_uint64],
            "cuMemAlloc_v2": [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t],
            "cuMemFree_v2": [ctypes.c_uint64],
            "cuMemcpyHtoD_v2": [ctypes.c_uint64, p, ctypes.c_size_t],
            "cuMemcpyDtoH_v2": [p, ctypes.c_uint64, ctypes.c_size_t],
        }.items():
            f = getattr(d, name)
            f.restype = i
            f.argtypes = argtypes
        rc = d.cuInit(0)
        if rc != 0:
            _load_error = f"cuInit failed: {_name(d, rc)} (no usable GPU?)"
            return None
        _driver = d
        return d


def _name(d: ctypes.CDLL, rc: int) -> str:
    s = ctypes.c_char_p()
    if d.cuGetErrorName(rc, ctypes.byref(s)) == 0 and s.value:
        return s.value.decode()
    return f"CUresult {rc}"


def available() -> bool:
    """Whether the CUDA driver loads and initialises here."""
    return _load() is not None


def unavailable_reason() -> str:
    _load()
    return _load_error or ""


def _check(rc: int, what: str) -> None:
    if rc != 0:
        assert _driver is not None
        raise DriverError(f"{what} failed: {_name(_driver, rc)}")


def _d() -> ctypes.CDLL:
    d = _load()
    if d is None:
        raise DriverError(_load_error or "no CUDA driver")
    return d


def device_count() -> int:
    """GPUs the driver sees (0 without a driver)."""
    d = _load()
    if d is None:
        return 0
    n = ctypes.c_int()
    return n.value if d.cuDeviceGetCount(ctypes.byref(n)) == 0 else 0


def pointer_device(ptr: int) -> Optional[int]:
    """The ordinal of the GPU that device pointer ``ptr`` belongs to; None when the driver does not know the
    pointer (host memory, a bad pointer) or there is no driver."""
    d = _load()
    if d is None:
        return None
    ordinal = ctypes.c_int()
    if d.cuPointerGetAttribute(ctypes.byref(ordinal), CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) != 0:
        return None
    return ordinal.value


def current_device() -> Optional[int]:
    """The device of the context current on this thread; None if there is none (or no driver)."""
    d = _load()
    if d is None:
        return None
    ctx = ctypes.c_void_p()
    if d.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or not ctx.value:
        return None
    dev = ctypes.c_int()
    return dev.value if d.cuCtxGetDevice(ctypes.byref(dev)) == 0 else None


@contextlib.contextmanager
def device_context(device: Optional[int]) -> Iterator[None]:
    """Makes ``device``'s primary context current on this thread for the block, then restores the thread's
    previous context. Does nothing for ``device=None`` or without a driver."""
    d = _load() if device is not None else None
    if d is None or device is None:
        yield
        return
    ctx = ctypes.c_void_p()
    _check(d.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), f"cuDevicePrimaryCtxRetain({device})")
    try:
        _check(d.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        try:
            yield
        finally:
            # The library may have set its context current meanwhile (the same one): pop whatever is on top.
            popped = ctypes.c_void_p()
            d.cuCtxPopCurrent_v2(ctypes.byref(popped))
    finally:
        d.cuDevicePrimaryCtxRelease_v2(device)


def retain_primary(device: int) -> Optional[int]:
    """Retains ``device``'s primary context (so that it outlives every framework's use of it) and returns
    its handle (then :func:`release_primary` must follow); None without a driver."""
    d = _load()
    if d is None:
        return None
    ctx = ctypes.c_void_p()
    _check(d.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), f"cuDevicePrimaryCtxRetain({device})")
    return ctx.value


def current_context() -> Optional[int]:
    """The handle of the context current on this thread; None if there is none or the driver was never
    loaded. One driver call: the collectives ask it on every call, to skip making their context current
    when it already is."""
    d = _driver
    if d is None:
        return None
    ctx = ctypes.c_void_p()
    if d.cuCtxGetCurrent(ctypes.byref(ctx)) != 0:
        return None
    return ctx.value


def release_primary(device: int) -> None:
    if _driver is not None:
        _driver.cuDevicePrimaryCtxRelease_v2(device)


class DeviceMemory:
    """``nbytes`` of device memory on ``device`` (its primary context), freed by :meth:`free`."""

    def __init__(self, device: int, nbytes: int) -> None:
        self.device = device
        self.nbytes = nbytes
        self.ptr = 0
        d = _d()
        ctx = ctypes.c_void_p()
        # Retained for as long as the memory lives, so that the context outlives it.
        _check(d.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), f"cuDevicePrimaryCtxRetain({device})")
        self._retained = True
        try:
            with device_context(device):
                p = ctypes.c_uint64()
                _check(d.cuMemAlloc_v2(ctypes.byref(p), max(nbytes, 1)), f"cuMemAlloc({nbytes})")
                self.ptr = p.value
        except BaseException:
            self.free()
            raise

    def upload(self, data: bytes) -> None:
        assert len(data) <= self.nbytes
        with device_context(self.device):
            _check(_d().cuMemcpyHtoD_v2(self.ptr, data, len(data)), "cuMemcpyHtoD")

    def download(self) -> bytes:
        buf = ctypes.create_string_buffer(self.nbytes)
        with device_context(self.device):
            _check(_d().cuMemcpyDtoH_v2(buf, self.ptr, self.nbytes), "cuMemcpyDtoH")
        return buf.raw

    def free(self) -> None:
        d = _driver
        if d is None:
            return
        if self.ptr:
            with device_context(self.device):
                d.cuMemFree_v2(self.ptr)
            self.ptr = 0
        if self._retained:
            d.cuDevicePrimaryCtxRelease_v2(self.device)
            self._retained = False
