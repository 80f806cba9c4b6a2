# SPDX-License-Identifier: Apache-2.0
"""The native PyTorch backend's packaging and installation, without a GPU.

Always: the package ships the backend's source and rmmc's headers (what
rmmc.torch.use() compiles), the launcher answers --help, a bad backend
name is refused before torch is touched. With a CUDA build of torch
importable (a GPU is not needed): the backend compiles through
torch.utils.cpp_extension, installs, and PyTorch names it "rmmc"; a build
that cannot compile falls back to the plug-in with exactly one warning; a
second use() in the process is harmless. The behaviour on a GPU is
tests/python/gpu/torch_native_suite.py (scripts/gpu-torch)."""
import json
import os
import subprocess
import sys

import pytest

import rmmc.torch as rt
from conftest import run_python


def _cuda_torch():
    try:
        import torch
    except ImportError:
        return False
    return torch.version.cuda is not None


needs_cuda_torch = pytest.mark.skipif(not _cuda_torch(),
                                      reason="no CUDA build of PyTorch installed")


def test_package_ships_the_backend_source_and_headers():
    here = os.path.dirname(os.path.abspath(rt.__file__))
    src = os.path.join(here, "_torch_native.cpp")
    assert os.path.exists(src)
    with open(src) as f:
        text = f.read()
    assert "class RmmcAllocator final : public CCA::CUDAAllocator" in text
    inc = rt._include_dir()
    for h in ("resource.h", "registry.h", "ipc.h", "spec.h", "defaults.h", "stream.h"):
        assert os.path.exists(os.path.join(inc, "rmmc", h)), h


def test_include_dir_honours_rmmc_include(tmp_path, monkeypatch):
    (tmp_path / "rmmc").mkdir()
    (tmp_path / "rmmc" / "resource.h").write_text("/* test */\n")
    monkeypatch.setenv("RMMC_INCLUDE", str(tmp_path))
    assert rt._include_dir() == str(tmp_path)


def launcher(*args):
    """`python -m rmmc.torch ARGS` in a subprocess with this sys.path."""
    return subprocess.run([sys.executable, "-m", "rmmc.torch"] + list(args), capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))


def test_launcher_help():
    p = launcher("--help")
    assert p.returncode == 0, p.stderr
    assert "--spec" in p.stdout and "--backend" in p.stdout


def test_launcher_needs_a_script():
    p = launcher("--spec", "pool > cuda")
    assert p.returncode == 2
    assert "a script or -m MODULE is needed" in p.stderr


def test_launcher_splits_its_options_from_the_scripts():
    # Everything after the script, or after -m MODULE, is the script's or
    # module's, options included, as with `python -m`.
    split = rt._launcher_args
    assert split(["--spec", "pool > cuda", "-m", "pytest", "-q", "-k", "test_x",
                  "test_cuda.py"]) == (["--spec", "pool > cuda"], "pytest", None,
                                        ["-q", "-k", "test_x", "test_cuda.py"])
    assert split(["-mpytest", "--spec", "x"]) == ([], "pytest", None, ["--spec", "x"])
    assert split(["--backend", "native", "train.py", "--spec", "y", "-m", "z"]) == (
        ["--backend", "native"], None, "train.py", ["--spec", "y", "-m", "z"])
    assert split(["--spec=pool > cuda", "--", "-odd.py", "1"]) == (
        ["--spec=pool > cuda"], None, "-odd.py", ["1"])
    assert split(["-q", "train.py"]) == (["-q"], None, "train.py", [])  # argparse refuses -q
    assert split([]) == ([], None, None, [])


def test_launcher_passes_module_arguments_untouched(tmp_path, monkeypatch):
    # The whole launcher with the install step replaced (no torch needed):
    # the module sees exactly the words after it, as `python -m` gives them.
    (tmp_path / "echo_argv_mod.py").write_text(
        "import json, os, sys\n"
        "with open(os.environ['ECHO_ARGV_OUT'], 'w') as f:\n"
        "    json.dump({'argv': sys.argv[1:], 'name': __name__}, f)\n")
    out = tmp_path / "argv.json"
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ECHO_ARGV_OUT", str(out))
    for k in ("RMMC_ALLOC_CONF", "RMMC_TORCH_BACKEND", "RMMC_TORCH_AUTOLOAD"):
        monkeypatch.setenv(k, "")  # so that the undo removes what _main sets
        monkeypatch.delenv(k)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    installed = []
    rt._main(["--spec", "pool > cuda", "--backend", "native", "-m", "echo_argv_mod", "-q", "-k",
              "test_x", "--spec", "other", "test_cuda.py"], install=installed.append)
    got = json.loads(out.read_text())
    assert got == {"argv": ["-q", "-k", "test_x", "--spec", "other", "test_cuda.py"],
                   "name": "__main__"}
    assert installed == ["pool > cuda"]
    assert os.environ["RMMC_ALLOC_CONF"] == "pool > cuda"
    assert os.environ["RMMC_TORCH_BACKEND"] == "native"
    assert os.environ["RMMC_TORCH_AUTOLOAD"] == "1"
    # A script: the same, and it runs as __main__ with its folder on sys.path.
    script = tmp_path / "train.py"
    script.write_text("import echo_argv_mod\n")
    rt._main([str(script), "-x", "--backend", "plugin"], install=installed.append)
    assert json.loads(out.read_text())["argv"] == ["-x", "--backend", "plugin"]
    assert installed == ["pool > cuda", None]


