"""What a CDI spec directory holds, for the DRA conformance checks: kinds and device names per file.

Spec files are read as the container runtimes read them (YAML or JSON, ``.yaml``/``.yml``/``.json``);
unreadable files are skipped, as the runtimes skip them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from pathlib import Path


def read_specs(directory: Path) -> dict[str, set[str]]:
    """The CDI kinds defined in ``directory``'s spec files (YAML or JSON) and their device names."""
    specs: dict[str, set[str]] = {}
    for _, doc in _spec_files(directory):
        specs.setdefault(doc["kind"], set()).update(d.get("name", "") for d in doc.get("devices") or [])
    return specs


def remove_specs(directory: Path, ids: set[str]) -> list[Path]:
    """Delete the spec files that define any of the fully qualified CDI ``ids``; the files deleted."""
    removed = []
    for path, doc in _spec_files(directory):
        if any(f"{doc['kind']}={d.get('name')}" in ids for d in doc.get("devices") or []):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _spec_files(directory: Path) -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        if path.suffix not in (".yaml", ".yml", ".json") or not path.is_file():
            continue
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("kind"), str):
            found.append((path, doc))
    return found
