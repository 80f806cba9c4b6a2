#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The library's layering (docs/design.md, "Layers"), checked on the objects
of the static library.

Usage:
  test_layers.py graph NM librmmc.a
      Reads each object's defined and undefined symbols with `nm` and draws
      the graph "object A calls object B". Fails on a cycle (printing one
      with the symbols on its edges), on a call from a lower layer to a
      higher one, and on an object of src/ that has no layer below.
  test_layers.py link PROGRAM MAP [MAX]
      PROGRAM (tests/layers_host_link.c) was linked statically against
      librmmc.a with -Wl,-Map=MAP. Runs it (exit 0 expected), then reads from
      the map which objects of librmmc.a the linker took: at most MAX
      (default 12), and none above the resources and adaptors.
"""
import os
import re
import subprocess
import sys

# Lowest first: one folder per layer (docs/design.md, "The house"). A file
# may call files of its own layer or lower ones, never higher ones; the
# graph as a whole has no cycle. Patterns are paths under the source root; a
# trailing '*' matches any file of that folder (resources/ includes the
# pool's folder).
LAYERS = [
    ("base", ["src/base/*"]),
    ("resources", ["src/resources/*", "src/resources/pool/*"]),
    ("adaptors", ["src/adaptors/*"]),
    ("stack", ["src/stack/*"]),
    ("containers", ["src/containers/*"]),
    ("front", ["src/front/*"]),
]
RESOURCE_LAYERS = (1, 2)

# The pool's stream-ordering core (src/resources/pool/core.h lists its files)
# is one unit: its files call one another both ways by design, and a program
# that takes the pool takes them all. The graph and the link count see one
# node, src/resources/pool/core.
POOL_CORE = {f"src/resources/pool/{f}.c" for f in (
    "pool", "tcache", "stream_heaps", "lend", "policy", "graphs", "figures", "lifetime")}
# The virtual-memory backend's placing and growing (vm.c) and its mappings
# (vm_map.c, split out of vm.c to keep files short) call each other as one
# file did: one node, src/resources/pool/vm.c.
POOL_UNITS = {f: "src/resources/pool/core" for f in POOL_CORE}
POOL_UNITS["src/resources/pool/vm_map.c"] = "src/resources/pool/vm.c"
assert [LAYERS[i][0] for i in RESOURCE_LAYERS] == ["resources", "adaptors"]

failures = []


def fail(what):
    failures.append(what)
    print("FAIL:", what)


def source_of(member):
    """src_resources_cuda_async.c.o -> src/resources/cuda_async.c (Meson's
    object names: the source path with '/' as '_'). Folders deepest first;
    src/resources/ holds no pool_*.c beside the pool/ folder, so the names
    cannot be confused."""
    name = re.sub(r"\.o(bj)?$", "", member)
    for folder in ("src_resources_pool_", "src_resources_", "src_adaptors_", "src_containers_",
                   "src_base_", "src_stack_", "src_front_", "src_"):
        if name.startswith(folder):
            path = folder[:-1].replace("_", "/") + "/" + name[len(folder):]
            return POOL_UNITS.get(path, path)
    return name


def layer_of(path):
    for rank, (_, patterns) in enumerate(LAYERS):
        for pat in patterns:
            if pat.endswith("*") and path.startswith(pat[:-1]) and "/" not in path[len(pat) - 1:]:
                return rank
            if path == pat:
                return rank
    return None


def read_graph(nm, archive):
    """{object: {callee: [symbols]}} from `nm -A --format=posix`."""
    out = subprocess.run([nm, "-A", "--format=posix", archive], capture_output=True, text=True,
                         check=True).stdout
    defined, undefined = {}, {}
    line_re = re.compile(r"^.*\[([^\]]+)\]: (\S+) (\S)")
    for line in out.splitlines():
        m = line_re.match(line)
        if not m:
            continue
        obj, sym, kind = source_of(m.group(1)), m.group(2), m.group(3)
        undefined.setdefault(obj, set())
        if kind == "U":
            undefined[obj].add(sym)
        elif kind in "TDBRCVWGSiu":  # global definitions (weak ones too)
            defined[sym] = obj
    graph = {o: {} for o in undefined}
    for obj, syms in undefined.items():
        for sym in sorted(syms):
            callee = defined.get(sym)
            if callee is not None and callee != obj:
                graph[obj].setdefault(callee, []).append(sym)
    return graph


def strongly_connected(graph):
    """Tarjan's components, each a sorted list."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def one_cycle(graph, comp):
    """A shortest cycle through comp's first object, as a list of objects."""
    start, members = comp[0], set(comp)
    paths, seen = [[start]], {start}
    while paths:
        nxt = []
        for path in paths:
            for w in sorted(graph[path[-1]]):
                if w == start:
                    return path + [start]
                if w in members and w not in seen:
                    seen.add(w)
                    nxt.append(path + [w])
        paths = nxt
    return [start]


def check_graph(nm, archive):
    graph = read_graph(nm, archive)
    print(f"{len(graph)} objects in {archive}")
    for obj in sorted(graph):
        if layer_of(obj) is None:
            fail(f"{obj} has no layer: add it to LAYERS in tests/test_layers.py and to "
                 "docs/design.md, \"Layers\"")
    for comp in strongly_connected(graph):
        if len(comp) < 2:
            continue
        cycle = one_cycle(graph, comp)
        steps = "\n".join(f"    {a} -> {b} ({', '.join(graph[a][b][:3])})"
                          for a, b in zip(cycle, cycle[1:]))
        fail(f"a cycle of {len(comp)} objects: {', '.join(comp)}\n  for instance:\n{steps}")
    for obj in sorted(graph):
        lo = layer_of(obj)
        for callee, syms in sorted(graph[obj].items()):
            hi = layer_of(callee)
            if lo is not None and hi is not None and hi > lo:
                fail(f"{obj} ({LAYERS[lo][0]}) calls up into {callee} ({LAYERS[hi][0]}): "
                     f"{', '.join(syms[:4])}")


def check_link(program, map_file, limit):
    p = subprocess.run([program], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        fail(f"{program} exited {p.returncode}: {p.stdout}{p.stderr}")
    text = open(map_file, encoding="utf-8", errors="replace").read()
    members = sorted({source_of(m) for m in re.findall(r"librmmc\.a\(([^)]+)\)", text)})
    print(f"the host-only program links {len(members)} objects of librmmc.a:")
    for m in members:
        rank = layer_of(m)
        print(f"  {m} ({LAYERS[rank][0] if rank is not None else 'no layer'})")
    if not members:
        fail(f"{map_file} names no member of librmmc.a: is it a link map of {program}?")
    if len(members) > limit:
        fail(f"{len(members)} objects, more than {limit}")
    above = [m for m in members if layer_of(m) is None or layer_of(m) > max(RESOURCE_LAYERS)]
    if above:
        fail("objects above the resources and adaptors: " + ", ".join(above))
    if failures and text.startswith("Archive member included"):
        # GNU ld's map opens with why each member was taken.
        print("\nwhy, from the link map:\n" + "\n".join(text.split("\n\n")[1:2]))

def main():
    if len(sys.argv) == 4 and sys.argv[1] == "graph":
        check_graph(sys.argv[2], sys.argv[3])
    elif len(sys.argv) in (4, 5) and sys.argv[1] == "link":
        check_link(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) == 5 else 12)
    else:
        sys.exit(__doc__)
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
