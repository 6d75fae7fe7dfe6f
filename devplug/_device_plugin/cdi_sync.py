"""Keeps a plugin's CDI spec file in step with its device set.

The resource runner calls :meth:`CdiSync.update` with each new device set *before* publishing
it, so the spec is on disk before the kubelet can hand out (and the runtime resolve) a device
that is new in it. Writing happens in a worker thread: an fsync must not stall the event loop
that answers every resource's RPCs.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import anyio

from devplug._runtime.sockets import file_identity
from devplug._text import os_error_text

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from devplug.models import Device
    from devplug.plugin import DevicePlugin


class CdiSync:
    """The spec file of one plugin: what was last written, and where."""

    def __init__(self, plugin: DevicePlugin, directory: Path, log: Any) -> None:
        self._plugin = plugin
        self._directory = directory
        self._log = log
        # (path, text, identity) of the file last written: unchanged content is not rewritten,
        # and removal leaves alone a file that someone else has replaced since.
        self._written: tuple[Path, str, tuple[int, int, int] | None] | None = None

    async def update(self, devices: Sequence[Device]) -> None:
        """Ask the plugin for the spec of ``devices`` and write it if it changed; never raises."""
        try:
            spec = self._plugin.cdi_spec(devices)
            if spec is None:
                return
            # Imported here, not at start-up: only a plugin that returns a spec has built one.
            from devplug.cdi import CdiSpec, write_spec

            if not isinstance(spec, CdiSpec):
                raise TypeError(
                    f"cdi_spec must return a devplug.cdi.CdiSpec or None, not {type(spec).__name__}"
                )
            text = spec.to_json()
        except Exception as exc:
            self._log.exception("cdi_spec_failed", error=str(exc))
            return
        path = self._directory / spec.file_name
        if self._written is not None and self._written[:2] == (path, text):
            return
        try:
            await anyio.to_thread.run_sync(write_spec, spec, self._directory)
        except OSError as exc:
            self._log.error("cdi_spec_write_failed", path=str(path), error=os_error_text(exc))
            return
        previous, self._written = self._written, (path, text, file_identity(path))
        if previous is not None and previous[0] != path:
            self._remove(previous)  # the kind changed: the old file describes nothing served
        self._log.info(
            "cdi_spec_written",
            path=str(path),
            devices=len(spec.devices),
            cdi_version=spec.cdi_version or spec.required_version(),
        )

    def remove(self) -> None:
        """Remove the file last written, unless it has been replaced since; never raises."""
        written, self._written = self._written, None
        if written is not None:
            self._remove(written)

    def _remove(self, written: tuple[Path, str, tuple[int, int, int] | None]) -> None:
        path, _, identity = written
        if file_identity(path) != identity:
            return  # gone, or rewritten by a newer instance of this resource
        with contextlib.suppress(FileNotFoundError):
            try:
                path.unlink()
            except OSError as exc:
                self._log.warning("cdi_spec_remove_failed", path=str(path), error=os_error_text(exc))
                return
        self._log.info("cdi_spec_removed", path=str(path))
