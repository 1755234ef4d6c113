"""The documentation: the MkDocs site builds with --strict (a link to a missing page or anchor
fails), and the README stays a five-minute read whose links all resolve."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_the_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is in the test extra: pip install -e '.[test]'")
    pytest.importorskip("material", reason="mkdocs-material is in the test extra: pip install -e '.[test]'")
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (tmp_path / "site" / "methods" / "fedcmd" / "index.html").exists()


def test_the_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 250
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not link.startswith(("http://", "https://", "mailto:"))]
    assert local and all((ROOT / link).exists() for link in local), [
        link for link in local if not (ROOT / link).exists()
    ]
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").glob("*.md"):  # every top-level page is reachable from the site's navigation
        assert page.name in nav, page.name


# a reproduction page docs/results/<prefix>_*.md belongs to the method page of its prefix
REPRODUCTION_PAGES = {
    "fedcmd": "fedcmd",
    "fedcpmd": "fedcpmd",
    "fedtsdp": "fedtsdp",
    "felo": "felo_velo",
    "kapc": "kapc",
    "baselines": "baselines",
}


def test_every_reproduction_page_is_linked_from_its_method_page():
    docs = Path(__file__).resolve().parents[2] / "docs"
    pages = sorted((docs / "results").glob("*.md"))
    assert pages
    for page in pages:
        prefix = page.stem.split("_", 1)[0]
        if prefix not in REPRODUCTION_PAGES:
            continue
        method_page = docs / "methods" / f"{REPRODUCTION_PAGES[prefix]}.md"
        assert f"../results/{page.name}" in method_page.read_text(), f"{method_page.name} does not link {page.name}"
