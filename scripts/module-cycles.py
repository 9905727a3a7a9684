#!/usr/bin/env python3
"""Finds import cycles between the modules of a Rust crate.

Usage: module-cycles.py SRC_DIR [SRC_DIR ...]

For each crate source directory (e.g. crates/ferry-storage/src) the module tree is followed from the crate roots
(lib.rs, main.rs, bin/*.rs) through `mod name;` declarations and inline `mod name { ... }` blocks. Every path
that starts with `crate::`, `super::` or `self::` (in `use` trees, grouped ones included, and in code) is resolved
to the module it names. Then, for every module that has child modules (the crate root, and each directory module
recursively), a graph is built whose nodes are its children: an edge `a -> b` means that code inside child `a`
(any depth below it) refers to something inside child `b` (a directory module counts as one node). A name that
the parent re-exports from a child (`pub use log::Log;` in lib.rs, then `crate::Log` elsewhere) counts as a
reference to that child. Comments and string literals are ignored; glob imports (`use super::*`) are not
followed.

Every elementary cycle of every such graph is printed with one example reference per edge (file:line). The exit
status is 1 when any cycle was found, 0 otherwise, 2 on bad usage. Python 3 standard library only.
"""

from __future__ import annotations

import bisect
import os
import re
import sys
from dataclasses import dataclass, field

MAX_CYCLES_PER_GRAPH = 200


# ---------------------------------------------------------------------------------------------------------------
# Lexing: blank out comments and string/char literals, keeping line structure.
# ---------------------------------------------------------------------------------------------------------------

TOKEN = re.compile(r'//|/\*|(?<![A-Za-z0-9_])b?r#*"|"|\'')
STRING_REST = re.compile(r'(?:[^"\\]|\\.)*"', re.DOTALL)
CHAR_LITERAL = re.compile(r"'(?:\\u\{[0-9a-fA-F]+\}|\\.|[^\\'\n])'")


def _blank(s: str) -> str:
    return re.sub(r"[^\n]", " ", s)


def strip_comments_and_strings(text: str) -> str:
    """Blanks out comments and string and char literals (keeping newlines, so line numbers stay)."""
    out = []
    i = 0
    n = len(text)
    while True:
        m = TOKEN.search(text, i)
        if m is None:
            out.append(text[i:])
            break
        out.append(text[i:m.start()])
        tok, at = m.group(0), m.start()
        if tok == "//":
            end = text.find("\n", at)
            end = n if end == -1 else end
        elif tok == "/*":
            # Block comments nest in Rust.
            depth, end = 1, at + 2
            while depth and end < n:
                nxt_open, nxt_close = text.find("/*", end), text.find("*/", end)
                if nxt_close == -1:
                    end = n
                    break
                if nxt_open != -1 and nxt_open < nxt_close:
                    depth, end = depth + 1, nxt_open + 2
                else:
                    depth, end = depth - 1, nxt_close + 2
        elif tok == "'":
            c = CHAR_LITERAL.match(text, at)
            if c is None:  # a lifetime or a label
                out.append("'")
                i = at + 1
                continue
            end = c.end()
        elif tok == '"':
            r = STRING_REST.match(text, at + 1)
            end = n if r is None else r.end()
        else:  # raw string: r#"..."#, br"..."
            hashes = tok[tok.index("r") + 1:-1]
            close = text.find('"' + hashes, m.end())
            end = n if close == -1 else close + 1 + len(hashes)
        out.append(_blank(text[at:end]))
        i = end
    return "".join(out)


# ---------------------------------------------------------------------------------------------------------------
# Module tree
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Module:
    path: tuple[str, ...]           # absolute module path below the crate root
    children: set[str] = field(default_factory=set)
    # Names brought into this module's own namespace by `use` that point into one of its children:
    # name -> child module name.
    reexports: dict[str, str] = field(default_factory=dict)


@dataclass
class Reference:
    source: tuple[str, ...]         # module the reference is written in
    target: tuple[str, ...]         # resolved absolute path (module path + maybe item names)
    file: str
    line: int


