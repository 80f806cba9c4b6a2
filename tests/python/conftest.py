# SPDX-License-Identifier: Apache-2.0
"""pytest set-up for the Python package's tests.

They test whichever `rmmc` Python imports: the installed package (CI
installs it with `pip install .` into a fresh venv), or the source tree's
python/ with RMMC_LIB naming a build's librmmc.so (the meson test
`python_package` runs them that way). Each test that depends on the
environment (RMMC_ALLOC_CONF, a fresh PyTorch) runs in a subprocess.
"""
import os
import subprocess
import sys

import pytest


def run_python(code, env=None, timeout=600):
    """Runs `code` in a fresh interpreter with this one's sys.path;
    returns the CompletedProcess (text)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    for k, v in (env or {}).items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=e, timeout=timeout)


@pytest.fixture
def python():
    return run_python


def skip_unless(ok, reason):
    """Skips the calling test module when `ok` is false, unless
    RMMC_REQUIRE_GPU=1 (scripts/gpu-python), where a missing GPU or
    framework is a failure: the GPU machine must run these tests."""
    if ok:
        return
    if os.environ.get("RMMC_REQUIRE_GPU") == "1":
        pytest.fail("RMMC_REQUIRE_GPU=1 but " + reason, pytrace=False)
    pytest.skip(reason, allow_module_level=True)


@pytest.fixture
def clean_registry():
    """An empty registry (no GPU: no default) and no rmmc.mr objects set,
    before and after the test."""
    import rmmc.mr as mr
    from rmmc._lib import lib
    lib().rmmc_registry_clear()
    mr._SET.clear()
    yield
    lib().rmmc_registry_clear()
    mr._SET.clear()
