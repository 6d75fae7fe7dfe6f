"""Durable writes (CDI specs, the DRA checkpoint): whole files, their mode, no leftovers."""

from __future__ import annotations

import os
import stat
import threading
from typing import TYPE_CHECKING

import pytest

from devplug._cdi_files import write_atomically

if TYPE_CHECKING:
    from pathlib import Path


def test_a_file_is_written_and_replaced_whole_with_its_mode(tmp_path: Path) -> None:
    old = os.umask(0o077)  # a restrictive umask must not keep a spec from the runtime
    try:
        write_atomically(tmp_path, "spec.json", b"old", 0o644)
        write_atomically(tmp_path, "spec.json", b"new" * 100_000, 0o644)
    finally:
        os.umask(old)
    path = tmp_path / "spec.json"
    assert path.read_bytes() == b"new" * 100_000
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["spec.json"]


def test_a_missing_directory_is_made(tmp_path: Path) -> None:
    write_atomically(tmp_path / "cdi", "spec.json", b"{}", 0o600)
    assert (tmp_path / "cdi" / "spec.json").read_bytes() == b"{}"
    assert stat.S_IMODE((tmp_path / "cdi" / "spec.json").stat().st_mode) == 0o600


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_atomically(tmp_path, "checkpoint.json", b"old", 0o600)

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(tmp_path, "checkpoint.json", b"new", 0o600)
    assert (tmp_path / "checkpoint.json").read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]


def test_a_symlink_in_place_of_the_temporary_file_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"untouched")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / f".spec.json.{os.getpid()}.{threading.get_ident()}.tmp").symlink_to(elsewhere)
    with pytest.raises(OSError, match="symbolic links"):
        write_atomically(cdi, "spec.json", b"{}", 0o644)
    assert elsewhere.read_bytes() == b"untouched"
    assert not (cdi / "spec.json").exists()
