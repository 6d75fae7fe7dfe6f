"""Helpers for tests of the metrics port: a plugin process, HTTP GETs, its JSON log."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process

from tests.support import logged_process, wait_until

ROOT = Path(__file__).resolve().parents[2]
_NVIDIA_ENV = ("MIG_STRATEGY", "CONFIG_FILE", "FAIL_ON_INIT_ERROR", "NVIDIA_DRIVER_ROOT", "DEVPLUG_FAKE_NVML")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _NVIDIA_ENV} | {"PYTHONPATH": str(ROOT)}


@asynccontextmanager
async def plugin(log: Path, module: str, *args: str) -> AsyncIterator[Process]:
    """``python -m module --log-format json args``, its log in ``log``; SIGTERM must end it with 0."""
    async with logged_process(module, args, log, env=env()) as process:
        yield process


async def get(port: int, path: str, *, accept: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """One HTTP GET on 127.0.0.1: (status, headers, body)."""
    head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
    if accept:
        head += f"Accept: {accept}\r\n"
    with anyio.fail_after(5):
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send((head + "\r\n").encode())
            data = b""
            try:
                while True:
                    data += await stream.receive()
            except anyio.EndOfStream:
                pass
    raw_head, _, body = data.partition(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert int(headers["content-length"]) == len(body)
    return int(lines[0].split(" ")[1]), headers, body


async def wait_for_port(port: int, process: Process, log: Path) -> None:
    """Wait until the plugin answers /healthz; fail with its log if it exits first."""

    async def healthy() -> bool:
        assert process.returncode is None, log.read_text()[-3000:]
        try:
            return (await get(port, "/healthz"))[0] == 200
        except OSError:
            return False

    await wait_until(healthy, timeout=15, interval=0.05, what=f"/healthz on port {port}")


def events(log: Path, name: str | None = None) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [e for e in lines if name is None or e["event"] == name]


async def wait_for_event(log: Path, name: str, count: int = 1) -> list[dict[str, Any]]:
    """Wait until the JSON log ``log`` has ``count`` events ``name``; return them all."""

    def seen() -> list[dict[str, Any]] | None:
        found = events(log, name)
        return found if len(found) >= count else None

    return await wait_until(seen, timeout=10, interval=0.05, what=f"{count} x {name} in {log.name}")
