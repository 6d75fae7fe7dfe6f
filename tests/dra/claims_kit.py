"""A Preparer over an in-memory API server, a checkpoint and a CDI directory in a temporary
directory: the claims tests' world."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from devplug._dra.checkpoint import FILE_NAME, Checkpoint
from devplug._dra.claims import ClaimError, Preparer
from devplug._dra.inventory import Inventory
from devplug.dra import ClaimRef
from tests.support import Widgets

DRIVER = "widget.example.com"
NODE = "node-1"


def claim(
    uid: str, devices: list[tuple[str, str]], *, config: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "namespace": "ns", "name": f"c-{uid}"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": req, "driver": DRIVER, "pool": NODE, "device": dev}
                        for req, dev in devices
                    ],
                    "config": config or [],
                }
            }
        },
    }


class World:
    """``plugin`` (and ``others``: more resources of the driver) behind a Preparer made with
    ``options``; claims are added with :meth:`add`."""

    def __init__(
        self,
        root: Path,
        plugin: Widgets | None = None,
        lock_file: Path | None = None,
        *,
        others: Sequence[Widgets] = (),
        **options: Any,
    ) -> None:
        self.lock_file = lock_file
        self.options = options
        self.plugin = plugin or Widgets()
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        plugins = [self.plugin, *others]
        self.inventory = Inventory(plugins)
        for index, each in enumerate(plugins):
            self.inventory.update(index, each.devices)
        self.cdi = root / "cdi"
        self.checkpoint = Checkpoint(root / FILE_NAME, DRIVER, NODE)
        self.preparer = self.make()

    def make(self) -> Preparer:
        return Preparer(
            driver=DRIVER,
            node=NODE,
            inventory=self.inventory,
            checkpoint=self.checkpoint,
            cdi_dir=self.cdi,
            fetch_claim=self.fetch,
            log=structlog.get_logger("test"),
            lock_file=self.lock_file,
            **self.options,
        )

    async def fetch(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ClaimError(f"claim {namespace}/{name} not found") from None

    def add(self, obj: dict[str, Any]) -> ClaimRef:
        meta = obj["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = obj
        return ClaimRef(meta["namespace"], meta["name"], meta["uid"])