@dataclass
class Crate:
    root_file: str
    modules: dict[tuple[str, ...], Module] = field(default_factory=dict)
    references: list[Reference] = field(default_factory=list)
    # `use` paths written in each module, relative paths included: (module, path segments).
    uses: list[tuple[tuple[str, ...], list[str]]] = field(default_factory=list)


MOD_DECL = re.compile(r"\b(?:pub(?:\s*\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*([;{])")
PATH_REF = re.compile(r"(?<![A-Za-z0-9_$])((?:crate|super|self)(?:\s*::\s*(?:[A-Za-z_][A-Za-z0-9_]*|\{))+)")
USE_STMT = re.compile(r"(?<![A-Za-z0-9_])use\s+([^;]*);")


def expand_use_tree(tree: str) -> list[list[str]]:
    """Expands `a::{b, c::{d, e}}` into [[a, b], [a, c, d], [a, c, e]]; `x as y` keeps x and records y."""
    tree = re.sub(r"\s+", " ", tree).strip()
    tree = tree.lstrip(":").strip()

    def split_top(s: str) -> list[str]:
        parts, depth, cur = [], 0, []
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append("".join(cur))
                cur = []
            else:
                cur.append(ch)
        parts.append("".join(cur))
        return [p.strip() for p in parts if p.strip()]

    def expand(s: str) -> list[list[str]]:
        s = s.strip()
        brace = s.find("{")
        if brace == -1:
            alias = None
            m = re.match(r"(.*?)\s+as\s+([A-Za-z_][A-Za-z0-9_]*)$", s)
            if m:
                s, alias = m.group(1), m.group(2)
            segs = [x.strip() for x in s.split("::") if x.strip()]
            if alias is not None and segs:
                segs = segs + [f"as:{alias}"]
            return [segs]
        prefix = [x.strip() for x in s[:brace].split("::") if x.strip()]
        inner = s[brace + 1:s.rfind("}")]
        out = []
        for part in split_top(inner):
            for tail in expand(part):
                out.append(prefix + tail)
        return out

    return expand(tree)


def resolve(current: tuple[str, ...], segs: list[str]) -> tuple[str, ...] | None:
    """Resolves a path starting with crate/super/self against the module `current`. Returns the absolute path."""
    if not segs:
        return None
    base: list[str]
    rest = list(segs)
    if rest[0] == "crate":
        base = []
        rest = rest[1:]
    elif rest[0] in ("super", "self"):
        base = list(current)
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                if not base:
                    return None
                base.pop()
            rest = rest[1:]
    else:
        return None
    out = base + [s for s in rest if not s.startswith("as:") and s not in ("self", "*")]
    return tuple(out)


def line_starts(text: str) -> list[int]:
    return [0] + [m.end() for m in re.finditer("\n", text)]


def line_of(starts: list[int], pos: int) -> int:
    return bisect.bisect_right(starts, pos)


