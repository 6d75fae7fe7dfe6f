"""The license and the source distribution: what a user of the package index gets.

The sdist is built by setuptools' own build backend (what ``python -m build --sdist`` calls) from
a copy of the checkout, so that building leaves nothing behind in it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT

PYPROJECT = (ROOT / "pyproject.toml").read_text()


def test_the_license_is_the_apache_license_2_0_in_full() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert re.search(r'^license = "Apache-2.0"$', PYPROJECT, re.MULTILINE)
    assert re.search(r'^license-files = \["LICENSE"\]$', PYPROJECT, re.MULTILINE)
    assert text.split("\n", 3)[1].strip() == "Apache License"
    assert "Version 2.0, January 2004" in text
    for number, title in enumerate(
        (
            "Definitions",
            "Grant of Copyright License",
            "Grant of Patent License",
            "Redistribution",
            "Submission of Contributions",
            "Trademarks",
            "Disclaimer of Warranty",
            "Limitation of Liability",
            "Accepting Warranty or Additional Liability",
        ),
        start=1,
    ):
        assert f"{number}. {title}." in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text


@pytest.fixture(scope="module")
def sdist() -> Iterator[tuple[list[str], str]]:
    """The member names (without the top directory) and PKG-INFO of a freshly built sdist."""
    work = Path(tempfile.mkdtemp(prefix="dps-", dir="/tmp"))
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            check=True,
            capture_output=True,
            cwd=ROOT,
        ).stdout.decode()
        source = work / "src"
        for name in filter(None, listed.split("\0")):
            path = ROOT / name
            if path.is_file():
                (source / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, source / name)
        build = "from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
        result = subprocess.run(
            [sys.executable, "-c", f"import sys; {build}", str(work / "dist")],
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=source,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        archive = work / "dist" / result.stdout.strip().splitlines()[-1]
        with tarfile.open(archive) as tar:
            names = [m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name]
            info = tar.extractfile(f"{archive.name.removesuffix('.tar.gz')}/PKG-INFO")
            assert info is not None
            yield names, info.read().decode()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_sdist_carries_docs_examples_proto_tests_and_the_license(sdist: tuple[list[str], str]) -> None:
    names, info = sdist
    for directory in ("docs/", "examples/", "proto/", "tests/", "deploy/", "scripts/"):
        assert any(n.startswith(directory) for n in names), directory
    assert {"LICENSE", "README.md", "pyproject.toml", "tests/docs/test_readme.py"} <= set(names)
    assert "License-Expression: Apache-2.0" in info
    assert "License-File: LICENSE" in info
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_every_relative_link_of_the_readme_ships(sdist: tuple[list[str], str]) -> None:
    names, _ = sdist
    links = re.findall(r"\]\(([^)#:]+)\)", (ROOT / "README.md").read_text())
    assert links  # the pattern still finds them
    missing = [link for link in links if link not in names]
    assert not missing, f"README.md links to files the sdist lacks: {missing}"
