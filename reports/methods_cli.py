"""``pflower methods [NAME ...]``: every method with its client role and options, or one
method's options as a table (type, default, what is allowed, what it does), read from the
method's options dataclass, the one place they are declared."""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

STRATEGIES_DIR = Path(__file__).resolve().parents[1] / "strategies"
ROLES_DIR = Path(__file__).resolve().parents[1] / "client_app" / "roles"  # the options a client reads


@dataclass(frozen=True)
class Declared:
    """A method as its source declares it: name, client role, option names (in field order)."""

    name: str
    role: str
    options: tuple[str, ...]


def _is_sent(value: ast.expr | None) -> bool:
    """Whether a field's value is ``sent(...)`` (a value the strategy computes, no option)."""
    func = value.func if isinstance(value, ast.Call) else None
    return (isinstance(func, ast.Name) and func.id == "sent") or (
        isinstance(func, ast.Attribute) and func.attr == "sent"
    )


def declared_methods(folder: Path = STRATEGIES_DIR, roles: Path = ROLES_DIR) -> dict[str, Declared]:
    """Every method of ``strategies/*.py`` read from the source, without importing it (importing the
    registry loads torch, most of the command's time). A class declares a method with its own
    ``name``; ``traits`` (its ``role``) and ``options_type`` are inherited through the folder's classes
    as Python would (MethodHooks' defaults at the root; ``replace(Parent.traits, ...)`` reads the
    parent's), and an options class's fields through its bases, into the role arguments of
    ``client_app/roles/`` (their ``sent`` fields are no options).
    ``tests/unit/test_method_declarations.py`` checks this equals the imported registry."""
    classes: dict[str, tuple[list[str], dict[str, ast.expr], list[str]]] = {}
    methods: set[str] = set()  # the classes of strategies/ (a role's ``name`` is no method)
    paths = [(p, True) for p in sorted(folder.rglob("*.py"))] + [(p, False) for p in sorted(roles.glob("*.py"))]
    for path, strategy_side in paths:  # the methods and the base (role defaults) below them; the roles
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            attrs: dict[str, ast.expr] = {}
            fields: list[str] = []
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    target, value = stmt.targets[0], stmt.value
                    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                        attrs.update({t.id: v for t, v in zip(target.elts, value.elts) if isinstance(t, ast.Name)})
                    elif isinstance(target, ast.Name):
                        attrs[target.id] = value
                elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    if not _is_sent(stmt.value):
                        fields.append(stmt.target.id)
                    if stmt.value is not None:
                        attrs[stmt.target.id] = stmt.value
            bases = [
                b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases
            ]
            classes[node.name] = (bases, attrs, fields)
            if strategy_side:
                methods.add(node.name)

    def lookup(cls: str, attr: str) -> ast.expr | None:
        if cls not in classes:
            return None
        bases, attrs, _ = classes[cls]
        if attr in attrs:
            return attrs[attr]
        return next((found for b in bases if (found := lookup(b, attr)) is not None), None)

    def option_fields(cls: str) -> list[str]:
        if cls not in classes or cls in ("MethodOptions", "RoleArgs"):
            return []
        bases, _, fields = classes[cls]
        inherited = [f for b in bases for f in option_fields(b)]
        return inherited + [f for f in fields if f not in inherited]

    def role_of(cls: str) -> str:
        traits = lookup(cls, "traits")
        if not isinstance(traits, ast.Call):
            return "?"
        given = next((k.value for k in traits.keywords if k.arg == "role"), None)
        if isinstance(given, ast.Constant):
            return str(given.value)
        parent = traits.args[0] if traits.args else None  # replace(Parent.traits, ...)
        if isinstance(parent, ast.Attribute) and isinstance(parent.value, ast.Name):
            return role_of(parent.value.id)
        default = classes.get("MethodTraits", ([], {}, []))[1].get("role")  # MethodTraits(...) without a role
        return str(default.value) if isinstance(default, ast.Constant) else "?"

    out: dict[str, Declared] = {}
    for cls, (_, attrs, _) in classes.items():
        name = attrs.get("name")
        if (
            cls == "MethodHooks"
            or cls not in methods
            or not (isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value)
        ):
            continue
        options = lookup(cls, "options_type")
        out[name.value] = Declared(
            name.value,
            role_of(cls),
            tuple(option_fields(options.id)) if isinstance(options, ast.Name) else (),
        )
    return out


def options_table(name: str) -> str:
    from pflower.strategies import STRATEGIES

    cls = STRATEGIES[name]
    lines = [
        f"{name}: client role {cls.traits.role}, declared in {cls.options_type.__name__}, docs/{page_of(name)}",
        "",
    ]
    rows = cls.options_type.describe()
    if not rows:
        return "\n".join([*lines, "no options"])
    cols = ("option", "type", "default", "allowed")
    widths = [max(len(c), *(len(r[c]) for r in rows)) for c in cols]
    lines.append("  ".join(c.ljust(w) for c, w in zip(cols, widths)) + "  what it does")
    for r in rows:
        lines.append("  ".join(r[c].ljust(w) for c, w in zip(cols, widths)) + "  " + r["doc"])
    return "\n".join(lines)


# a method page holds its options table between these markers; `pflower methods --write-docs` fills them
BLOCK = "<!-- options:{name} -->\n{table}\n<!-- /options:{name} -->"
DOC_PAGES = {
    "fedcmd": "fedcmd",
    "fedcpmd": "fedcpmd",
    "fedtsdp": "fedtsdp",
    "felo": "felo_velo",
    "velo": "felo_velo",
    "fedhe": "felo_velo",
    "kapc": "kapc",
    "kapc_bls": "kapc",
    "cfl": "cfl",
    "heterofl": "heterofl",
    "fedgkt": "fedgkt",
    "fedmd": "fedmd",
}  # the others: docs/methods/<name>.md where it exists, else the baselines page


