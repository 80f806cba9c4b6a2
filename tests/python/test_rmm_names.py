# SPDX-License-Identifier: Apache-2.0
"""RMM's Python API, name for name: every public name of the installed
rmm's top level, rmm.mr (and rmm.mr.experimental), rmm.statistics,
rmm.allocators.{cupy,numba,torch}, DeviceBuffer, Stream and the logger
calls has an rmmc counterpart, with RMM's parameters in RMM's order, names,
kinds and defaults (literal defaults compared by value, RMM's `...` by
presence), and the public methods and properties of each class. RMM's side
is read from its sources (.pyi stubs of its Cython modules, its .py files)
without importing it, so no GPU, NumPy or cuda-bindings are needed. A
difference fails unless README.md lists it, with its reason, in "Where
rmmc differs from RMM's Python API"; a listed difference that no longer
occurs fails too, so the list stays true. Skipped without rmm
(scripts/check-python installs rmm-cu13)."""
import ast
import importlib
import importlib.util
import inspect
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.find_spec("rmm")
if spec is None or not spec.submodule_search_locations:
    pytest.skip("rmm is not installed", allow_module_level=True)
RMM = list(spec.submodule_search_locations)[0]


def _read(rel):
    with open(os.path.join(RMM, rel)) as f:
        return ast.parse(f.read())


def _all(tree):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                for t in node.targets):
            return [ast.literal_eval(e) for e in node.value.elts]
    return None


def _public(tree):
    """Top-level public defs and classes (and names assigned) of a module."""
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            call = getattr(node.value, "func", None)
            if getattr(call, "id", None) in ("TypeVar", "ParamSpec"):
                continue  # typing helpers, not API
            for t in node.targets:
                if isinstance(t, ast.Name) and not t.id.startswith("_"):
                    out[t.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


KINDS = {"posonly": inspect.Parameter.POSITIONAL_ONLY, "arg": inspect.Parameter.POSITIONAL_OR_KEYWORD,
         "kwonly": inspect.Parameter.KEYWORD_ONLY, "vararg": inspect.Parameter.VAR_POSITIONAL,
         "kwarg": inspect.Parameter.VAR_KEYWORD}
NO_LITERAL = object()  # RMM's `...` or an expression: compared by presence only


def _default(node):
    if node is None:
        return inspect.Parameter.empty
    try:
        v = ast.literal_eval(node)
    except ValueError:
        return NO_LITERAL
    if v is Ellipsis:
        return NO_LITERAL
    return v


def _params(fn, method):
    """[(name, kind, default)] of an ast function, without self."""
    a = fn.args
    out = []
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    for i, (arg, d) in enumerate(zip(pos, defaults)):
        kind = KINDS["posonly"] if i < len(a.posonlyargs) else KINDS["arg"]
        out.append((arg.arg, kind, _default(d)))
    if a.vararg:
        out.append((a.vararg.arg, KINDS["vararg"], inspect.Parameter.empty))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, KINDS["kwonly"], _default(d)))
    if a.kwarg:
        out.append((a.kwarg.arg, KINDS["kwarg"], inspect.Parameter.empty))
    if method and out and out[0][0] in ("self", "cls"):
        out = out[1:]
    return out


def _class_members(cls_node):
    """{name: ('method', params) | ('property', None) | ('attr', None)} of a class."""
    out = {}
    for node in cls_node.body:
        if isinstance(node, ast.FunctionDef):
            decos = [getattr(d, "id", getattr(d, "attr", "")) for d in node.decorator_list]
            if node.name == "__init__":
                out["__init__"] = ("method", _params(node, True))
            elif node.name.startswith("_") and node.name not in (
                    "__copy__", "__bytes__", "__cuda_array_interface__", "__cuda_stream__",
                    "__len__"):
                continue
            elif "property" in decos:
                out[node.name] = ("property", None)
            elif node.name in out:  # @overload: the first says it
                continue
            else:
                out[node.name] = ("method", _params(node, "staticmethod" not in decos))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = ("attr", None)
    return out


