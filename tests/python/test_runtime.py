# SPDX-License-Identifier: Apache-2.0
"""How rmmc finds the CUDA runtime when librmmc's RUNPATH misses it
(rmmc._runtime): NVIDIA's runtime wheel on sys.path is loaded first and the
load retried; with no runtime anywhere the error says what to install.
ctypes.CDLL is replaced by a recorder, so no library is loaded."""
import os
import sys

import pytest

from rmmc import _runtime

MISSING = "libcudart.so.13: cannot open shared object file: No such file or directory"


def test_find_cudart_looks_in_the_runtime_wheel_on_sys_path(tmp_path, monkeypatch):
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "elsewhere"), str(tmp_path)])
    assert _runtime.find_cudart() is None
    (lib / "libcudart.so.13").write_bytes(b"")
    assert _runtime.find_cudart() == os.path.join(str(lib), "libcudart.so.13")
    assert _runtime.find_cudart("libcudart.so.12") is None  # the cu12 folder is another


def test_load_preloads_the_wheels_runtime_and_retries(tmp_path, monkeypatch):
    calls = []

    def fake_cdll(path, mode=None):
        calls.append((path, mode))
        if path.endswith("librmmc.so") and len(calls) == 1:
            raise OSError(MISSING)
        return "handle of %s" % os.path.basename(path)
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.13").write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.setattr(_runtime.ctypes, "CDLL", fake_cdll)
    assert _runtime.load("/x/librmmc.so") == "handle of librmmc.so"
    assert calls == [("/x/librmmc.so", None),
                     (os.path.join(str(lib), "libcudart.so.13"), _runtime.ctypes.RTLD_GLOBAL),
                     ("/x/librmmc.so", None)]


def test_load_without_any_runtime_says_what_to_install(tmp_path, monkeypatch):
    def fake_cdll(path, mode=None):
        raise OSError(MISSING)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.setattr(_runtime.ctypes, "CDLL", fake_cdll)
    with pytest.raises(OSError) as e:
        _runtime.load("/x/librmmc.so")
    assert str(e.value) == ("/x/librmmc.so needs the CUDA runtime libcudart.so.13, which is "
                            "neither installed nor in NVIDIA's runtime wheel: pip install "
                            "nvidia-cuda-runtime (rmmc's wheel depends on it), or install the "
                            "CUDA toolkit")


def test_other_load_errors_pass_through(monkeypatch):
    def fake_cdll(path, mode=None):
        raise OSError("librmmc.so: invalid ELF header")
    monkeypatch.setattr(_runtime.ctypes, "CDLL", fake_cdll)
    with pytest.raises(OSError, match="invalid ELF header"):
        _runtime.load("/x/librmmc.so")


def test_console_scripts_run_the_shipped_tools_or_say_where_they_are(tmp_path, monkeypatch,
                                                                      capsys):
    from rmmc import _tools
    monkeypatch.setattr(_tools, "_BIN", str(tmp_path))
    assert _tools.tool_path("rmmc-bench") is None
    assert _tools.bench() == 127
    assert "this rmmc package has no rmmc-bench (the binary wheel ships it" in capsys.readouterr().err
    # A shipped tool is exec'd with the script's arguments.
    tool = tmp_path / "rmmc-replay"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    seen = []
    monkeypatch.setattr(_tools.os, "execv", lambda path, argv: seen.append((path, argv)))
    monkeypatch.setattr(_tools.sys, "argv", ["rmmc-replay", "--stack", "host", "log.csv"])
    _tools.replay()
    assert seen == [(str(tool), ["rmmc-replay", "--stack", "host", "log.csv"])]