def page_of(name: str, docs: Path | None = None) -> str:
    """The docs page of method ``name``, under ``docs`` (default: the checkout's docs/): a shared
    page of :data:`DOC_PAGES`, else ``methods/<name>.md`` where it exists, else the baselines page."""
    import pflower

    if name in DOC_PAGES:
        return f"methods/{DOC_PAGES[name]}.md"
    own = f"methods/{name}.md"
    return own if ((docs or pflower.SOURCE_ROOT / "docs") / own).exists() else "methods/baselines.md"


def options_markdown(name: str) -> str:
    """Method ``name``'s options as a Markdown table, then its mechanism diagnostics (the docs'
    copy of its options dataclass and its ``diagnostic_panels``)."""
    from pflower.strategies import STRATEGIES

    cls = STRATEGIES[name]
    rows = cls.options_type.describe()
    if not rows:
        out = [f"`method={name}` has no options."]
    else:
        out = [f"`method={name}`:", "", "| option | type | default | allowed | what it does |", "|---|---|---|---|---|"]
        for r in rows:
            cells = [
                f"`{r['option']}`",
                r["type"].replace("|", "\\|"),
                f"`{r['default']}`",
                r["allowed"] or "-",
                r["doc"].replace("|", "\\|"),  # "a | b" in a doc line is prose, not a column
            ]
            out.append("| " + " | ".join(c.replace("\n", " ") for c in cells) + " |")
    if cls.traits.diagnostic_panels:
        shown = "; ".join(
            f"`{p.key}` ({p.label}"
            + (f", against `{p.threshold}`" if p.threshold else "")
            + (f" or the logged `{p.threshold_key}`" if p.threshold_key else "")
            + (f", events: `{p.events}`" if p.events else "")
            + ")"
            for p in cls.traits.diagnostic_panels
        )
        out += ["", f"Mechanism diagnostics (`metrics.jsonl`; `pflower report` draws them): {shown}."]
    return "\n".join(out)


# docs/configuration.md lists every method between these markers, from the registry
METHODS_BLOCK = "<!-- methods -->\n{table}\n<!-- /methods -->"


def methods_markdown() -> str:
    """Every registered method as a Markdown table: its ``method=`` value, client role, options and
    page (what `pflower methods` prints), so no hand-kept list can miss one."""
    rows = ["| `method=` | client role | options (`method.<option>=`) | page |", "|---|---|---|---|"]
    for name, method in declared_methods().items():
        options = ", ".join(f"`{o}`" for o in method.options) or "none"
        rows.append(f"| `{name}` | {method.role} | {options} | [{page_of(name)}]({page_of(name)}) |")
    return "\n".join(rows)


def write_docs(docs: Path) -> list[Path]:
    """Fill every method's options block in its page under ``docs`` (a page lacking one gets it
    appended under an "Options" heading) and the list of methods in ``configuration.md``; the
    pages that changed."""
    import re

    from pflower.strategies import STRATEGIES

    changed = []
    listing = docs / "configuration.md"
    if listing.exists():
        text = listing.read_text()
        pattern = re.compile(re.escape("<!-- methods -->") + ".*?" + re.escape("<!-- /methods -->"), re.S)
        new = pattern.sub(lambda _: METHODS_BLOCK.format(table=methods_markdown()), text)
        if new != text:
            listing.write_text(new)
            changed.append(listing)
    for page in sorted({page_of(n, docs) for n in STRATEGIES}):
        path = docs / page
        text = before = path.read_text()
        for name in (n for n in STRATEGIES if page_of(n, docs) == page):
            block = BLOCK.format(name=name, table=options_markdown(name))
            pattern = re.compile(
                re.escape(f"<!-- options:{name} -->") + ".*?" + re.escape(f"<!-- /options:{name} -->"), re.S
            )
            if pattern.search(text):
                text = pattern.sub(lambda _: block, text)
            else:
                heading = (
                    ""
                    if "\n## Options (generated)" in text
                    else "\n## Options (generated)\n\nFrom each method's options dataclass (`pflower methods NAME` "
                    "prints the same); every method's rows on the shared protocols are on the "
                    "[leaderboard](../leaderboard.md).\n"
                )
                text = text.rstrip("\n") + "\n" + heading + "\n" + block + "\n"
        if text != before:
            path.write_text(text)
            changed.append(path)
    return changed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pflower methods", description=__doc__)
    parser.add_argument("names", nargs="*", help="methods to show (none: the list)")
    parser.add_argument(
        "--write-docs",
        metavar="DOCS",
        nargs="?",
        const="docs",
        help="fill the options tables of the method pages under DOCS (default docs/)",
    )
    args = parser.parse_args(argv)
    if not args.names and not args.write_docs:  # the list, read from the source: no torch import
        for name, method in declared_methods().items():
            print(f"{name:<10} role {method.role:<9} options: {', '.join(method.options) or '-'}")
        return 0
    from pflower.strategies import STRATEGIES

    if args.write_docs:
        for path in write_docs(Path(args.write_docs)):
            print(f"wrote {path}")
        return 0
    unknown = [n for n in args.names if n not in STRATEGIES]
    if unknown:
        print(f"pflower methods: unknown method(s) {unknown}; the methods: {', '.join(STRATEGIES)}", file=sys.stderr)
        return 2
    print("\n\n".join(options_table(n) for n in args.names))
    return 0