def scan_file(crate: Crate, file: str, mod_path: tuple[str, ...], rel_dir: str) -> None:
    """Reads one file that holds module `mod_path`. `rel_dir` is where its `mod x;` children live."""
    try:
        with open(file, encoding="utf-8") as f:
            raw = f.read()
    except OSError as e:
        print(f"warning: cannot read {file}: {e}", file=sys.stderr)
        return
    text = strip_comments_and_strings(raw)
    starts = line_starts(text)
    crate.modules.setdefault(mod_path, Module(mod_path))

    # Inline module spans: (start, end, path). Track braces to know which module each position is in.
    spans: list[tuple[int, int, tuple[str, ...]]] = []
    stack: list[tuple[tuple[str, ...], int]] = []    # (module path, brace depth at which it closes)
    depth = 0
    pending_inline: list[tuple[int, tuple[str, ...]]] = []
    decls: list[tuple[tuple[str, ...], str, int]] = []   # (parent path, child name, ';' or '{')
    events = []
    for m in MOD_DECL.finditer(text):
        events.append((m.start(), "mod", m))
    for m in re.finditer(r"[{}]", text):
        events.append((m.start(), m.group(0), None))
    events.sort(key=lambda e: (e[0], 0 if e[1] == "mod" else 1))
    current = mod_path
    open_at: dict[int, tuple[tuple[str, ...], int]] = {}
    for pos, kind, m in events:
        if kind == "mod":
            name, term = m.group(1), m.group(2)
            decls.append((current, name, term))
            if term == "{":
                brace_pos = m.end() - 1
                new_path = current + (name,)
                open_at[brace_pos] = (new_path, pos)
        elif kind == "{":
            depth += 1
            if pos in open_at:
                new_path, start = open_at[pos]
                stack.append((current, depth))
                current = new_path
                pending_inline.append((start, new_path))
        elif kind == "}":
            if stack and stack[-1][1] == depth:
                parent, _ = stack.pop()
                start, path = pending_inline.pop()
                spans.append((start, pos, path))
                current = parent
            depth -= 1

    def module_at(pos: int) -> tuple[str, ...]:
        best = mod_path
        best_len = -1
        for start, end, path in spans:
            if start <= pos <= end and len(path) > best_len:
                best, best_len = path, len(path)
        return best

    # Child modules: inline ones are scanned in place; `mod x;` ones are files to follow.
    for parent, name, term in decls:
        crate.modules.setdefault(parent, Module(parent)).children.add(name)
        child_path = parent + (name,)
        crate.modules.setdefault(child_path, Module(child_path))
        if term == ";":
            # Files of modules declared inside inline modules live in nested directories.
            sub = os.path.join(rel_dir, *parent[len(mod_path):])
            as_file = os.path.join(sub, name + ".rs")
            as_dir = os.path.join(sub, name, "mod.rs")
            if os.path.isfile(as_file):
                scan_file(crate, as_file, child_path, os.path.join(sub, name))
            elif os.path.isfile(as_dir):
                scan_file(crate, as_dir, child_path, os.path.join(sub, name))
            else:
                print(f"warning: module {'::'.join(child_path)} declared in {file} has no file", file=sys.stderr)

    # `use` statements: record their expanded paths (for re-exports) and references.
    use_spans = []
    for m in USE_STMT.finditer(text):
        where = module_at(m.start())
        use_spans.append((m.start(), m.end()))
        for segs in expand_use_tree(m.group(1)):
            crate.uses.append((where, segs))
            target = resolve(where, segs)
            if target is not None:
                crate.references.append(Reference(where, target, file, line_of(starts, m.start())))

    # Paths in code (outside `use` statements).
    for m in PATH_REF.finditer(text):
        if any(s <= m.start() < e for s, e in use_spans):
            continue
        segs = [s.strip() for s in m.group(1).split("::")]
        segs = [s for s in segs if s and s != "{"]
        where = module_at(m.start())
        target = resolve(where, segs)
        if target is not None:
            crate.references.append(Reference(where, target, file, line_of(starts, m.start())))


def load_crate(root_file: str) -> Crate:
    crate = Crate(root_file)
    scan_file(crate, root_file, (), os.path.dirname(root_file))
    # Re-exports: `use child::Item` (2018 relative path), `use self::child::Item`, `use crate::<...>::child::Item`
    # written in a module, naming one of its own children.
    for where, segs in crate.uses:
        mod = crate.modules.get(where)
        if mod is None or not segs or segs[-1] == "*":
            continue
        if segs[0] in ("crate", "super", "self"):
            target = resolve(where, segs)
            if target is None or len(target) <= len(where) or target[:len(where)] != where:
                continue
            child_and_rest = list(target[len(where):])
        else:
            child_and_rest = [s for s in segs if not s.startswith("as:") and s not in ("self", "*")]
        if not child_and_rest or child_and_rest[0] not in mod.children:
            continue
        # The name the `use` brings in: its alias, else its last segment (`a::b::{self}` brings in `b`).
        alias = next((s[3:] for s in segs if s.startswith("as:")), None)
        plain = [s for s in segs if not s.startswith("as:")]
        name = alias or (plain[-2] if plain[-1] == "self" and len(plain) > 1 else plain[-1])
        if name != child_and_rest[0]:
            mod.reexports[name] = child_and_rest[0]
    return crate


