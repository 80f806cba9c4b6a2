# SPDX-License-Identifier: Apache-2.0
"""Sizes as Dask and RMM read them (rmmc/_sizes.py): rmmc's copy of
dask.utils.parse_bytes against Dask's own on a table of inputs (values and
refusals alike), dask-cuda's device_bytes rules, and RMM's parse_bytes on
the table of its Cython source (RMM keeps it in a cdef function that Python
cannot call)."""
import pytest

from rmmc._sizes import dask_parse_bytes, device_bytes, rmm_parse_bytes

INPUTS = ["5000M", "5000 M", "1GB", "1gb", "1GiB", "1 GiB", "1.5GiB", "2.5 kB", "1k", "12Mi",
          "MB", "kiB", "100", "100B", "0", "0 MiB", "1e3", "1e3 kB", " 3 TB ", "1PiB", "1Pi",
          "5 MB", "10 gi", 123, 4.5, 0, "80%", "1zz", "", "GB5", "1..5GB", "-1GB", "five"]


def test_dask_parse_bytes_is_dasks():
    dask_utils = pytest.importorskip("dask.utils")
    for s in INPUTS:
        try:
            want = dask_utils.parse_bytes(s)
        except Exception as e:
            with pytest.raises(type(e)) as got:
                dask_parse_bytes(s)
            assert str(got.value) == str(e), s
        else:
            assert dask_parse_bytes(s) == want, s
    assert dask_parse_bytes("5000M") == 5 * 10 ** 9


def test_device_bytes_is_dask_cudas_parse_device_bytes():
    total = 32 * 10 ** 9
    asked = []

    def tot():
        asked.append(1)
        return total

    assert device_bytes(None, tot) is None and device_bytes(0, tot) is None
    assert device_bytes(0.0, tot) is None and device_bytes("0 MiB", tot) is None
    assert asked == []  # the device is asked only for a fraction
    assert device_bytes(1.0, tot, 256) == total // 256 * 256
    assert device_bytes(0.8, tot, 256) == int(total * 0.8) // 256 * 256
    assert device_bytes("0.5", tot) == total // 2
    assert device_bytes(1, tot) == 1 and device_bytes("1", tot) == 1  # ints are bytes
    assert device_bytes(1000000000, tot) == 10 ** 9
    assert device_bytes("1GB", tot, 256) == 10 ** 9 // 256 * 256
    assert device_bytes(1.5, tot) == 1  # not a fraction: int(1.5) bytes, as dask-cuda
    with pytest.raises(ValueError):
        device_bytes("80%", tot)


def test_rmm_parse_bytes_is_rmms_rule():
    assert rmm_parse_bytes(123) == 123
    assert rmm_parse_bytes("1GB") == 10 ** 9 and rmm_parse_bytes("1GiB") == 2 ** 30
    assert rmm_parse_bytes("1.5 gib") == 3 * 2 ** 29 and rmm_parse_bytes("10") == 10
    assert rmm_parse_bytes("2\tKB") == 2000 and rmm_parse_bytes("3b") == 3
    for bad in ("1G", "5000M", "1 GiBs", "-1GB", "GB", "", "1e3"):
        with pytest.raises(ValueError, match="Could not parse"):
            rmm_parse_bytes(bad)
    with pytest.raises(TypeError):
        rmm_parse_bytes(1.5)
