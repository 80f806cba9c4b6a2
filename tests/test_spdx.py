#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""scripts/spdx on a scratch git repository: --check lists the source files
that lack the license line and fails; the fixing run adds it in each file's
comment syntax (after a #! line, mode kept), leaves data files alone, and a
second run changes nothing. Usage: test_spdx.py PATH/TO/scripts/spdx"""
import os
import subprocess
import sys
import tempfile

SPDX = os.path.abspath(sys.argv[1])
TAG = "SPDX-License-Identifier: Apache-2.0"
FILES = {
    "src/a.c": "int a;\n",
    "include/b.h": "/* b */\n",
    "tests/k.cu": "__global__ void k() {}\n",
    "tools/t.py": "#!/usr/bin/env python3\nprint(1)\n",
    "scripts/run": "#!/usr/bin/env bash\necho hi\n",
    "meson.build": "project('x', 'c')\n",
    "packaging/x.pc.in": "Name: x\n",
    "bench/data.csv": "a,b\n",
    "docs/notes.md": "# notes\n",
    "done.c": "/* " + TAG + " */\nint d;\n",
}


def git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def main():
    with tempfile.TemporaryDirectory() as repo:
        git(repo, "init", "-q")
        for path, text in FILES.items():
            full = os.path.join(repo, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        os.chmod(os.path.join(repo, "scripts/run"), 0o755)
        git(repo, "add", "-A")
        check = subprocess.run([sys.executable, SPDX, "--check"], cwd=repo, capture_output=True, text=True)
        assert check.returncode == 1, check
        lacking = {l.strip() for l in check.stderr.splitlines()[1:]}
        assert lacking == {"src/a.c", "include/b.h", "tests/k.cu", "tools/t.py", "scripts/run",
                           "meson.build", "packaging/x.pc.in"}, lacking
        fix = subprocess.run([sys.executable, SPDX], cwd=repo, capture_output=True, text=True)
        assert fix.returncode == 0 and fix.stdout.count("spdx: added to") == 7, fix.stdout
        read = lambda p: open(os.path.join(repo, p)).read()
        assert read("src/a.c") == "/* %s */\nint a;\n" % TAG
        assert read("tools/t.py") == "#!/usr/bin/env python3\n# %s\nprint(1)\n" % TAG
        assert read("scripts/run").startswith("#!/usr/bin/env bash\n# " + TAG + "\n")
        assert os.stat(os.path.join(repo, "scripts/run")).st_mode & 0o111
        assert read("bench/data.csv") == "a,b\n" and read("docs/notes.md") == "# notes\n"
        assert read("done.c") == FILES["done.c"]
        again = subprocess.run([sys.executable, SPDX], cwd=repo, capture_output=True, text=True)
        assert again.returncode == 0 and again.stdout == "", again.stdout
        ok = subprocess.run([sys.executable, SPDX, "--check"], cwd=repo, capture_output=True, text=True)
        assert ok.returncode == 0 and "8 source files carry" in ok.stdout, ok.stdout
        bad = subprocess.run([sys.executable, SPDX, "--check", "docs/notes.md"], cwd=repo,
                             capture_output=True, text=True)
        assert bad.returncode == 2, bad
    print("spdx: all checks passed")


if __name__ == "__main__":
    main()
