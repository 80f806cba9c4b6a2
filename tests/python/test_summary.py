# SPDX-License-Identifier: Apache-2.0
"""The short reports on host stacks: memory_summary()'s table (a row per
layer with current, peak, reserved, allocated, freed and the counts, "-"
where a layer keeps no such figure), memory_summary_line(), and `python -m
rmmc` (version, library, devices, the process default; exit 1 when
RMMC_ALLOC_CONF does not parse)."""
import re
import sys

import pytest

import rmmc
from rmmc._lib import lib
from conftest import run_python


@pytest.fixture(autouse=True)
def clean():
    lib().rmmc_registry_clear()
    yield
    lib().rmmc_registry_clear()


def test_memory_summary_table_per_layer():
    rmmc.set_default("statistics > pool(initial=1MiB) > host", device=0)
    with rmmc.get_default(0) as r:
        p = r.allocate(4096)
        q = r.allocate(1000)
        r.deallocate(q, 1000)
        text = rmmc.memory_summary(0)
        rows = {line.split()[0]: line.split() for line in text.splitlines()[4:] if line.strip()}
        # layer, current, peak, reserved, allocated, freed, allocs, frees (sizes are "4.00 KiB")
        assert " ".join(rows["statistics"]) == \
            "statistics 4.00 KiB 4.98 KiB - 4.98 KiB 1000 B 2 1", text
        # The pool's own "peak" counts spans lent to stream heaps (4 MiB
        # here): not a peak of live bytes, so the table leaves it out.
        assert rows["pool"][1:3] == ["4.00", "KiB"] and rows["pool"][3] == "-", text
        assert rows["pool"][4:6] == ["4.00", "MiB"], text
        assert rows["host"][1:] == ["-"] * 7, text
        line = rmmc.memory_summary_line(0)
        # With a GPU the line also says how full device 0 is.
        gpu = r"; device memory [0-9.]+% used \([^)]*\)" if rmmc.device_count() > 0 else ""
        assert re.fullmatch(r"device 0: 4\.00 KiB in use, 4\.98 KiB peak, 4\.00 MiB reserved"
                            + gpu + r" \[statistics > pool > host\]", line), line
        r.deallocate(p, 4096)
    assert rmmc.memory_summary_line(0).startswith("device 0: 0 B in use, 4.98 KiB peak")


def test_python_m_rmmc():
    r = run_python("import runpy, sys; sys.argv = ['rmmc']; runpy.run_module('rmmc', run_name='__main__')")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("rmmc %s (" % rmmc.version()) and "librmmc.so" in lines[0]
    assert lines[1] == "process default: cuda"
    if rmmc.device_count() == 0:
        assert lines[2].startswith("devices: none")
    else:
        assert lines[2] == "devices: %d" % rmmc.device_count()
        assert any(l.startswith("  stack 0: ") for l in lines), r.stdout
    bad = run_python("import runpy; runpy.run_module('rmmc', run_name='__main__')",
                     env={"RMMC_ALLOC_CONF": "pool > hots"})
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "RMMC_ALLOC_CONF='pool > hots'" in bad.stdout and "did you mean 'host'" in bad.stdout
