# SPDX-License-Identifier: Apache-2.0
"""rmmc.Stream: RMM's rmm.pylibrmm.stream.Stream over rmmc's streams.

A CUDA stream as the RMM-style layer takes it: ``Stream()`` creates one
(destroyed with the object), ``Stream(obj)`` wraps an existing stream:
another Stream, anything with the CUDA stream protocol
(``__cuda_stream__``: RMM's, cuda.core's), a Numba stream (``.handle``) or
a CuPy stream (``.ptr``), or a PyTorch stream (``.cuda_stream``), read
as rmmc._args.stream reads every stream argument.
DEFAULT_STREAM, LEGACY_DEFAULT_STREAM and PER_THREAD_DEFAULT_STREAM are
CUDA's special streams. Every call that takes a stream takes one of these,
a stream handle as an int, or any of the objects above.
"""
from __future__ import annotations

import ctypes
from enum import IntEnum
from typing import Any, Optional, Tuple

from ._lib import check, lib

__all__ = ["Stream", "CudaStreamFlags", "DEFAULT_STREAM", "LEGACY_DEFAULT_STREAM",
           "PER_THREAD_DEFAULT_STREAM"]

# CUDA's special handles (driver_types.h): cudaStreamLegacy, cudaStreamPerThread.
_LEGACY, _PER_THREAD = 0x1, 0x2


class CudaStreamFlags(IntEnum):
    """cudaStreamDefault (synchronizes with the legacy default stream) or
    cudaStreamNonBlocking."""
    SYNC_DEFAULT = 0
    NON_BLOCKING = 1


class Stream:
    """A CUDA stream (RMM's Stream): Stream(obj=None, flags=None)."""

    def __init__(self, obj: Optional[Any] = None, flags: Optional[CudaStreamFlags] = None) -> None:
        self._owned = False
        self._owner = None
        if obj is None:
            h = ctypes.c_void_p()
            check(lib().rmmc_stream_create(int(CudaStreamFlags.SYNC_DEFAULT if flags is None
                                                else flags), ctypes.byref(h)), "Stream()")
            self._handle = h.value or 0
            self._owned = True
        else:
            if flags is not None:
                raise ValueError("flags may only be specified when obj is None; flags cannot be "
                                 "applied to an existing stream.")
            from ._args import stream
            self._handle = stream(obj, "Stream(obj)") or 0
            self._owner = obj

    @classmethod
    def _from_handle(cls, handle: int) -> "Stream":
        s = cls.__new__(cls)
        s._handle, s._owned, s._owner = handle, False, None
        return s

    def __cuda_stream__(self) -> Tuple[int, int]:
        return (0, self._handle)

    @property
    def handle(self) -> int:
        """The cudaStream_t as an int."""
        return self._handle

    def synchronize(self) -> None:
        """Waits for the stream's work."""
        check(lib().rmmc_stream_synchronize(self._handle or None), "Stream.synchronize")

    def is_default(self) -> bool:
        """True for the legacy or per-thread default stream."""
        return self._handle in (0, _LEGACY, _PER_THREAD)

    def __eq__(self, other: Any) -> bool:
        """The same stream: another Stream, or its handle as an int (so code
        that read DeviceBuffer.stream as an int keeps comparing)."""
        if isinstance(other, Stream):
            return self._handle == other._handle
        if isinstance(other, int) and not isinstance(other, bool):
            return self._handle == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._handle)

    def __int__(self) -> int:
        return self._handle

    def __copy__(self) -> "Stream":
        """A view of the same stream that keeps this one (and so a stream
        it created) alive."""
        s = Stream._from_handle(self._handle)
        s._owner = self
        return s

    def __deepcopy__(self, memo: dict) -> "Stream":
        return self.__copy__()

    def __reduce__(self):
        raise TypeError("an rmmc.Stream is a CUDA stream of this process and cannot be pickled")

    def __del__(self) -> None:
        if getattr(self, "_owned", False) and self._handle:
            try:
                lib().rmmc_stream_destroy(self._handle)
            except Exception:  # interpreter shutdown
                pass
            self._owned = False

    def __repr__(self) -> str:
        return "rmmc.Stream(0x%x)" % self._handle


DEFAULT_STREAM = Stream._from_handle(0)
LEGACY_DEFAULT_STREAM = Stream._from_handle(_LEGACY)
PER_THREAD_DEFAULT_STREAM = Stream._from_handle(_PER_THREAD)
