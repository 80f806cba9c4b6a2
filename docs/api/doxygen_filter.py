#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Doxygen input filter for rmmc's public headers (docs/api/Doxyfile).

The headers are the manual (STYLE.md) and use plain C comments, which
Doxygen ignores; this filter hands Doxygen the same text as documentation
comments without touching the headers: the file's opening block becomes
the file's description (@file), a block comment right before a declaration
documents it, and a trailing comment after a struct member or enum constant
documents that member. Markup-like characters Doxygen would interpret in
prose (<, >, &, \\, @, #, %) are escaped; spec examples and code stay
verbatim as written.
"""
import re
import sys

ESCAPES = [("\\", "\\\\"), ("@", "\\@"), ("<", "\\<"), (">", "\\>"), ("&", "\\&"),
           ("#", "\\#"), ("%", "\\%"), ("$", "\\$")]


def escape(text):
    for a, b in ESCAPES:
        text = text.replace(a, b)
    return text


def doc_block(lines, is_file):
    """A /* ... */ block (its lines without the markers) as a Doxygen block
    of no more lines than the comment had: the first line opens it, the last
    closes it, so Doxygen's line numbers stay the header's."""
    body = [escape(l) for l in lines] or [""]
    if is_file:  # "@file" alone on its line (the header's "/*" line)
        out = ["/** @file"] + [" * " + l if l else " *" for l in body]
    elif len(body) == 1:
        return ["/** " + body[0] + " */"]
    else:
        out = ["/** " + body[0]] + [" * " + l if l else " *" for l in body[1:]]
    out[-1] += " */"
    return out


def convert(src):
    out = []
    lines = src.split("\n")
    i = 0
    seen_file_block = False
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        # A block comment starting a line at the top level or indented.
        if stripped.startswith("/*") and not stripped.startswith("/**") and "SPDX" not in stripped:
            indent = line[:len(line) - len(line.lstrip())]
            block = []
            j = i
            text = stripped[2:]
            while True:
                end = text.find("*/")
                if end >= 0:
                    block.append(text[:end])
                    break
                block.append(text)
                j += 1
                if j >= len(lines):
                    break
                text = lines[j].strip()
                text = text[1:] if text.startswith("*") and not text.startswith("*/") else text
            cleaned = [b[1:] if b.startswith(" ") else b for b in block]
            while cleaned and not cleaned[0].strip():
                cleaned.pop(0)
            while cleaned and not cleaned[-1].strip():
                cleaned.pop()
            is_file = not seen_file_block and indent == ""
            seen_file_block = True
            new_lines = doc_block(cleaned, is_file)
            span = j - i + 1
            while len(new_lines) > span:  # a file block with text on its first line
                last = new_lines.pop()
                new_lines[-1] += " " + last[3:] if last.startswith(" * ") else " " + last
            new_lines += [""] * (span - len(new_lines))  # blank lines trimmed above
            out.extend(indent + l if l else l for l in new_lines)
            i = j + 1
            continue
        # Trailing member comments: `int x; /* what */` -> `/**< what */`.
        m = re.match(r"^(.*[;,{]\s*)/\*\s?(.*?)\s*\*/\s*$", line)
        if m and not m.group(1).strip().startswith("#"):
            out.append("%s/**< %s */" % (m.group(1), escape(m.group(2))))
            i += 1
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def option_members(src):
    """Options structs are made from an X-macro table (rmmc/options.h):
    `RMMC_<NAME>_OPTIONS(RMMC_OPTION_FIELD)` inside the struct. Each such
    line becomes the table's members, each with the comment written above
    its row, all on that one line so the line numbers stay the header's."""
    tables = {}
    for m in re.finditer(r"#define (RMMC_\w+_OPTIONS)\(X\)((?:.*\\\n)*.*)", src):
        body = m.group(2).replace("\\\n", "\n")
        members, doc = [], ""
        for part in re.finditer(r"/\*(.*?)\*/|X\(([^,]+),\s*(\w+),", body, re.S):
            if part.group(1) is not None:
                doc = " ".join(l.strip().lstrip("*").strip() for l in part.group(1).split("\n"))
                doc = " ".join(doc.split())
            else:
                text = "/** %s */ " % escape(doc) if doc else ""
                members.append("%s%s %s;" % (text, part.group(2).strip(), part.group(3)))
                doc = ""
        tables[m.group(1)] = " ".join(members)
    # The rows' comments move to the members; in the table itself they would
    # be read as documentation that ends the #define early: blank them,
    # keeping each line and its continuation.
    def blank(m):
        return re.sub(r"/\*.*?\*/", lambda c: re.sub(r"[^\n\\]", " ", c.group(0)), m.group(0),
                      flags=re.S)
    src = re.sub(r"#define RMMC_\w+_OPTIONS\(X\)(?:.*\\\n)*.*", blank, src)

    def expand(m):
        return m.group(1) + tables[m.group(2)] if m.group(2) in tables else m.group(0)

    return re.sub(r"^(\s*)(RMMC_\w+_OPTIONS)\(RMMC_OPTION_FIELD\)\s*$", expand, src, flags=re.M)


FIGURE_TYPES = {"BYTES": "size_t", "COUNT": "uint64_t"}


def figure_members(src):
    """Figures structs are made from an X-macro table (rmmc/figures.h):
    `RMMC_<NAME>_FIGURES(RMMC_FIGURE_FIELD)` inside the struct. Each such
    line becomes the members of the table's BOTH and STRUCT rows, each with
    its row's doc, all on that one line so the line numbers stay the
    header's."""
    tables = {}
    for m in re.finditer(r"#define (RMMC_\w+_FIGURES)\(X\)((?:.*\\\n)*.*)", src):
        body = m.group(2).replace("\\\n", "\n")
        members = []
        for row in re.finditer(r'X\((\w+),\s*(\w+),\s*(\w+),\s*"((?:[^"\\]|\\.)*)"\)', body):
            kind, name, where, doc = row.groups()
            if where in ("BOTH", "STRUCT"):
                members.append("/** %s */ %s %s;" % (escape(doc.replace('\\"', '"')),
                                                     FIGURE_TYPES[kind], name))
        tables[m.group(1)] = " ".join(members)

    def blank(m):
        return re.sub(r"/\*.*?\*/", lambda c: re.sub(r"[^\n\\]", " ", c.group(0)), m.group(0),
                      flags=re.S)
    src = re.sub(r"#define RMMC_\w+_FIGURES\(X\)(?:.*\\\n)*.*", blank, src)

    def expand(m):
        return m.group(1) + tables[m.group(2)] if m.group(2) in tables else m.group(0)

    return re.sub(r"^(\s*)(RMMC_\w+_FIGURES)\(RMMC_FIGURE_FIELD\)\s*$", expand, src, flags=re.M)


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(convert(figure_members(option_members(f.read()))))