def _ours(obj, method):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    out = [(p.name, p.kind, p.default) for p in sig.parameters.values()]
    if method and out and out[0][0] in ("self", "cls"):
        out = out[1:]
    return out


def _compare(name, theirs, ours, diffs):
    if ours is None:
        diffs.add((name, "no signature"))
        return
    for i, (pname, kind, default) in enumerate(theirs):
        if i >= len(ours):
            diffs.add((name, "missing %s" % pname))
            continue
        oname, okind, odefault = ours[i]
        if oname != pname:
            diffs.add((name, "parameter %d: %s, not %s" % (i + 1, oname, pname)))
            continue
        if okind != kind:
            diffs.add((name, "%s: %s" % (pname, okind.description)))
        if (default is inspect.Parameter.empty) != (odefault is inspect.Parameter.empty):
            diffs.add((name, "%s: %s" % (pname, "a default" if odefault is not
                                         inspect.Parameter.empty else "no default")))
        elif default not in (inspect.Parameter.empty, NO_LITERAL) and odefault != default:
            diffs.add((name, "%s=%r" % (pname, odefault)))
    for oname, okind, odefault in ours[len(theirs):]:
        if okind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        diffs.add((name, "extra %s" % oname))


def _compare_function(qual, node, obj, diffs, method=False):
    _compare(qual, _params(node, method), _ours(obj, method), diffs)


def _compare_class(qual, node, cls, diffs):
    members = _class_members(node)
    for mname, (what, params) in sorted(members.items()):
        if mname == "__init__":
            _compare(qual, params, _ours(cls.__init__, True), diffs)
            continue
        if not (hasattr(cls, mname) or mname in getattr(cls, "__dataclass_fields__", {})):
            diffs.add(("%s.%s" % (qual, mname), "missing"))
            continue
        if what == "method":
            ours = inspect.getattr_static(cls, mname)
            if isinstance(ours, (staticmethod, classmethod)):
                _compare("%s.%s" % (qual, mname), params, _ours(ours.__func__, False), diffs)
            elif isinstance(ours, property):
                diffs.add(("%s.%s" % (qual, mname), "a property"))
            else:
                _compare("%s.%s" % (qual, mname), params, _ours(ours, True), diffs)
        elif what == "property" and not isinstance(inspect.getattr_static(cls, mname), property):
            diffs.add(("%s.%s" % (qual, mname), "not a property"))


def _compare_module(qual, tree_defs, names, ours, diffs):
    for name in names:
        node = tree_defs.get(name)
        if not hasattr(ours, name):
            diffs.add(("%s.%s" % (qual, name), "missing"))
            continue
        obj = getattr(ours, name)
        if isinstance(node, ast.FunctionDef):
            _compare_function("%s.%s" % (qual, name), node, obj, diffs)
        elif isinstance(node, ast.ClassDef) and inspect.isclass(obj):
            _compare_class("%s.%s" % (qual, name), node, obj, diffs)


