"""``flwr`` with a FAB build that does not walk ignored folders.

``flwr run <app>`` builds the app's FAB from every file under the app's folder
(``flwr.cli.utils.collect_files`` visits and resolves each one) before it filters them by
``.gitignore`` and its include patterns. A virtual environment inside the project, as the
README's command makes it, is about 66,000 files: 5.8 s of every ``flwr run .`` went to walking it
(and any ``docs/results`` clutter), measured on this project's 2-core machine.

:func:`collect_app_files` is Flower's walk that does not enter a folder the app's ``.gitignore``
ignores: every file under such a folder is one Flower's own filter drops (git cannot re-include a
file below an ignored folder), so the FAB is byte for byte the one ``flwr`` builds (tested).
``python -m pflower.server_app.flwr_cli <flwr arguments>`` is ``flwr`` with that walk;
``pflower run`` and the end-to-end tests launch runs through it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def ignored_folders(root: Path):
    """A matcher of the folders (relative POSIX paths) ``root/.gitignore`` ignores, or None."""
    import pathspec

    gitignore = root / ".gitignore"
    if not gitignore.is_file():
        return None
    spec = pathspec.PathSpec.from_lines("gitwildmatch", gitignore.read_text(encoding="utf-8").splitlines())
    return lambda folder: spec.match_file(folder + "/")


def collect_app_files(root: Path) -> dict[str, Path]:
    """Flower's ``collect_files`` (relative POSIX path -> absolute path; symlinks and paths that
    resolve outside ``root`` skipped) without entering the folders ``.gitignore`` ignores."""
    resolved_root = root.resolve()
    ignored = ignored_folders(root)
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        if ignored is not None:
            prefix = here.relative_to(root).as_posix()
            prefix = "" if prefix == "." else prefix + "/"
            dirnames[:] = [d for d in dirnames if not ignored(prefix + d)]
        for filename in filenames:
            path = here / filename
            if path.is_symlink() or not path.resolve().is_relative_to(resolved_root):
                continue
            files[path.relative_to(root).as_posix()] = path
    return files


def main(argv: list[str] | None = None) -> int:
    from pflower import compat

    cli = compat.flwr_cli()
    cli.build.collect_files = collect_app_files  # what build_fab_from_disk calls
    sys.argv = ["flwr", *(sys.argv[1:] if argv is None else argv)]
    try:
        cli.app()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
