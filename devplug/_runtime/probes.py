"""The metrics and probes port: a small HTTP/1.1 server on the runner's own event loop.

It runs on the loop it reports on, so ``/healthz`` answering *is* the check that the loop is
alive, and every answer reads the runner's state without locks. One request per connection
(``Connection: close``): probes and scrapers need nothing more.
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING

import anyio
import structlog
from anyio.abc import SocketAttribute

from devplug.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from anyio.abc import Listener, SocketStream
    from prometheus_client.registry import Collector

    from devplug._runtime.exposition import Observed


log = structlog.get_logger("devplug.probes")

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}
_TEXT = "text/plain; charset=utf-8"
_MAX_HEAD = 16 * 1024
_READ_TIMEOUT = 10.0


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (every interface) or ``[IPv6]:PORT``.

    Raises:
        ConfigError: not of that form.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"invalid setting --metrics-address: expected HOST:PORT (got {address!r})")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 - ":PORT" asks for every interface
    return host, int(port)


class ProbeServer:
    """Serves /metrics, /healthz, /readyz and /debug/state for one runner."""

    def __init__(self, runner: Observed, address: str, collectors: Sequence[Collector] = ()) -> None:
        """``collectors``: more prometheus-client collectors for ``/metrics`` (a DRA driver's)."""
        from devplug._runtime.exposition import registry_for

        self._runner = runner
        self._host, self._port = parse_address(address)
        self._registry = registry_for(runner, collectors)
        self.port: int | None = None
        """The port bound (useful with port 0)."""
        self._listener: Listener[SocketStream] | None = None
        self._routes: dict[str, Callable[[dict[str, str]], tuple[int, str, bytes]]] = {
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/debug/state": self._debug_state,
            "/metrics": self._metrics,
        }

    async def bind(self) -> None:
        """Open the listening socket (before anything is served: a taken port fails the start).

        Raises:
            ConfigError: the address cannot be bound (taken, not local), with the OS's reason.
        """
        try:
            self._listener = await anyio.create_tcp_listener(local_host=self._host, local_port=self._port)
        except OSError as exc:
            raise ConfigError(
                f"invalid setting --metrics-address: cannot listen on {self._host}:{self._port}: "
                f"{exc.strerror or exc}"
            ) from None
        self.port = self._listener.extra(SocketAttribute.local_port)  # noqa: S610 - anyio, not Django
        log.info("metrics_serving", address=f"{self._host}:{self.port}")

    async def serve(self) -> None:
        """Answer requests until cancelled (after :meth:`bind`)."""
        assert self._listener is not None, "bind() first"
        await self._listener.serve(self._handle)

    async def aclose(self) -> None:
        if self._listener is not None:
            await self._listener.aclose()
            self._listener = None

    async def _handle(self, stream: SocketStream) -> None:
        async with stream:
            try:
                with anyio.fail_after(_READ_TIMEOUT):
                    head = await _read_head(stream)
            except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, ValueError):
                return
            status, content_type, body = self._answer(head)
            response = (
                f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
                f"Content-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            ).encode()
            method = head.split(b" ", 1)[0]
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await stream.send(response if method == b"HEAD" else response + body)

    def _answer(self, head: bytes) -> tuple[int, str, bytes]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            return 400, _TEXT, b"bad request\n"
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return 405, _TEXT, b"only GET and HEAD\n"
        headers = {
            key.strip().lower(): value.strip()
            for key, sep, value in (line.partition(":") for line in lines[1:])
            if sep
        }
        route = self._routes.get(target.split("?", 1)[0])
        if route is None:
            return 404, _TEXT, b"not found: try /metrics, /healthz, /readyz or /debug/state\n"
        return route(headers)

    def _healthz(self, headers: dict[str, str]) -> tuple[int, str, bytes]:
        return 200, _TEXT, b"ok\n"

    def _readyz(self, headers: dict[str, str]) -> tuple[int, str, bytes]:
        ready, reasons = self._runner.readiness()
        if ready:
            return 200, _TEXT, b"ready\n"
        return 503, _TEXT, ("not ready:\n" + "".join(f"- {r}\n" for r in reasons)).encode()

    def _debug_state(self, headers: dict[str, str]) -> tuple[int, str, bytes]:
        text = json.dumps(self._runner.debug_state(), indent=2, sort_keys=True)
        return 200, "application/json", text.encode() + b"\n"

    def _metrics(self, headers: dict[str, str]) -> tuple[int, str, bytes]:
        from devplug._runtime.exposition import render

        body, content_type = render(self._registry, headers.get("accept", ""))
        return 200, content_type, body


async def _read_head(stream: SocketStream) -> bytes:
    """The request line and headers (a body, which GET has not, is not read)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive()
        if len(data) > _MAX_HEAD:
            raise ValueError("request head too large")
    return data.split(b"\r\n\r\n", 1)[0]
