"""devplug._text: counts with their nouns, system errors as sentences, rounded durations; and the
messages that use them."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from devplug._text import counted, os_error_text, rounded
from devplug.testing._conformance.judges import preferred_problem


@pytest.mark.parametrize(
    ("count", "noun", "plural", "text"),
    [
        (1, "slice", None, "1 slice"),
        (0, "slice", None, "0 slices"),
        (2, "slice", None, "2 slices"),
        (1, "entry", "entries", "1 entry"),
        (3, "entry", "entries", "3 entries"),
    ],
)
def test_counted(count: int, noun: str, plural: str | None, text: str) -> None:
    assert counted(count, noun, plural) == text


def test_a_count_in_a_conformance_message_agrees_with_its_noun() -> None:
    assert preferred_problem(["a"], ["a", "b"], [], 2) == "1 device instead of 2"


def test_os_errors_read_as_sentences(tmp_path: Path) -> None:
    with pytest.raises(FileExistsError) as exists:
        os.mkdir(tmp_path)
    assert os_error_text(exists.value, "create the CDI directory") == (
        f"cannot create the CDI directory {tmp_path}: it exists"
    )
    assert os_error_text(exists.value) == f"{tmp_path}: it exists"
    with pytest.raises(FileNotFoundError) as missing:
        (tmp_path / "no" / "file").read_text()
    assert os_error_text(missing.value) == f"{tmp_path}/no/file: no such file or directory"
    # The path is not said twice when the action names it.
    denied = PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/var/run/cdi")
    assert os_error_text(denied, "write to /var/run/cdi") == "cannot write to /var/run/cdi: permission denied"
    # Other errors keep the system's words, starting lower case; no "[Errno N]" either way.
    busy = OSError(errno.EBUSY, os.strerror(errno.EBUSY), "/dev/x")
    assert os_error_text(busy) == "/dev/x: device or resource busy"
    assert os_error_text(OSError("the socket went away")) == "the socket went away"


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.123456789, 0.123),
        (12.3456, 12.3),
        (1234.56, 1235.0),
        (0.000123456, 0.000123),
        (1e-9, 0.0),
        (0.0, 0.0),
    ],
)
def test_rounded(seconds: float, shown: float) -> None:
    assert rounded(seconds) == shown