def rmm_differences():
    import rmmc
    import rmmc.mr
    import rmmc.statistics
    diffs = set()
    # rmm.mr: names from its __all__, signatures from the Cython module's stub.
    mr_names = _all(_read("mr/__init__.py"))
    mr_defs = _public(_read("pylibrmm/memory_resource/_memory_resource.pyi"))
    _compare_module("rmm.mr", mr_defs, [n for n in mr_names if n != "experimental"], rmmc.mr,
                    diffs)
    exp_names = _all(_read("mr/experimental.py"))
    exp_defs = _public(_read("pylibrmm/memory_resource/experimental.pyi"))
    _compare_module("rmm.mr.experimental", exp_defs, exp_names, rmmc.mr.experimental, diffs)
    # The top level: rmm/__init__.py's __all__ from rmm.rmm, the logger stub,
    # DeviceBuffer's stub and rmm.mr's logging calls.
    top_defs = {}
    for rel in ("rmm.py", "pylibrmm/logger.pyi", "pylibrmm/device_buffer.pyi"):
        top_defs.update(_public(_read(rel)))
    top_defs.update({k: v for k, v in mr_defs.items() if k in ("enable_logging",
                                                               "disable_logging",
                                                               "get_log_filenames")})
    _compare_module("rmm", top_defs, _all(_read("__init__.py")), rmmc, diffs)
    dev_defs = _public(_read("pylibrmm/device_buffer.pyi"))
    _compare_module("rmm.pylibrmm.device_buffer", dev_defs, ["to_device"], rmmc.buffer, diffs)
    stream_defs = _public(_read("pylibrmm/stream.pyi"))
    _compare_module("rmm.pylibrmm.stream", stream_defs, ["Stream", "DEFAULT_STREAM",
                                                         "LEGACY_DEFAULT_STREAM",
                                                         "PER_THREAD_DEFAULT_STREAM"],
                    rmmc, diffs)
    st_tree = _read("statistics.py")
    _compare_module("rmm.statistics", _public(st_tree), sorted(_public(st_tree)),
                    rmmc.statistics, diffs)
    for lib_name in ("cupy", "numba", "torch"):
        theirs = _public(_read("allocators/%s.py" % lib_name))
        path = os.path.join(os.path.dirname(rmmc.__file__), "allocators", lib_name + ".py")
        with open(path) as f:
            ours = _public(ast.parse(f.read()))
        for name in theirs:
            if name not in ours and not (lib_name == "numba" and name == "RMMNumbaManager"):
                diffs.add(("rmm.allocators.%s.%s" % (lib_name, name), "missing"))
        if lib_name == "cupy":
            mod = importlib.import_module("rmmc.allocators.cupy")
            _compare_function("rmm.allocators.cupy.rmm_cupy_allocator",
                              theirs["rmm_cupy_allocator"], mod.rmm_cupy_allocator, diffs)
    return diffs


def listed_differences():
    """(name, difference) of README.md's table "Where rmmc differs from
    RMM's Python API", each with a reason."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    m = re.search(r"^#+ Where rmmc differs from RMM's Python API\n(.*?)(?=^#)", text, re.M | re.S)
    assert m, "README.md has no section \"Where rmmc differs from RMM's Python API\""
    out = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`rmm"):
            continue
        name, diff, why = cells
        assert why, "README.md lists %s %s without a reason" % (name, diff)
        for d in re.findall(r"`([^`]+)`", diff):
            out[(name.strip("`"), d)] = why
    return out


def test_every_difference_from_rmm_is_listed_with_its_reason():
    diffs = rmm_differences()
    listed = listed_differences()
    unlisted = sorted(d for d in diffs if d not in listed)
    assert not unlisted, "differences from RMM not in README.md's table:\n" + "\n".join(
        "| `%s` | `%s` | ... |" % d for d in unlisted)
    stale = sorted(d for d in listed if d not in diffs)
    assert not stale, "README.md lists differences that no longer occur:\n" + "\n".join(
        "%s: %s" % d for d in stale)


def test_the_comparison_sees_a_difference():
    """The comparison itself: a renamed keyword and a missing name are found."""
    tree = ast.parse("def f(upstream_mr, size: int = 5): ...\nclass C:\n    def m(self, x): ...\n")
    diffs = set()

    class Ours:
        @staticmethod
        def f(upstream, size=6):
            pass

        class C:
            pass
    _compare_module("m", _public(tree), ["f", "C", "g"], Ours, diffs)
    assert diffs == {("m.f", "parameter 1: upstream, not upstream_mr"), ("m.f", "size=6"),
                     ("m.C.m", "missing"), ("m.g", "missing")}, diffs
