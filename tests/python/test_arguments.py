# SPDX-License-Identifier: Apache-2.0
"""Hostile arguments to every entry of the Python package (issue 25, F11):
ctypes keeps the low bits of an int and C stops a string at its first NUL,
so allocate(2**64 + 4096) used to hand out 4096 bytes, allocate(2**70) 0,
and Resource("host\\x00 > pool(inital=1)") built `host`. Each must raise
what an experienced Python user expects (TypeError, ValueError,
OverflowError), before any C call, and leave nothing behind."""
import pytest

import rmmc
import rmmc.ipc

SPEC = "statistics > pool > host"
BIG = [2 ** 64, 2 ** 64 + 4096, 2 ** 70, 2 ** 200]
NEGATIVE = [-1, -4096, -(2 ** 64) + 4096]
NOT_INTS = [1.0, 4096.0, "4096", b"4096", None, [4096], True]


@pytest.fixture
def r():
    with rmmc.Resource(SPEC) as res:
        yield res
        assert res.figures()["in_use"] == 0


@pytest.mark.parametrize("n", BIG)
def test_allocate_size_too_large(r, n):
    with pytest.raises(OverflowError):
        r.allocate(n)


@pytest.mark.parametrize("n", NEGATIVE)
def test_allocate_negative_size(r, n):
    with pytest.raises(ValueError):
        r.allocate(n)


@pytest.mark.parametrize("n", NOT_INTS)
def test_allocate_size_not_an_int(r, n):
    with pytest.raises(TypeError):
        r.allocate(n)


def test_allocate_takes_index_types(r):
    class Index:
        def __index__(self):
            return 4096
    p = r.allocate(Index())
    assert p and r.figures()["in_use"] == 4096
    r.deallocate(p, 4096)


def test_largest_size_reaches_c(r):
    """SIZE_MAX itself is a size: C refuses it with its own error."""
    with pytest.raises(rmmc.RmmcError):
        r.allocate(2 ** 64 - 1)


@pytest.mark.parametrize("stream", [-1, 2 ** 64, 2 ** 64 + 1, 1.5, "0"])
def test_allocate_bad_stream(r, stream):
    with pytest.raises((TypeError, ValueError, OverflowError)):
        r.allocate(4096, stream=stream)


@pytest.mark.parametrize("alignment,exc", [(2 ** 64 + 256, OverflowError), (-256, ValueError),
                                           (256.0, TypeError), (3, ValueError), (0, ValueError)])
def test_allocate_bad_alignment(r, alignment, exc):
    with pytest.raises(exc):
        r.allocate(4096, alignment=alignment)


def test_deallocate_checks_every_argument(r):
    p = r.allocate(4096)
    for kwargs, exc in [({"ptr": p + 2 ** 64}, OverflowError), ({"ptr": -p}, ValueError),
                        ({"ptr": float(p)}, TypeError), ({"nbytes": 4096 + 2 ** 64}, OverflowError),
                        ({"nbytes": -4096}, ValueError), ({"stream": 2 ** 64}, OverflowError),
                        ({"alignment": 2 ** 64 + 256}, OverflowError)]:
        args = {"ptr": p, "nbytes": 4096}
        args.update(kwargs)
        with pytest.raises(exc):
            r.deallocate(**args)
        assert r.figures()["in_use"] == 4096, kwargs  # nothing was freed
    r.deallocate(p, 4096)


@pytest.mark.parametrize("spec", ["host\x00 > pool(inital=1)", "\x00", "pool > host\x00"])
def test_specs_with_nul(spec):
    with pytest.raises(ValueError, match="NUL"):
        rmmc.Resource(spec)
    with pytest.raises(ValueError, match="NUL"):
        rmmc.validate(spec)
    with pytest.raises(ValueError, match="NUL"):
        rmmc.set_default(spec)
    with pytest.raises(ValueError, match="NUL"):
        rmmc.device_spec(spec, 0)
    with pytest.raises(ValueError, match="NUL"):
        rmmc.parse_size("1\x00GiB")


@pytest.mark.parametrize("spec", [b"host", 1, None, ["host"]])
def test_specs_not_str(spec):
    with pytest.raises(TypeError):
        rmmc.Resource(spec)
    with pytest.raises(TypeError):
        rmmc.validate(spec)


@pytest.mark.parametrize("device,exc", [(2 ** 32, OverflowError), (2 ** 31, OverflowError),
                                        (-2, ValueError), (1.0, TypeError), ("0", TypeError),
                                        (True, TypeError)])
def test_devices(device, exc):
    with pytest.raises(exc):
        rmmc.Resource("host", device=device)
    with pytest.raises(exc):
        rmmc.memory_status(device)
    with pytest.raises(exc):
        rmmc.device_spec("host", device)
    with pytest.raises(exc):
        rmmc.get_default(device)
    with pytest.raises(exc):
        rmmc.plugin_stats(device)


def test_plugin_stats_all_devices():
    assert "allocations" in rmmc.plugin_stats(-1)


@pytest.mark.parametrize("ptr,exc", [(2 ** 64, OverflowError), (-1, ValueError),
                                     (1.0, TypeError)])
def test_ipc_pointers(ptr, exc):
    with pytest.raises(exc):
        rmmc.ipc.close(ptr)
    with pytest.raises(exc):
        rmmc.ipc.revoke(ptr)
    with rmmc.Resource("host") as res, pytest.raises(exc):
        rmmc.ipc.export(ptr, resource=res)


@pytest.mark.parametrize("fd,exc", [(2 ** 32, OverflowError), (-1, ValueError), (1.5, TypeError)])
def test_ipc_descriptors(fd, exc):
    with pytest.raises(exc):
        rmmc.ipc.import_handle(b"\x00" * 64, [fd])
    with pytest.raises(exc):
        rmmc.ipc.send(fd, b"\x00" * 64)


@pytest.mark.parametrize("handle", [2 ** 70, 5, None, "handle"])
def test_ipc_handles_not_bytes(handle):
    with pytest.raises(TypeError):
        rmmc.ipc.check_handle(handle)
    with pytest.raises(TypeError):
        rmmc.ipc.info(handle)


def test_ipc_handle_too_long():
    with pytest.raises(ValueError):
        rmmc.ipc.check_handle(b"\x01" * 5000)
