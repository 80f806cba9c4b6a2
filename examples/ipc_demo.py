#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Two processes sharing device memory through rmmc.ipc, with no framework:
this one allocates blocks from a stack, fills them, exports them and sends
the handles (and, for pages, file descriptors) over a UNIX socket to a
child interpreter, which imports them, checks every byte, writes into the
first block and closes them; this one then reads the child's bytes. Then a
freed block's handle is sent and must be refused as stale. Runs for chunks
(pool(expandable=false) > cuda) and pages (pool(expandable=true) >
cuda(ipc=true)).

    PYTHONPATH=python python3 examples/ipc_demo.py [--check]     # needs a GPU; exit 0 when all is well

(--check: quiet but for one line per case.) Device memory is read and
written with cudaMemcpy from the CUDA runtime librmmc loaded.
"""
import ctypes
import os
import socket
import subprocess
import sys

import rmmc
import rmmc.ipc

CASES = [("chunks", "pool(expandable=false) > cuda", [1 << 20, 5 << 20, 300 << 10]),
         ("pages", "pool(expandable=true, page=2MiB) > cuda(ipc=true)",
          [9 << 20, 200 << 10, 3 << 20])]


def cudart():
    """The CUDA runtime librmmc uses (found in this process's mappings)."""
    rmmc._lib.lib()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "libcudart" in os.path.basename(path):
                rt = ctypes.CDLL(path)
                rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                          ctypes.c_int]
                return rt
    raise RuntimeError("librmmc's CUDA runtime is not loaded")


def pattern(tag, n):
    return bytes((tag * 131 + i * 7) & 0xFF for i in range(min(n, 1 << 16))) * (n // (1 << 16) + 1)


def put(rt, ptr, data):
    buf = ctypes.create_string_buffer(data, len(data))
    assert rt.cudaMemcpy(ptr, buf, len(data), 4) == 0  # cudaMemcpyDefault


def get(rt, ptr, n):
    buf = ctypes.create_string_buffer(n)
    assert rt.cudaMemcpy(buf, ptr, n, 4) == 0
    return buf.raw


def child(fd):
    rt = cudart()
    s = socket.socket(fileno=fd)
    while True:
        try:
            handle, fds = rmmc.ipc.recv(s)
        except rmmc.RmmcError:
            return 0  # the parent closed the socket
        tag = int.from_bytes(s.recv(8, socket.MSG_WAITALL), "little")
        try:
            p = rmmc.ipc.import_handle(handle, fds)
        except rmmc.StaleError as e:
            s.sendall(b"S" + e.message.encode()[:255].ljust(255))
            continue
        finally:
            for d in fds:
                os.close(d)
        n = rmmc.ipc.info(handle)["bytes"]
        ok = get(rt, p, n) == pattern(tag, n)[:n]
        if ok and tag == 0:
            put(rt, p, pattern(99, n)[:n])  # the first block: write for the parent to read
        rmmc.ipc.close(p)
        s.sendall((b"Y" if ok else b"N") + b" " * 255)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return child(int(sys.argv[2]))
    quiet = "--check" in sys.argv
    if rmmc.device_count() == 0:
        print("ipc_demo: no GPU")
        return 77
    rt = cudart()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child",
                             str(theirs.fileno())], pass_fds=[theirs.fileno()])
    theirs.close()
    failures = 0
    stale_ok = True
    for name, spec, sizes in CASES:
        with rmmc.Resource(spec, device=0) as r:
            blocks = []
            for tag, n in enumerate(sizes):
                p = r.allocate(n)
                put(rt, p, pattern(tag, n)[:n])
                blocks.append((p, n))
            ok = True
            for tag, (p, n) in enumerate(blocks):
                with rmmc.ipc.export(p, resource=r) as e:
                    if not quiet:
                        print(name, e.info)
                    rmmc.ipc.send(ours, e)
                    ours.sendall(tag.to_bytes(8, "little"))
                ok = ok and ours.recv(256, socket.MSG_WAITALL)[:1] == b"Y"
            ok = ok and get(rt, blocks[0][0], blocks[0][1]) == pattern(99, blocks[0][1])[:blocks[0][1]]
            print("%s: %s" % (name, "ok" if ok else "FAILED"))
            failures += not ok
            # A freed block's handle: stale on the other side.
            p, n = blocks[1]
            e = rmmc.ipc.export(p, resource=r)
            r.deallocate(p, n)
            rmmc.ipc.send(ours, e)
            ours.sendall((1).to_bytes(8, "little"))
            e.close()
            reply = ours.recv(256, socket.MSG_WAITALL)
            stale = reply[:1] == b"S" and b"freed the block" in reply
            if not stale:
                print("%s: a freed block's handle was not refused: %s"
                      % (name, reply[1:].decode().strip()))
            stale_ok = stale_ok and stale
            for p, n in blocks[:1] + blocks[2:]:
                r.deallocate(p, n)
    print("stale: %s" % ("ok" if stale_ok else "FAILED"))
    failures += not stale_ok
    ours.close()
    failures += proc.wait() != 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
