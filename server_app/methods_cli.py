"""``pflower methods [NAME ...]``: every method with its client role and options, or one
method's options as a table (type, default, what is allowed, what it does), read from the
method's options dataclass, the one place they are declared."""

from __future__ import annotations

import argparse
import sys


def options_table(name: str) -> str:
    from strategies import STRATEGIES

    cls = STRATEGIES[name]
    lines = [f"{name}: client role {cls.role}, defaults in conf/method/{name}.yaml, docs/methods/", ""]
    rows = cls.options_type.describe()
    if not rows:
        return "\n".join([*lines, "no options"])
    head = ("option", "type", "default", "allowed")
    widths = [max(len(h), *(len(r[k]) for r in rows)) for h, k in zip(head, ("option", "type", "default", "allowed"))]
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)) + "  what it does")
    for r in rows:
        lines.append("  ".join(r[k].ljust(w) for k, w in zip(("option", "type", "default", "allowed"), widths)) + "  " + r["doc"])
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from strategies import STRATEGIES

    parser = argparse.ArgumentParser(prog="pflower methods", description=__doc__)
    parser.add_argument("names", nargs="*", help="methods to show (none: the list)")
    args = parser.parse_args(argv)
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
