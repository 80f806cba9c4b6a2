# SPDX-License-Identifier: Apache-2.0
"""bench/workloads/torch_ipc.py's machinery without a GPU or PyTorch.

The first GPU run with the native backend hung: the torch.multiprocessing
case's spawned child ran PyTorch's own allocator, which cannot read an rmmc
handle, so it died in the unpickling, and the parent waited 300 s per case
on a queue nobody would fill (twice: more than the run's limit, and
nothing printed). These tests hold what prevents that: a child spawned
from the script installs the parent's backend when it imports the script
as __mp_main__; a wait on a child ends as soon as the child is gone; a hung
case is stopped at its deadline with every thread's Python stack and
kernel wait channel on stderr, its whole process tree killed."""
import importlib.util
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                      "workloads", "torch_ipc.py")


def _load():
    spec = importlib.util.spec_from_file_location("torch_ipc_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ti = _load()
fork = multiprocessing.get_context("fork")  # no CUDA here, and no pickling of the targets


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_native_backend_is_the_default_case():
    assert ti.BACKENDS[0] == "native"
    assert set(ti.BACKENDS) == {"native", "plugin"}


def test_a_spawned_child_installs_the_parents_backend(tmp_path):
    # What multiprocessing's spawn does with the main script: runs it as
    # __mp_main__. A stand-in rmmc.torch records the install.
    fake = tmp_path / "rmmc"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "torch.py").write_text(textwrap.dedent('''
        def use(spec, backend=None):
            print("USE", repr(spec), backend, flush=True)
    '''))
    code = ("import runpy, sys; runpy.run_path(%r, run_name='__mp_main__'); "
            "print('IMPORTED', flush=True)" % SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    env.update({ti.ENV_BACKEND: "native", ti.ENV_SPEC: "pool(expandable=false) > cuda",
                ti.ENV_DEADLINE: "60"})
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["USE 'pool(expandable=false) > cuda' native", "IMPORTED"]
    # Without the variables (the plug-in case's child, or any other import)
    # nothing is installed.
    for k in (ti.ENV_BACKEND, ti.ENV_SPEC, ti.ENV_DEADLINE):
        env.pop(k)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.splitlines() == ["IMPORTED"], r.stdout + r.stderr


def test_wait_for_ends_when_the_child_dies_without_answering():
    q = fork.Queue()
    p = fork.Process(target=os._exit, args=(3,))
    p.start()
    t0 = time.monotonic()
    with pytest.raises(ti.ChildDied, match="exited with 3"):
        ti.wait_for(q, p, 120, "the child")
    assert time.monotonic() - t0 < 15  # not the 120 s it was allowed
    p.join()


def _answer_and_exit(q):
    q.put(("sum", 42))


def test_wait_for_returns_an_answer_put_just_before_exit():
    q = fork.Queue()
    p = fork.Process(target=_answer_and_exit, args=(q,))
    p.start()
    p.join()
    assert ti.wait_for(q, p, 30, "the child") == ("sum", 42)


def test_wait_for_times_out_on_a_silent_live_child():
    q = fork.Queue()
    p = fork.Process(target=time.sleep, args=(60,))
    p.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="did not answer within 1 s"):
            ti.wait_for(q, p, 1, "the child")
        assert time.monotonic() - t0 < 10
    finally:
        p.kill()
        p.join()


def test_recv_exact():
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"Yx")
        assert ti.recv_exact(a, 2, 5) == b"Yx"
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="sent nothing for 1 s"):
            ti.recv_exact(a, 1, 1)
        assert time.monotonic() - t0 < 10
        b.close()
        assert ti.recv_exact(a, 1, 5) == b""  # the peer is gone


def test_the_watchdog_dumps_every_thread_and_exits():
    code = textwrap.dedent('''
        import importlib.util, threading, time
        spec = importlib.util.spec_from_file_location("t", %r)
        m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
        def stuck_in_share_tensor():
            time.sleep(60)
        threading.Thread(target=stuck_in_share_tensor, daemon=True).start()
        m.arm_watchdog(1)
        time.sleep(60)
    ''' % SCRIPT)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < 30
    assert r.returncode == 1, r.stderr
    assert "Timeout" in r.stderr and "stuck_in_share_tensor" in r.stderr, r.stderr


def test_a_hung_case_is_stopped_with_its_stacks_and_wait_channels():
    # A case process whose child hangs too: both dump their Python stacks
    # (SIGUSR1), the wait channels are read, and the whole tree is killed.
    # The parent starts waiting only once its child has armed its watchdog,
    # so a slow machine cannot make the test lose the child's stack.
    code = textwrap.dedent('''
        import importlib.util, subprocess, sys, time
        spec = importlib.util.spec_from_file_location("t", %r)
        m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
        m.arm_watchdog(120)
        child = subprocess.Popen([sys.executable, "-c",
            "import importlib.util, time\\n"
            "spec = importlib.util.spec_from_file_location('t', %r)\\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\\n"
            "m.arm_watchdog(120)\\n"
            "print('ARMED', flush=True)\\n"
            "def child_waits_forever(): time.sleep(120)\\n"
            "child_waits_forever()\\n"], stdout=subprocess.PIPE, text=True)
        child.stdout.readline()
        print("CHILD", child.pid, flush=True)
        def parent_waits_forever():
            time.sleep(120)
        parent_waits_forever()
    ''' % (SCRIPT, SCRIPT))
    t0 = time.monotonic()
    rc, out, err, waits = ti.run_watched([sys.executable, "-c", code], 10)
    assert time.monotonic() - t0 < 40
    assert rc is None
    assert "CHILD" in out, (out, err)
    child = int(out.split("CHILD", 1)[1].split()[0])
    assert "parent_waits_forever" in err and "child_waits_forever" in err, err
    assert any("wchan=" in w for w in waits) and any(str(child) in w for w in waits), waits
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the hung case's child outlived it"


def test_run_case_reports_a_timeout(monkeypatch, tmp_path):
    # run_case with the case process replaced by one that hangs.
    fake = tmp_path / "hang.py"
    fake.write_text("import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    monkeypatch.setattr(ti, "SELF", str(fake))
    out = ti.run_case("rmmc.ipc", "native", "pool > cuda", timeout=2)
    assert out["works"] is False and "timed out after 2 s" in out["error"]
    assert any("wchan=" in w for w in out["wait_channels"])
    json.dumps(out)  # goes into the JSON as it is


@pytest.mark.parametrize("backend,what,kind,out,want", [
    ("native", "multiprocessing", "chunks", {"works": True}, "PASS"),
    ("native", "multiprocessing", "chunks", {"works": False, "refused": True}, "FAIL"),
    ("plugin", "multiprocessing", "chunks", {"works": False, "refused": True}, "INFO"),
    ("plugin", "rmmc.ipc", "chunks", {"works": False, "error": "x"}, "FAIL"),
    ("native", "multiprocessing", "pages",
     {"works": False, "error": "rmmc: getIpcDevPtr: pidfd_getfd: Operation not permitted"},
     "SKIP"),
    ("native", "rmmc.ipc", "pages", {"works": False, "error": "Operation not permitted"},
     "FAIL"),
])
def test_verdicts(backend, what, kind, out, want):
    assert ti.verdict(backend, what, kind, out) == want
