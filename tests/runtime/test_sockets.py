from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest

from devplug import DevplugError
from devplug._runtime.sockets import claim_path, file_identity, unique_socket_name


def test_unique_names() -> None:
    names = {unique_socket_name("example.com/gpu") for _ in range(200)}
    assert len(names) == 200
    assert all(re.fullmatch(r"example\.com-gpu-[0-9a-f]{8}\.sock", n) for n in names)
    assert re.fullmatch(r"a_b-c-[0-9a-f]{8}\.sock", unique_socket_name("a_b/c"))


def test_claim_free_path(tmp_path: Path) -> None:
    claim_path(tmp_path / "x.sock")  # nothing there: fine


def test_claim_removes_dead_socket(tmp_path: Path) -> None:
    path = tmp_path / "dead.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()  # bound, never listening: a stale socket file
    claim_path(path)
    assert not path.exists()


def test_claim_refuses_live_socket(tmp_path: Path) -> None:
    path = tmp_path / "live.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        s.listen()
        with pytest.raises(DevplugError, match="another process is serving"):
            claim_path(path)
        assert path.exists()


def test_claim_refuses_symlink_and_files(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("keep me")
    link = tmp_path / "link.sock"
    link.symlink_to(target)
    with pytest.raises(DevplugError, match="symlink"):
        claim_path(link)
    with pytest.raises(DevplugError, match="not a socket"):
        claim_path(target)
    assert target.read_text() == "keep me"


def test_claim_refuses_too_long_path(tmp_path: Path) -> None:
    with pytest.raises(DevplugError, match="longer than 107 bytes"):
        claim_path(tmp_path / ("x" * 120))


def test_file_identity_does_not_follow_links(tmp_path: Path) -> None:
    target = tmp_path / "t"
    target.touch()
    link = tmp_path / "l"
    link.symlink_to(target)
    assert file_identity(link) != file_identity(target)
    assert file_identity(tmp_path / "missing") is None
    os.unlink(target)
    assert file_identity(link) is not None
