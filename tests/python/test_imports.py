# SPDX-License-Identifier: Apache-2.0
"""The package's modules import alone and form no import cycle.

Every module of rmmc is imported by itself in a fresh interpreter (an
import that works only after another module was imported fails there).
The import graph of the modules below the package's facade (rmmc/__init__.py,
which Python runs before any of them and which re-exports them at its end)
is read from the source with ast, counting imports inside functions too,
and must have no cycle: a module that imports another never gets imported
back by it, directly or through others. And the C signatures of rmmc's
libraries are declared once, in rmmc/_lib.py's table."""
import ast
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import rmmc

PACKAGE = os.path.dirname(os.path.abspath(rmmc.__file__))
# Modules that need a package rmmc does not depend on.
NEEDS = {"rmmc.numba": "numba", "rmmc.allocators.numba": "numba"}


def modules():
    """{module name: source path} of every module of the installed package."""
    out = {}
    root = os.path.dirname(PACKAGE)
    for dirpath, _dirs, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                if name.endswith(".__init__"):
                    name = name[:-len(".__init__")]
                out[name] = path
    return out


def imported(name, path, node, mods):
    """The package's modules an import statement of module `name` names."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        if node.level:
            base = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
            base = base[:len(base) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        # `from . import x` imports module x when there is one, else a name
        # of the package's __init__.
        targets = [module + "." + a.name if module + "." + a.name in mods else module
                   for a in node.names]
    out = set()
    for t in targets:
        parts = t.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c imports a.b too
            if ".".join(parts[:i]) in mods:
                out.add(".".join(parts[:i]))
    return out


def import_graph():
    """{module: modules it imports, anywhere in its source}, the facade left out."""
    mods = modules()
    graph = {}
    for name, path in mods.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps |= imported(name, path, node, mods)
        graph[name] = deps - {name, "rmmc"}
    graph.pop("rmmc")
    return graph


def find_cycle(graph):
    """A list of modules m0 -> m1 -> ... -> m0, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert {"rmmc.mr", "rmmc.stats", "rmmc.rmm", "rmmc._lib"} <= set(graph), sorted(graph)
    assert "rmmc.mr" in graph["rmmc.stats"], "the graph reader lost stats -> mr"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    # and the reader sees an import inside a function
    tree = ast.parse("def f():\n    from .stats import _read\n")
    node = tree.body[0].body[0]
    assert imported("rmmc.mr", "mr.py", node, {"rmmc": 1, "rmmc.stats": 1}) == {"rmmc",
                                                                                  "rmmc.stats"}


def _import_alone(name):
    r = subprocess.run([sys.executable, "-c", "import %s" % name], capture_output=True,
                       text=True, cwd="/")
    return name, r.returncode, r.stderr


def test_each_module_imports_alone_in_a_fresh_interpreter():
    names = sorted(n for n in modules() if n != "rmmc.__main__")
    env_ok = {}
    for n, dep in NEEDS.items():
        env_ok[n] = subprocess.run([sys.executable, "-c", "import " + dep],
                                   capture_output=True).returncode == 0
    names = [n for n in names if env_ok.get(n, True)]
    if len(names) < 20:
        pytest.fail("only %d modules found under %s" % (len(names), PACKAGE))
    with ThreadPoolExecutor(max_workers=4) as pool:
        failed = [(n, err.strip().splitlines()[-1:]) for n, rc, err in pool.map(_import_alone, names)
                  if rc != 0]
    assert not failed, failed


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A ctypes signature of one of rmmc's functions: fn.argtypes = / fn.restype =,
# or a row of a signature table: the name in quotes, then a colon and a
# tuple, or in a tuple with the result type and a list of argument types.
SIGNATURE = re.compile(r"rmmc_\w+\.(argtypes|restype)\b|[\"']rmmc_\w+[\"']\s*:\s*\("
                       r"|\(\s*[\"']rmmc_\w+[\"']\s*,\s*[\w.]+\s*,\s*\[")


def test_one_signature_table():
    """Only rmmc/_lib.py declares C signatures of rmmc's libraries, and each
    row names a function the C side declares."""
    from rmmc import _lib
    found = []
    for top in ("python", "examples", "bench", "tools", "scripts", "tests"):
        for dirpath, _dirs, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                path = os.path.join(dirpath, f)
                if not f.endswith(".py") or path == os.path.join(ROOT, "python", "rmmc", "_lib.py"):
                    continue
                with open(path, errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        if SIGNATURE.search(line):
                            found.append("%s:%d: %s" % (os.path.relpath(path, ROOT), n,
                                                        line.strip()))
    assert not found, "ctypes signatures outside rmmc/_lib.py's table:\n" + "\n".join(found)
    sources = {
        "librmmc": [os.path.join(ROOT, "include", "rmmc", h)
                    for h in os.listdir(os.path.join(ROOT, "include", "rmmc"))],
        "torch_native": [os.path.join(ROOT, "python", "rmmc", "_torch_native.cpp")],
        "rmm_bridge": [os.path.join(ROOT, "python", "rmmc", "_rmm_bridge.cpp")],
    }
    assert set(sources) == set(_lib.SIGNATURES)
    missing = []
    for library, paths in sources.items():
        text = ""
        for p in paths:
            with open(p, errors="replace") as fh:
                text += fh.read()
        missing += ["%s: %s" % (library, name) for name in _lib.SIGNATURES[library]
                    if not re.search(r"\b%s\s*\(" % name, text)]
    assert not missing, "rows naming no C declaration: %s" % missing