# ---------------------------------------------------------------------------------------------------------------
# Graphs and cycles
# ---------------------------------------------------------------------------------------------------------------

def child_of(parent: tuple[str, ...], path: tuple[str, ...], mod: Module) -> str | None:
    """The child of `parent` that `path` lies in (through the parent's re-exports too), or None."""
    if len(path) <= len(parent) or path[:len(parent)] != parent:
        return None
    first = path[len(parent)]
    if first in mod.children:
        return first
    return mod.reexports.get(first)


def graphs(crate: Crate):
    for parent, mod in sorted(crate.modules.items()):
        if len(mod.children) < 2:
            continue
        edges: dict[str, dict[str, Reference]] = {}
        for ref in crate.references:
            src = child_of(parent, ref.source, mod) if ref.source[:len(parent)] == parent else None
            if src is None or len(ref.source) <= len(parent) or ref.source[len(parent)] != src:
                continue
            dst = child_of(parent, ref.target, mod)
            if dst is None or dst == src:
                continue
            edges.setdefault(src, {}).setdefault(dst, ref)
        yield parent, sorted(mod.children), edges


def elementary_cycles(nodes: list[str], edges: dict[str, dict[str, Reference]]) -> list[list[str]]:
    """Every elementary cycle, each listed once, starting at its smallest node."""
    cycles: list[list[str]] = []
    order = {n: i for i, n in enumerate(nodes)}
    for start in nodes:
        stack = [(start, iter(sorted(edges.get(start, {}))))]
        path = [start]
        on_path = {start}
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                on_path.discard(path.pop())
                continue
            if order.get(nxt, -1) < order[start]:
                continue
            if nxt == start:
                cycles.append(list(path))
                if len(cycles) >= MAX_CYCLES_PER_GRAPH:
                    return cycles
            elif nxt not in on_path:
                path.append(nxt)
                on_path.add(nxt)
                stack.append((nxt, iter(sorted(edges.get(nxt, {})))))
    return cycles


def crate_roots(src_dir: str) -> list[str]:
    roots = [os.path.join(src_dir, f) for f in ("lib.rs", "main.rs") if os.path.isfile(os.path.join(src_dir, f))]
    bin_dir = os.path.join(src_dir, "bin")
    if os.path.isdir(bin_dir):
        for entry in sorted(os.listdir(bin_dir)):
            p = os.path.join(bin_dir, entry)
            if entry.endswith(".rs") and os.path.isfile(p):
                roots.append(p)
            elif os.path.isfile(os.path.join(p, "main.rs")):
                roots.append(os.path.join(p, "main.rs"))
    return roots


def check(src_dir: str, roots: list[str]) -> int:
    """Prints the cycles of every crate rooted in `src_dir`; returns how many there are."""
    found = 0
    for root in roots:
        crate = load_crate(root)
        for parent, nodes, edges in graphs(crate):
            where = "::".join(("crate",) + parent)
            for cycle in elementary_cycles(nodes, edges):
                found += 1
                print(f"cycle in {root} under {where}: {' -> '.join(cycle + [cycle[0]])}")
                for a, b in zip(cycle, cycle[1:] + cycle[:1]):
                    ref = edges[a][b]
                    via = "" if ref.target[len(parent)] == b else f" (re-exported from {b})"
                    print(f"    {a} -> {b}: {ref.file}:{ref.line} uses {'::'.join(('crate',) + ref.target)}{via}")
    if found == 0:
        print(f"{src_dir}: no module cycles")
    return found


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    total = 0
    for src_dir in argv[1:]:
        if not os.path.isdir(src_dir):
            print(f"{src_dir}: not a directory", file=sys.stderr)
            return 2
        roots = crate_roots(src_dir)
        if not roots:
            print(f"{src_dir}: no lib.rs, main.rs or bin/*.rs", file=sys.stderr)
            return 2
        total += check(src_dir, roots)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
