"""devplug.logging.configure: what a rendered log line looks like."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
import structlog

from devplug.logging import configure


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    configure("json", "debug", stream=out)
    yield out
    structlog.reset_defaults()


def test_numbers_in_log_lines_are_rounded(stream: io.StringIO) -> None:
    structlog.get_logger("t").info(
        "resource_failed",
        retry_in=0.123456789,
        seconds=12.3456,
        tiny=0.000123456,
        count=7,
        delays=[1.0444444, 2],
    )
    line = json.loads(stream.getvalue())
    assert (line["retry_in"], line["seconds"], line["tiny"]) == (0.123, 12.3, 0.000123)
    assert (line["count"], line["delays"]) == (7, [1.04, 2])


def test_the_console_renderer_rounds_too() -> None:
    out = io.StringIO()
    configure("console", stream=out)
    try:
        structlog.get_logger("t").warning("slow", seconds=1.23456789)
    finally:
        structlog.reset_defaults()
    assert "seconds=1.23" in out.getvalue() and "1.234" not in out.getvalue()
