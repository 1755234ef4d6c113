"""``pflower methods [NAME ...]``: every method with its client role and options, or one
method's options as a table (type, default, what is allowed, what it does), read from the
method's options dataclass, the one place they are declared."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def options_table(name: str) -> str:
    from strategies import STRATEGIES

    cls = STRATEGIES[name]
    lines = [f"{name}: client role {cls.role}, defaults in conf/method/{name}.yaml, docs/methods/", ""]
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
DOC_PAGES = {"fedcmd": "fedcmd", "fedcpmd": "fedcpmd", "fedtsdp": "fedtsdp", "felo": "felo_velo", "velo": "felo_velo",
             "fedhe": "felo_velo", "kapc": "kapc", "kapc_bls": "kapc", "cfl": "cfl"}  # the others: baselines


def page_of(name: str) -> str:
    return f"methods/{DOC_PAGES.get(name, 'baselines')}.md"


def options_markdown(name: str) -> str:
    """Method ``name``'s options as a Markdown table, then its mechanism diagnostics (the docs'
    copy of its options dataclass and its ``diagnostic_panels``)."""
    from strategies import STRATEGIES

    cls = STRATEGIES[name]
    rows = cls.options_type.describe()
    if not rows:
        out = [f"`method={name}` has no options."]
    else:
        out = [f"`method={name}`:", "", "| option | type | default | allowed | what it does |", "|---|---|---|---|---|"]
        for r in rows:
            cells = [f"`{r['option']}`", r["type"].replace("|", "\\|"), f"`{r['default']}`", r["allowed"] or "-", r["doc"]]
            out.append("| " + " | ".join(c.replace("\n", " ") for c in cells) + " |")
    if cls.diagnostic_panels:
        shown = "; ".join(
            f"`{p.key}` ({p.label}"
            + (f", against `{p.threshold}`" if p.threshold else "")
            + (f" or the logged `{p.threshold_key}`" if p.threshold_key else "")
            + (f", events: `{p.events}`" if p.events else "") + ")"
            for p in cls.diagnostic_panels
        )
        out += ["", f"Mechanism diagnostics (`metrics.jsonl`; `pflower report` draws them): {shown}."]
    return "\n".join(out)


def write_docs(docs: Path) -> list[Path]:
    """Fill every method's options block in its page under ``docs`` (a page lacking one gets it
    appended under an "Options" heading); the pages that changed."""
    import re

    from strategies import STRATEGIES

    changed = []
    for page in sorted({page_of(n) for n in STRATEGIES}):
        path = docs / page
        text = before = path.read_text()
        for name in (n for n in STRATEGIES if page_of(n) == page):
            block = BLOCK.format(name=name, table=options_markdown(name))
            pattern = re.compile(re.escape(f"<!-- options:{name} -->") + ".*?" + re.escape(f"<!-- /options:{name} -->"), re.S)
            if pattern.search(text):
                text = pattern.sub(lambda _: block, text)
            else:
                heading = "" if "\n## Options (generated)" in text else "\n## Options (generated)\n\nFrom each method's options dataclass (`pflower methods NAME` prints the same); every method's rows on the shared protocols are on the [leaderboard](../leaderboard.md).\n"
                text = text.rstrip("\n") + "\n" + heading + "\n" + block + "\n"
        if text != before:
            path.write_text(text)
            changed.append(path)
    return changed


def main(argv: list[str]) -> int:
    from strategies import STRATEGIES

    parser = argparse.ArgumentParser(prog="pflower methods", description=__doc__)
    parser.add_argument("names", nargs="*", help="methods to show (none: the list)")
    parser.add_argument("--write-docs", metavar="DOCS", nargs="?", const="docs",
                        help="fill the options tables of the method pages under DOCS (default docs/)")
    args = parser.parse_args(argv)
    if args.write_docs:
        for path in write_docs(Path(args.write_docs)):
            print(f"wrote {path}")
        return 0
    unknown = [n for n in args.names if n not in STRATEGIES]
    if unknown:
        print(f"pflower methods: unknown method(s) {unknown}; the methods: {', '.join(STRATEGIES)}", file=sys.stderr)
        return 2
    if not args.names:
        for name, cls in STRATEGIES.items():
            print(f"{name:<10} role {cls.role:<9} options: {', '.join(cls.options_type.names()) or '-'}")
        return 0
    print("\n\n".join(options_table(n) for n in args.names))
    return 0
