#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch tensors allocated through rmmc's plug-in, shared with another
process (issue 15).

1. PyTorch's own path: torch.multiprocessing pickles a CUDA tensor with
   reduce_tensor -> Storage._share_cuda_(), which asks the allocator for an
   IPC handle (shareIpcHandle in current PyTorch, getBaseAllocation +
   cudaIpcGetMemHandle in older ones). The script tries it and reports what
   this PyTorch does with a pluggable allocator: current versions raise
   ("CUDAPluggableAllocator does not yet support shareIPcHandle"); where it
   works (older versions, with rmmc's set_base_alloc_fn hook) a spawned
   child with PyTorch's native allocator receives the tensor and its values
   are checked.
2. rmmc's path, which works with any PyTorch: rmmc.ipc.share_tensor() in
   this process, handle and descriptors over a UNIX socket, and
   rmmc.ipc.tensor_from() in a child that also allocates through rmmc; the
   child checks the values, doubles the tensor in place, and this process
   reads the doubled values. For chunks (pool(expandable=false) > cuda) and
   pages (pool(expandable=true) > cuda(ipc=true)).

    python3 scripts/torch_ipc.py [--json FILE]   # a GPU and PyTorch; exit 0 when rmmc's path works

Prints one line per case ("rmmc.ipc chunks: ok", "torch.multiprocessing:
..."); the JSON has the same, with the PyTorch version.
"""
import json
import os
import socket
import subprocess
import sys
import traceback

SPECS = {"chunks": "pool(expandable=false) > cuda",
         "pages": "pool(expandable=true, page=2MiB) > cuda(ipc=true)"}
N = 3 << 20  # floats: 12 MiB


def native_child(q, r):
    """A child on PyTorch's own allocator, receiving through torch.multiprocessing."""
    import torch
    t = q.get()
    r.put(float(t.double().sum().item()))
    del t


def try_native(spec):
    """PyTorch's own sharing of an rmmc-allocated tensor."""
    import torch
    import torch.multiprocessing as mp
    from torch.multiprocessing.reductions import reduce_tensor
    t = torch.arange(N, device="cuda", dtype=torch.float32)
    torch.cuda.synchronize()
    try:
        reduce_tensor(t)  # what Queue.put pickles: raises where sharing is refused
    except Exception as e:
        return {"works": False, "error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0])}
    ctx = mp.get_context("spawn")
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=native_child, args=(q, r))
    p.start()
    q.put(t)
    try:
        got = r.get(timeout=300)
    finally:
        p.join(300)
    want = float(N) * (N - 1) / 2
    return {"works": got == want and p.exitcode == 0, "sum": got, "expected": want,
            "child_exit": p.exitcode}


def rmmc_child(fd, spec):
    import torch
    import rmmc.ipc
    import rmmc.torch
    rmmc.torch.use(spec, backend="plugin")  # rmmc.ipc.share_tensor: the plug-in's path
    s = socket.socket(fileno=fd)
    line = b""
    while not line.endswith(b"\n"):
        line += s.recv(4096)
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


def try_rmmc(spec):
    import torch
    import rmmc.ipc
    t = torch.arange(N, device="cuda", dtype=torch.float32)
    torch.cuda.synchronize()
    meta, e = rmmc.ipc.share_tensor(t)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child",
                             str(theirs.fileno()), spec], pass_fds=[theirs.fileno()])
    theirs.close()
    info = e.info
    ours.sendall(json.dumps(meta).encode() + b"\n")
    ours.recv(1)
    rmmc.ipc.send(ours, e)
    e.close()
    child_ok = ours.recv(1) == b"Y"
    torch.cuda.synchronize()
    doubled = bool(torch.equal(t, 2 * torch.arange(N, device="cuda", dtype=torch.float32)))
    ours.sendall(b"x")
    code = proc.wait(300)
    ours.close()
    return {"works": child_ok and doubled and code == 0, "child_read": child_ok,
            "parent_read_child_write": doubled, "child_exit": code, "kind": info["kind"],
            "descriptors": info["nfds"]}


def run_case(case, spec):
    """One case in a fresh interpreter (an allocator is chosen before CUDA starts)."""
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--case", case, spec],
                       capture_output=True, text=True, timeout=600)
    sys.stderr.write(r.stderr)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"works": False, "error": "exit %d: %s" % (r.returncode, (r.stderr or r.stdout)[-400:])}


def main():
    if len(sys.argv) > 3 and sys.argv[1] == "--child":
        return rmmc_child(int(sys.argv[2]), sys.argv[3])
    if len(sys.argv) > 3 and sys.argv[1] == "--case":
        import rmmc.torch
        rmmc.torch.use(sys.argv[3], backend="plugin")
        try:
            out = try_native(sys.argv[3]) if sys.argv[2] == "native" else try_rmmc(sys.argv[3])
        except Exception as e:
            traceback.print_exc()
            out = {"works": False, "error": "%s: %s" % (type(e).__name__, e)}
        print("RESULT " + json.dumps(out))
        return 0
    json_path = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    import torch
    if not torch.cuda.is_available():
        print("torch_ipc: no GPU for PyTorch")
        return 77
    results = {"torch": torch.__version__, "cases": {}}
    print("PyTorch %s" % torch.__version__)
    for kind, spec in SPECS.items():
        out = run_case("native", spec)
        results["cases"]["torch.multiprocessing " + kind] = out
        print("torch.multiprocessing %s (%s): %s" % (
            kind, spec, "works" if out["works"] else "refused: " + out.get("error", json.dumps(out))))
    failed = 0
    for kind, spec in SPECS.items():
        out = run_case("rmmc", spec)
        results["cases"]["rmmc.ipc " + kind] = out
        print("rmmc.ipc %s: %s" % (kind, "ok" if out["works"] else "FAILED " + json.dumps(out)))
        failed += not out["works"]
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
