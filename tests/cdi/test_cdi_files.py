"""CDI spec files: atomic writes, permissions, removal."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from devplug.cdi import CdiDevice, CdiSpec, ContainerEdits, remove_spec, write_spec


def spec(*names: str, env: str = "A=1") -> CdiSpec:
    edits = ContainerEdits(env=(env,))
    return CdiSpec(
        kind="example.com/gpu", devices=tuple(CdiDevice(name=n, container_edits=edits) for n in names)
    )


def test_write_creates_the_directory_and_names_the_file(tmp_path: Path) -> None:
    directory = tmp_path / "run" / "cdi"
    path = write_spec(spec("gpu0", "gpu1"), directory)
    assert path == directory / "example.com-gpu.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert json.loads(path.read_text())["devices"][1]["name"] == "gpu1"
    assert sorted(p.name for p in directory.iterdir()) == ["example.com-gpu.json"]  # no temp file left


def test_rewrite_replaces_the_file_in_one_step(tmp_path: Path) -> None:
    first = write_spec(spec("gpu0"), tmp_path)
    inode = first.stat().st_ino
    with first.open() as reader:  # a runtime holding the old file open keeps reading it whole
        second = write_spec(spec("gpu0", "gpu1"), tmp_path)
        assert json.load(reader)["devices"] == [{"name": "gpu0", "containerEdits": {"env": ["A=1"]}}]
    assert second == first and second.stat().st_ino != inode
    assert len(json.loads(second.read_text())["devices"]) == 2


def test_a_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_spec(spec("gpu0"), tmp_path)
    before = path.read_text()

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space left"):
        write_spec(spec("gpu0", "gpu1"), tmp_path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["example.com-gpu.json"]


def test_remove(tmp_path: Path) -> None:
    write_spec(spec("gpu0"), tmp_path)
    assert remove_spec("example.com/gpu", tmp_path) is True
    assert remove_spec("example.com/gpu", tmp_path) is False
    assert list(tmp_path.iterdir()) == []
