"""How ``devplug inspect`` shows what a plugin said: text for people, JSON for programs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from devplug.cli.inspect.client import SeenDevice
    from devplug.models import PluginOptions

_EXACT = ("Healthy", "Unhealthy")


def options_json(options: PluginOptions) -> dict[str, bool]:
    return {
        "pre_start_required": options.pre_start_required,
        "get_preferred_allocation_available": options.get_preferred_allocation_available,
    }


def devices_json(
    devices: Sequence[SeenDevice], holders: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Devices as sent; ``healthy`` is the kubelet's reading of ``health``; with ``holders``
    (from pod-resources), ``holder``: the pod holding it, None when free."""
    out = []
    for d in devices:
        doc: dict[str, Any] = {
            "id": d.id,
            "health": d.health,
            "healthy": d.healthy,
            "numa_nodes": list(d.numa_nodes),
        }
        if holders is not None:
            doc["holder"] = holders.get(d.id)
        out.append(doc)
    return out


def options_text(options: PluginOptions) -> str:
    flags = options_json(options)
    return "options: " + ", ".join(f"{name}={'yes' if value else 'no'}" for name, value in flags.items())


def summary(devices: Sequence[SeenDevice]) -> str:
    healthy = sum(d.healthy for d in devices)
    return f"{len(devices)} device{'' if len(devices) == 1 else 's'}, {healthy} healthy"


def table(devices: Sequence[SeenDevice], indent: str = "  ", holders: Mapping[str, str] | None = None) -> str:
    """The device table: health as sent, quoted with a note when it is not an exact kubelet
    string; with ``holders`` (from pod-resources) a HOLDER column, ``-`` for a free device."""
    if not devices:
        return f"{indent}(no devices)"
    rows = [("ID", "HEALTH", "NUMA", *(("HOLDER",) if holders is not None else ()))]
    odd = False
    for d in devices:
        health = d.health
        if health not in _EXACT:
            # The kubelet compares case-sensitively: "healthy" or "" counts as unhealthy.
            health = f"{health!r} (not exact: unhealthy to the kubelet)"
            odd = True
        row = (d.id, health, ",".join(map(str, d.numa_nodes)) or "-")
        rows.append((*row, holders.get(d.id, "-")) if holders is not None else row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        indent + "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip()
        for r in rows
    ]
    if odd:
        lines.append(f'{indent}only "Healthy" and "Unhealthy" are valid health strings')
    return "\n".join(lines)


def changes(before: Sequence[SeenDevice], after: Sequence[SeenDevice]) -> str:
    """What one message changed against the one before, in a few words ("" when nothing did)."""
    old = {d.id: d for d in before}
    new = {d.id: d for d in after}
    parts = [f"+{i}" for i in new if i not in old] + [f"-{i}" for i in old if i not in new]
    parts += [
        f"{i} {old[i].health}->{d.health}" for i, d in new.items() if i in old and old[i].health != d.health
    ]
    parts += [f"{i} NUMA changed" for i, d in new.items() if i in old and old[i].numa_nodes != d.numa_nodes]
    if len(parts) > 6:
        parts = [*parts[:6], f"and {len(parts) - 6} more"]
    return ", ".join(parts)


def allocation_text(responses: Sequence[dict[str, Any]]) -> list[str]:
    """One line per item of every container response, indented."""
    if not responses:
        return ["  no container response (the kubelet would fail the pod)"]
    lines: list[str] = []
    for n, response in enumerate(responses):
        if len(responses) > 1:
            note = " (the kubelet uses only the first)" if n == 0 else ""
            lines.append(f"  container response {n + 1}{note}:")
        lines += [f"  env     {k}={v}" for k, v in sorted(response["envs"].items())]
        lines += [
            f"  device  {d['host_path']} -> {d['container_path']} ({d['permissions'] or 'no permissions'})"
            for d in response["devices"]
        ]
        lines += [
            f"  mount   {m['host_path']} -> {m['container_path']} ({'ro' if m['read_only'] else 'rw'})"
            for m in response["mounts"]
        ]
        lines += [f"  annot   {k}={v}" for k, v in sorted(response["annotations"].items())]
        lines += [f"  cdi     {name}" for name in response["cdi_devices"]]
        if len(lines) == 0 or lines[-1].endswith(":"):
            lines.append("  (empty response)")
    return lines
