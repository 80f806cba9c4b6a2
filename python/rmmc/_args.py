# SPDX-License-Identifier: Apache-2.0
"""Checking arguments before they reach a C signature.

ctypes converts a Python int to size_t, int or a pointer by keeping the low
bits: allocate(2**64 + 4096) asked for 4096 bytes and allocate(2**70) for
0, and a str with a NUL reached C cut short. Every value
the package hands to librmmc goes through one of these first. They raise
what Python's own functions raise for such values: TypeError for the wrong
type (bool and float included: a size is a whole number), ValueError for a
negative size or a NUL in a string (rmmc's InvalidArgumentError, a
ValueError), OverflowError for a number too large for the C type.
"""
import ctypes
import operator

from ._lib import InvalidArgumentError

SIZE_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1
POINTER_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_void_p))) - 1
INT_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_int) - 1)) - 1
MAX_DEVICES = 64  # RMMC_REGISTRY_MAX_DEVICES (include/rmmc/registry.h)


def _invalid(message):
    return InvalidArgumentError(-1, message)


def integer(value, what):
    """`value` as an int (anything with __index__, numpy's integers too;
    not bool or float)."""
    if isinstance(value, bool):
        raise TypeError("%s must be an int, not bool" % what)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError("%s must be an int, not %s" % (what, type(value).__name__)) from None


def size(value, what="size"):
    """A size_t: an int from 0 to SIZE_MAX."""
    v = integer(value, what)
    if v < 0:
        raise _invalid("%s must be >= 0, not %d" % (what, v))
    if v > SIZE_MAX:
        raise OverflowError("%s %d is larger than a size_t holds (%d)" % (what, v, SIZE_MAX))
    return v


def pointer(value, what="pointer"):
    """An address (int, or None for NULL): None, or an int from 0 to the
    largest address; 0 becomes None."""
    if value is None:
        return None
    v = integer(value, what)
    if v < 0:
        raise _invalid("%s must be an address >= 0, not %d" % (what, v))
    if v > POINTER_MAX:
        raise OverflowError("%s 0x%x is larger than an address (0x%x)" % (what, v, POINTER_MAX))
    return v or None


def _stream_handle(value, what, source):
    """The address a stream object's attribute gave: an int, a ctypes
    pointer (Numba's .handle; NULL is the default stream) or an object
    int() reads and that is no number (CUDA Python's CUstream); never
    None, a bool, a float or a str."""
    if isinstance(value, ctypes.c_void_p):
        return value.value  # None: the default stream
    if (not isinstance(value, (int, float, str, bytes)) and not hasattr(value, "__index__")
            and hasattr(value, "__int__") and not hasattr(value, "__float__")):
        value = int(value)  # CUDA Python's CUstream; never a Fraction or Decimal (they round)
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError("%s: %s must be a stream address (int), not %s"
                        % (what, source, type(value).__name__))
    return pointer(value, "%s (%s)" % (what, source))


def stream(value, what="stream"):
    """A cudaStream_t: None or 0 (the legacy default stream), an int
    handle, or a stream object of a framework: the CUDA stream protocol
    (``__cuda_stream__``, a method or attribute giving (0, address)),
    PyTorch's ``.cuda_stream``, CuPy's ``.ptr``, Numba's and CUDA Python's
    ``.handle``. TypeError for anything else (bool, float, str, ...),
    ValueError for a negative address or a protocol version other than 0,
    OverflowError past the largest address."""
    if value is None or isinstance(value, bool):
        return pointer(value, what)
    if getattr(type(value), "_not_a_stream", False):
        raise TypeError("%s must be a CUDA stream, not an %s" % (what, type(value).__name__))
    if isinstance(value, int) or hasattr(value, "__index__"):
        return pointer(value, what)
    proto = getattr(value, "__cuda_stream__", None)
    if proto is not None:
        got = proto() if callable(proto) else proto
        if not isinstance(got, tuple) or len(got) != 2:
            raise TypeError("%s: __cuda_stream__ must give (version, address), not %r"
                            % (what, got))
        version = integer(got[0], "%s: __cuda_stream__ version" % what)
        if version != 0:
            raise _invalid("%s: __cuda_stream__ version %d is not supported (0 is)"
                           % (what, version))
        return _stream_handle(got[1], what, "__cuda_stream__")
    for attr in ("cuda_stream", "ptr", "handle"):
        if hasattr(value, attr):
            return _stream_handle(getattr(value, attr), what, "." + attr)
    raise TypeError("%s must be a CUDA stream (an int address, None, or an object with "
                    "__cuda_stream__, .cuda_stream, .ptr or .handle), not %s"
                    % (what, type(value).__name__))


def alignment(value, what="alignment"):
    """An alignment: a power of two that fits a size_t."""
    v = size(value, what)
    if v == 0 or v & (v - 1):
        raise _invalid("%s must be a power of two, not %d" % (what, v))
    return v


def uint64(value, what):
    """A uint64_t: an int from 0 to 2**64 - 1."""
    v = integer(value, what)
    if v < 0:
        raise _invalid("%s must be >= 0, not %d" % (what, v))
    if v >= 1 << 64:
        raise OverflowError("%s %d is larger than a uint64_t holds" % (what, v))
    return v


def c_int(value, what, lowest=0):
    """A C int from `lowest` to INT_MAX."""
    v = integer(value, what)
    if v < lowest:
        raise _invalid("%s must be >= %d, not %d" % (what, lowest, v))
    if v > INT_MAX:
        raise OverflowError("%s %d is larger than a C int holds (%d)" % (what, v, INT_MAX))
    return v


def device(value, what="device", allow_all=False):
    """A device number (>= 0; -1 too where it means every device)."""
    return c_int(value, what, -1 if allow_all else 0)


def devices(value, what="devices"):
    """A non-empty list of device numbers from a device number or an
    iterable of them, each within the registry's range."""
    if isinstance(value, (str, bytes)):
        raise TypeError("%s is a device number or a list of them, not %s"
                        % (what, type(value).__name__))
    if isinstance(value, bool) or hasattr(value, "__index__"):
        value = [value]
    try:
        items = list(value)
    except TypeError:
        raise TypeError("%s is a device number or a list of them, not %s"
                        % (what, type(value).__name__)) from None
    if not items:
        raise _invalid("%s is empty" % what)
    out = []
    for d in items:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise TypeError("%s holds device numbers (int), not %s" % (what, type(d).__name__))
        d = operator.index(d)
        if not 0 <= d < MAX_DEVICES:
            raise _invalid("%s holds device numbers in [0, %d), not %d" % (what, MAX_DEVICES, d))
        out.append(d)
    return out


def fd(value, what="file descriptor"):
    """A file descriptor: an int >= 0, or an object with fileno()."""
    if not isinstance(value, int) and hasattr(value, "fileno"):
        value = value.fileno()
    return c_int(value, what)


def text(value, what="spec"):
    """A str for a `const char *`: UTF-8, without NUL (C would stop there)."""
    if not isinstance(value, str):
        raise TypeError("%s must be a str, not %s" % (what, type(value).__name__))
    if "\0" in value:
        raise _invalid("%s contains a NUL character at index %d: C would read only %r"
                         % (what, value.index("\0"), value[:value.index("\0")]))
    return value.encode()