def test_launcher_refuses_an_unknown_option_of_its_own():
    p = launcher("-q", "train.py")
    assert p.returncode == 2
    assert "unrecognized arguments: -q" in p.stderr


def test_cxx_standard_per_torch_release():
    assert [rt.native_cxx_std(v) for v in ("2.9.0", "2.13.0", "2.14.1", "2.15.0+cu132")] == [
        "c++17", "c++17", "c++20", "c++20"]
    assert rt.TESTED_TORCH == ((2, 9), (2, 15))
    with pytest.raises(ValueError):
        rt.native_cxx_std("nightly")


def test_native_failure_is_one_line_naming_torch_and_the_step():
    log = ("Error building extension 'rmmc_torch_native_2_16_0':\n[1/2] c++ ...\n"
           "/x/_torch_native.cpp:2315:32: error: invalid new-expression of abstract class type "
           "'rmmc_torch::RmmcAllocator'\n  2315 | RmmcAllocator& instance = *new RmmcAllocator;\n")
    line = rt._native_failure("compile", log, "2.16.0+cu132")
    assert "\n" not in line
    assert line.startswith("rmmc.torch: the native backend failed to compile against torch "
                           "2.16.0+cu132 (newer than 2.15, the newest release rmmc is tested "
                           "with): /x/_torch_native.cpp:2315:32: error: invalid new-expression")
    assert "(older than 2.9" in rt._native_failure("load", "OSError: x.so: undefined symbol",
                                                     "2.8.0")
    ok = rt._native_failure("install", "PyTorch has initialized its CUDA allocator already",
                            "2.11.0")
    assert ok == ("rmmc.torch: the native backend failed to install against torch 2.11.0: "
                  "PyTorch has initialized its CUDA allocator already")


def test_bad_backend_is_refused_before_torch():
    with pytest.raises(ValueError, match="backend must be 'native', 'plugin' or 'auto'"):
        rt.use("pool > cuda", backend="cudaMallocAsync")


def test_autoload_does_nothing_unless_asked(monkeypatch):
    monkeypatch.delenv("RMMC_TORCH_AUTOLOAD", raising=False)
    assert rt._autoload() is None
    assert rt.backend() is None


