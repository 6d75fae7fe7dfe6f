"""The Kubernetes release DRA needs is the same wherever a user reads it: ``--help``, the README,
the guides, and the oldest release the real-node suite ran on (docs/compatibility.md)."""

from __future__ import annotations

import re

from tests.docs.blocks import BIN, ROOT, help_text

# A sentence that speaks of DRA as a whole (not of one of its later features) and a release.
_DRA = re.compile(r"Dynamic Resource Allocation|resource\.k8s\.io/v1\b")
_RELEASE = re.compile(r"Kubernetes (?:>= ?|≥ ?)?v?(1\.\d+)")


def dra_releases(text: str) -> set[str]:
    """The releases named in the sentences of ``text`` that name DRA itself."""
    sentences = re.split(r"(?<=[.])\s+(?=[A-Z`(])", re.sub(r"\s+", " ", text))
    return {release for s in sentences if _DRA.search(s) for release in _RELEASE.findall(s)}


def test_dra_needs_the_same_release_everywhere() -> None:
    tested = re.findall(r"\| v(1\.\d+)\.\d+ ", (ROOT / "docs" / "compatibility.md").read_text())
    oldest = min(tested, key=lambda v: tuple(map(int, v.split("."))))
    sources = {
        "devplug run --help": help_text([str(BIN / "devplug"), "run"]),
        "README.md": (ROOT / "README.md").read_text(),
        **{f"docs/{p.name}": p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))},
    }
    said = {name: dra_releases(text) for name, text in sources.items()}
    for name in ("devplug run --help", "README.md", "docs/author-guide.md", "docs/operator-guide.md"):
        assert said[name], f"{name} does not say which Kubernetes DRA needs"
    wrong = {name: releases for name, releases in said.items() if releases - {oldest}}
    assert not wrong, f"DRA needs Kubernetes {oldest} (the oldest tested), but: {wrong}"
