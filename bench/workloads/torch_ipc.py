#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch tensors allocated through rmmc, shared with another process
(issues 15 and 26), with each of rmmc's two PyTorch backends.

For the native backend (rmmc.torch.use's default) and the plug-in
(backend="plugin"), each case in a fresh interpreter (an allocator is
chosen before CUDA starts):

1. PyTorch's own path: torch.multiprocessing pickles a CUDA tensor with
   reduce_tensor -> Storage._share_cuda_() -> the allocator's
   shareIpcHandle; a spawned child rebuilds it through its allocator's
   getIpcDevPtr. With the native backend both processes run rmmc: the
   child installs it when it imports this file as __mp_main__. (A child on
   PyTorch's own allocator cannot read an rmmc handle: its getIpcDevPtr
   says "received sharable handle from a future version of torch" and the
   child dies; the first GPU run's parent then waited 300 s per case on a
   queue nobody would fill, its output still buffered: the "hang".) The
   child checks the values and adds 1 in place, the parent reads that back.
   Pages need pidfd_getfd on the parent's descriptors (ptrace permission):
   SKIP where the host refuses it. With the plug-in current PyTorch refuses
   (reported, not a failure).
2. rmmc's path, any PyTorch: rmmc.ipc.share_tensor() here, handle and
   descriptors over a UNIX socket, rmmc.ipc.tensor_from() in a child on the
   same backend; the child checks the values and doubles the tensor in
   place, this process reads the doubled values. For chunks
   (pool(expandable=false) > cuda) and pages (pool(expandable=true) >
   cuda(ipc=true)).

Nothing can hang: every wait on another process has a deadline and notices
the process dying; every process arms faulthandler (all threads' Python
stacks on stderr, then exit) before the driver's deadline; at the deadline
the driver prints each thread's kernel wait channel (/proc) of the case's
processes and kills their process group.

    python3 bench/workloads/torch_ipc.py [--json FILE] [--backends native,plugin] [--timeout S]

Prints one PASS/FAIL/SKIP/INFO line per case and a summary; the JSON has
the same with the PyTorch version. Exit 0 when every case that must work
worked, 1 otherwise, 77 without a GPU or PyTorch.
"""
import faulthandler
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import time
import traceback

SPECS = {"chunks": "pool(expandable=false) > cuda",
         "pages": "pool(expandable=true, page=2MiB) > cuda(ipc=true)"}
BACKENDS = ("native", "plugin")  # the native backend first: rmmc.torch.use's default
N = 3 << 20  # floats: 12 MiB
CASE_TIMEOUT = 150  # seconds for one case, its children included
SELF = os.path.abspath(__file__)
# Environment a torch.multiprocessing child reads at import (as __mp_main__).
ENV_BACKEND, ENV_SPEC, ENV_DEADLINE = ("RMMC_TORCH_IPC_BACKEND", "RMMC_TORCH_IPC_SPEC",
                                       "RMMC_TORCH_IPC_DEADLINE")


class ChildDied(RuntimeError):
    """The other process exited before it answered."""


def arm_watchdog(seconds):
    """faulthandler: a crash or SIGUSR1 (the driver's, at its deadline)
    dumps every thread's Python stack on stderr, and so does a timer after
    `seconds`, which then exits the process (status 1)."""
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    faulthandler.dump_traceback_later(max(1.0, seconds), exit=True)


def wait_for(q, proc, timeout, what):
    """The next item of queue `q`, which process `proc` (multiprocessing)
    puts. ChildDied as soon as proc has exited without putting one;
    TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return q.get(timeout=0.25)
        except queue.Empty:
            pass
        if not proc.is_alive():
            try:  # what it put just before it exited may still be in flight
                return q.get(timeout=1.0)
            except queue.Empty:
                raise ChildDied("%s exited with %s before answering" % (what, proc.exitcode))
        if time.monotonic() > deadline:
            raise TimeoutError("%s did not answer within %.0f s" % (what, timeout))


def recv_exact(sock, n, timeout, proc=None, what="the child"):
    """n bytes from `sock` within `timeout` s (select, so the socket stays
    blocking for rmmc.ipc's descriptors); b"" if the peer closed it
    first. TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    got = b""
    while len(got) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            state = "" if proc is None else " (it %s)" % (
                "is still running" if proc.poll() is None else "exited with %s" % proc.returncode)
            raise TimeoutError("%s sent nothing for %.0f s%s" % (what, timeout, state))
        r, _, _ = select.select([sock], [], [], min(left, 1.0))
        if r:
            b = sock.recv(n - len(got))
            if not b:
                return got
            got += b
    return got


def install(backend, spec):
    import rmmc.torch
    rmmc.torch.use(spec, backend=backend)


# A torch.multiprocessing child imports this file as __mp_main__: on the
# native backend it installs rmmc before it rebuilds the shared tensor.
if __name__ == "__mp_main__" and os.environ.get(ENV_BACKEND):
    arm_watchdog(float(os.environ.get(ENV_DEADLINE, "60")))
    install(os.environ[ENV_BACKEND], os.environ[ENV_SPEC])


def mp_child(q, r):
    """torch.multiprocessing's child: reads the tensor, adds 1 in place."""
    import torch
    t = q.get()
    total = float(t.double().sum().item())
    t.add_(1)
    torch.cuda.synchronize()
    r.put((total, torch.cuda.memory.get_allocator_backend()))
    q.get()  # holds the tensor until the parent has read it
    del t


def try_multiprocessing(backend, spec, budget):
    """PyTorch's own sharing of an rmmc-allocated tensor."""
    import torch
    import torch.multiprocessing as mp
    from torch.multiprocessing.reductions import reduce_tensor
    t = torch.arange(N, device="cuda", dtype=torch.float32)
    torch.cuda.synchronize()
    try:
        reduce_tensor(t)  # what Queue.put pickles: raises where sharing is refused
    except Exception as e:
        return {"works": False, "refused": True,
                "error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0])}
    if backend == "native":  # the child runs rmmc too (it reads only rmmc handles)
        os.environ.update({ENV_BACKEND: backend, ENV_SPEC: spec,
                           ENV_DEADLINE: str(max(10, budget - 20))})
    ctx = mp.get_context("spawn")
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=mp_child, args=(q, r))
    p.start()
    q.put(t)
    out = {}
    try:
        total, child_backend = wait_for(r, p, max(10, budget - 30), "the spawned child")
        torch.cuda.synchronize()
        after = float(t.double().sum().item())
        want = float(N) * (N - 1) / 2
        out = {"works": total == want and after == want + N, "child_sum": total,
               "expected": want, "parent_after_child_add": after,
               "child_backend": child_backend}
    finally:
        try:
            q.put(None)
        except Exception:
            pass
        p.join(20)
        if p.is_alive():
            p.kill()
            p.join(5)
    out["child_exit"] = p.exitcode
    out["works"] = out["works"] and p.exitcode == 0
    return out


def rmmc_child(fd, backend, spec):
    arm_watchdog(CASE_TIMEOUT - 30)
    import torch
    import rmmc.ipc
    install(backend, spec)
    s = socket.socket(fileno=fd)
    line = b""
    while not line.endswith(b"\n"):
        b = s.recv(4096)
        if not b:
            return 2
        line += b
    meta = json.loads(line.decode())
    s.sendall(b"k")
    handle, fds = rmmc.ipc.recv(s)
    t = rmmc.ipc.tensor_from(meta, handle, fds)
    for d in fds:
        os.close(d)
    ok = bool(torch.equal(t, torch.arange(N, device="cuda", dtype=torch.float32)))
    t.mul_(2)  # in place: the parent reads it
    torch.cuda.synchronize()
    # The child's own allocations go through rmmc too.
    own = torch.ones(1000, device="cuda")
    ok = ok and float(own.sum().item()) == 1000.0
    del t
    s.sendall(b"Y" if ok else b"N")
    s.recv(1)
    return 0


def try_rmmc(backend, spec, budget):
    import torch
    import rmmc.ipc
    t = torch.arange(N, device="cuda", dtype=torch.float32)
    torch.cuda.synchronize()
    meta, e = rmmc.ipc.share_tensor(t)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = subprocess.Popen([sys.executable, SELF, "--child",
                             str(theirs.fileno()), backend, spec], pass_fds=[theirs.fileno()])
    theirs.close()
    wait = max(10, budget - 30)
    try:
        info = e.info
        ours.sendall(json.dumps(meta).encode() + b"\n")
        if recv_exact(ours, 1, wait, proc) != b"k":
            raise ChildDied("the child exited with %s before it took the handle" % proc.wait(10))
        rmmc.ipc.send(ours, e)
        e.close()
        child_ok = recv_exact(ours, 1, wait, proc) == b"Y"
        torch.cuda.synchronize()
        doubled = bool(torch.equal(t, 2 * torch.arange(N, device="cuda", dtype=torch.float32)))
        ours.sendall(b"x")
        code = proc.wait(20)
    finally:
        ours.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    return {"works": child_ok and doubled and code == 0, "child_read": child_ok,
            "parent_read_child_write": doubled, "child_exit": code, "kind": info["kind"],
            "descriptors": info["nfds"]}


def case_main(what, backend, spec):
    """One case in this (fresh) process: prints RESULT {json}."""
    arm_watchdog(CASE_TIMEOUT - 15)
    try:
        install(backend, spec)
        import rmmc.torch
        fn = try_multiprocessing if what == "multiprocessing" else try_rmmc
        out = fn(backend, spec, CASE_TIMEOUT - 15)
        out["backend"] = rmmc.torch.backend()
    except Exception as e:
        traceback.print_exc()
        out = {"works": False, "error": "%s: %s" % (type(e).__name__, e)}
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def _descendants(pid):
    """pid and every process below it (from /proc)."""
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def wait_channels(pid):
    """What each thread of pid's process tree waits in (the kernel's wait
    channel and the system call), as text lines."""
    lines = []
    for p in _descendants(pid):
        try:
            with open("/proc/%d/cmdline" % p, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
            tasks = sorted(os.listdir("/proc/%d/task" % p), key=int)
        except OSError:
            continue
        lines.append("process %d: %s" % (p, cmd))
        for t in tasks:
            vals = []
            for name in ("comm", "wchan", "syscall"):
                try:
                    with open("/proc/%d/task/%s/%s" % (p, t, name)) as f:
                        vals.append(f.read().strip().split(" ")[0] or "-")
                except OSError:
                    vals.append("?")
            lines.append("  thread %s %-16s wchan=%s syscall=%s" % (t, vals[0], vals[1], vals[2]))
    return lines


def run_watched(cmd, timeout, env=None):
    """Runs cmd in a new session; at the deadline reads the wait channels
    of its process tree, asks every process in it for its Python stacks
    (SIGUSR1, which arm_watchdog has faulthandler dump) and kills the
    group. Returns (returncode, or None when timed out, stdout, stderr,
    wait lines)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err, []
    except subprocess.TimeoutExpired:
        waits = wait_channels(p.pid)
        for q in reversed(_descendants(p.pid)):
            try:
                os.kill(q, signal.SIGUSR1)
            except OSError:
                pass
        time.sleep(2)  # the dumps
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        out, err = p.communicate()
        return None, out or "", err or "", waits


def run_case(what, backend, spec, timeout=CASE_TIMEOUT):
    env = {k: v for k, v in os.environ.items() if k not in (ENV_BACKEND, ENV_SPEC, ENV_DEADLINE)}
    rc, out, err, waits = run_watched([sys.executable, SELF, "--case", what, backend, spec],
                                      timeout, env)
    sys.stderr.write(err)
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    if rc is None:
        sys.stderr.write("torch_ipc: %s/%s/%s timed out after %d s; its threads waited in:\n%s\n"
                         % (backend, what, spec, timeout, "\n".join(waits)))
        return {"works": False, "error": "timed out after %d s (stacks and wait channels on "
                                         "stderr)" % timeout, "wait_channels": waits}
    return {"works": False, "error": "exit %d: %s" % (rc, (err or out)[-400:])}


def verdict(backend, what, kind, out):
    """PASS, FAIL, SKIP or INFO (reported only) for one case's result."""
    if out.get("works"):
        return "PASS"
    if what == "multiprocessing" and backend == "plugin" and out.get("refused"):
        return "INFO"  # PyTorch refuses pluggable allocators: expected
    if (what == "multiprocessing" and kind == "pages"
            and "Operation not permitted" in json.dumps(out)):
        return "SKIP"  # pidfd_getfd refused by the host's ptrace policy
    return "FAIL"


def main(argv):
    if len(argv) > 4 and argv[1] == "--child":
        return rmmc_child(int(argv[2]), argv[3], argv[4])
    if len(argv) > 4 and argv[1] == "--case":
        return case_main(argv[2], argv[3], argv[4])
    json_path = argv[argv.index("--json") + 1] if "--json" in argv else None
    backends = (argv[argv.index("--backends") + 1].split(",") if "--backends" in argv
                else list(BACKENDS))
    timeout = int(argv[argv.index("--timeout") + 1]) if "--timeout" in argv else CASE_TIMEOUT
    try:
        import torch
    except ImportError:
        print("torch_ipc: PyTorch is not installed: skipped")
        return 77
    if not torch.cuda.is_available():
        print("torch_ipc: no GPU for PyTorch: skipped")
        return 77
    results = {"torch": torch.__version__, "cases": {}}
    print("torch_ipc: PyTorch %s" % torch.__version__, flush=True)
    failed = 0
    for backend in backends:
        for what in ("multiprocessing", "rmmc.ipc"):
            for kind, spec in SPECS.items():
                t0 = time.monotonic()
                out = run_case(what, backend, spec, timeout)
                out["seconds"] = round(time.monotonic() - t0, 1)
                v = verdict(backend, what, kind, out)
                out["verdict"] = v
                name = "%s %s %s" % (backend, "torch.multiprocessing" if what ==
                                     "multiprocessing" else what, kind)
                results["cases"][name] = out
                failed += v == "FAIL"
                detail = "" if v == "PASS" else ": " + str(out.get("error") or json.dumps(out))
                print("  %-4s %s (%s, %.1f s)%s" % (v, name, spec, out["seconds"], detail[:300]),
                      flush=True)
    results["failed"] = failed
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)
    print("torch_ipc: %s" % ("PASS" if not failed else "FAIL (%d)" % failed), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
