# SPDX-License-Identifier: Apache-2.0
"""The console scripts of the binary wheel: rmmc-bench, rmmc-replay and
rmmc-stress run the programs shipped in rmmc/bin (scripts/build-wheel),
with the arguments they were given. Installed from the checkout with
`pip install .`, the package has no bin/ and these say where the tools are."""
import os
import sys

_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def tool_path(name):
    """The path of a shipped tool ("rmmc-bench"), or None when this
    package has none (built from the checkout)."""
    path = os.path.join(_BIN, name)
    return path if os.access(path, os.X_OK) else None


def _exec(name):
    path = tool_path(name)
    if path is None:
        sys.stderr.write("%s: this rmmc package has no %s (the binary wheel ships it; a build "
                         "from the checkout installs it with `meson install`)\n" % (name, name))
        return 127
    os.execv(path, [name] + sys.argv[1:])
    return 127  # not reached


def bench():
    return _exec("rmmc-bench")


def replay():
    return _exec("rmmc-replay")


def stress():
    return _exec("rmmc-stress")