@needs_cuda_torch
def test_builds_installs_and_is_named_rmmc(tmp_path):
    r = run_python(r'''
import torch, rmmc.torch as t
b = t.use("pool > cuda", backend="native")
assert t.backend() == "native", t.backend()
assert b.torch_version == torch.__version__.split("+")[0], (b.torch_version, torch.__version__)
print("NAME", torch._C._cuda_getAllocatorBackend())
again = t.use("pool > cuda", backend="native")   # a second install is a no-op
assert again is b
''', env={"RMMC_TORCH_BUILD_DIR": str(tmp_path), "CUDA_HOME": os.environ.get(
        "CUDA_HOME", "/usr/local/cuda")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "NAME rmmc" in r.stdout


@needs_cuda_torch
def test_private_pool_entry_points_without_a_gpu(tmp_path):
    # The real backend's sleep-mode and IPC entry points, where no GPU is
    # needed: pool_spec sets the thread's spec (and a bad one is refused
    # before it), an unknown pool is a ValueError rather than a crash (the
    # backend sees no device here), a pointer it never handed out has no
    # stack (share_tensor then exports from the registry's).
    r = run_python(r'''
import torch, rmmc, rmmc.torch as t
b = t.use("pool > cuda", backend="native")
with t.pool_spec("pool(expandable=true) > cuda") as s:
    with t.pool_spec("pool > cuda(ipc=true)"):
        pass
    print("SPEC", s)
try:
    with t.pool_spec("pool(expandable=maybe) > cuda"):
        pass
except rmmc.ParseError:
    print("PARSE ERROR")
for call in (lambda: t.pause(pool=(7, 0), device=0, stream=0),
             lambda: t.resume(pool=(7, 0), device=0, stream=0),
             lambda: t.sleep_state(pool=(7, 0), device=0)):
    try:
        call()
    except ValueError as e:
        print("UNKNOWN", "no private pool" in str(e))
print("BLOCK", b.block_resource(0x1000))
''', env={"RMMC_TORCH_BUILD_DIR": str(tmp_path), "CUDA_HOME": os.environ.get(
        "CUDA_HOME", "/usr/local/cuda")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SPEC pool(expandable=true) > cuda" in r.stdout and "PARSE ERROR" in r.stdout
    assert r.stdout.count("UNKNOWN True") == 3, r.stdout
    assert "BLOCK None" in r.stdout


@needs_cuda_torch
def test_falls_back_to_the_plugin_with_one_warning(tmp_path):
    r = run_python(r'''
import warnings, torch, rmmc.torch as t
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    a = t.use("pool > cuda")
mine = [x for x in w if "rmmc.torch" in str(x.message)]
assert len(mine) == 1, [str(x.message) for x in w]
assert "torch.OutOfMemoryError" in str(mine[0].message)
assert "torch.cuda.MemPool" in str(mine[0].message)
assert t.backend() == "plugin"
assert type(a).__name__ == "CUDAPluggableAllocator"
print("FELL BACK")
''', env={"RMMC_TORCH_BUILD_DIR": str(tmp_path), "CXX": "/bin/false"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FELL BACK" in r.stdout


@needs_cuda_torch
def test_native_only_raises_when_it_cannot_build(tmp_path):
    r = run_python(r'''
import torch, rmmc.torch as t
try:
    t.use("pool > cuda", backend="native")
except Exception as e:
    print("RAISED", type(e).__name__)
''', env={"RMMC_TORCH_BUILD_DIR": str(tmp_path), "CXX": "/bin/false"})
    assert "RAISED" in r.stdout, r.stdout + r.stderr


@needs_cuda_torch
def test_launcher_installs_rmmc_and_runs_the_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import sys, torch, rmmc.torch as t\n"
                      "print('SCRIPT', __name__, sys.argv[1:], "
                      "torch._C._cuda_getAllocatorBackend(), t.backend())\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
               RMMC_TORCH_BUILD_DIR=str(tmp_path / "ext"))
    env.setdefault("CUDA_HOME", "/usr/local/cuda")
    p = subprocess.run([sys.executable, "-m", "rmmc.torch", "--spec", "pool > cuda",
                        str(script), "a", "b"], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SCRIPT __main__ ['a', 'b'] rmmc native" in p.stdout, p.stdout


def _autoload_registered():
    try:
        from importlib.metadata import entry_points
        return any(e.value == "rmmc.torch:_autoload"
                   for e in entry_points(group="torch.backends"))
    except Exception:  # noqa: BLE001 (Python without group selection)
        return False


@needs_cuda_torch
@pytest.mark.skipif(not _autoload_registered(),
                    reason="rmmc is not installed (its torch.backends entry point is not)")
def test_autoload_at_import_torch(tmp_path):
    r = run_python("import torch, rmmc.torch as t\n"
                   "print('AUTO', torch._C._cuda_getAllocatorBackend(), t.backend())\n",
                   env={"RMMC_TORCH_AUTOLOAD": "1", "RMMC_ALLOC_CONF": "pool > cuda",
                        "RMMC_TORCH_BUILD_DIR": str(tmp_path),
                        "CUDA_HOME": os.environ.get("CUDA_HOME", "/usr/local/cuda")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "AUTO rmmc native" in r.stdout, r.stdout + r.stderr


def test_device_hooks_ride_on_the_native_backend(monkeypatch):
    """rmmc.set_memory_hooks(device=) goes to the backend's
    rmmc_torch_native_set_memory_hooks while the native backend is
    installed (it keeps the default stack's hook slot for snapshots and
    NCCL registration), and to the registry stack's hooks otherwise; a
    refusal raises rmmc's error as before."""
    import ctypes
    import rmmc
    seen = []

    class FakeDll:
        status = 0

        def rmmc_torch_native_set_memory_hooks(self, dev, hooks):
            seen.append((dev, None) if hooks is None else
                        (dev, hooks.size, bool(hooks.on_acquire), bool(hooks.on_release)))
            return self.status

    class FakeNative:
        _dll = FakeDll()

    monkeypatch.setattr(rt, "_backend", "native")
    monkeypatch.setattr(rt, "_native_lib", FakeNative())
    rmmc.set_memory_hooks(lambda p, n: None, None, device=0)
    assert seen == [(0, ctypes.sizeof(rmmc.MemoryHooks), True, False)]
    rmmc.set_memory_hooks(device=0)  # off: NULL, which removes the user's hooks
    assert seen[-1] == (0, None)
    FakeDll.status = -1  # RMMC_ERROR_INVALID_ARGUMENT
    with pytest.raises(rmmc.InvalidArgumentError):
        rmmc.set_memory_hooks(None, lambda p, n: None, device=1)
    assert seen[-1] == (1, ctypes.sizeof(rmmc.MemoryHooks), False, True)

    # The plug-in (or no backend): the registry's stack itself.
    monkeypatch.setattr(rt, "_backend", "plugin")
    got = []
    with rmmc.Resource("pool(expandable=false) > host") as r:
        rmmc.set_default(r, device=0)
        rmmc.set_memory_hooks(lambda p, n: got.append(n), None, device=0)
        p = r.allocate(40 << 20)
        assert sum(got) == r.figures()["reserved"] >= 40 << 20
        r.deallocate(p, 40 << 20)
        rmmc.set_memory_hooks(device=0)
    assert len(seen) == 3
