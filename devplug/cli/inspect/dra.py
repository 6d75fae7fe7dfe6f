"""``devplug inspect`` on a DRA driver's socket: GetInfo, prepare, unprepare, the health stream.

Given the registration socket, it shows GetInfo and the DRAPlugin service a kubelet >= 1.34
would choose (the first of the driver's list it knows) and calls the endpoint GetInfo names;
given the DRA endpoint itself, it uses v1 when served, else v1beta1 (and for ``--watch``
v1.DRAResourceHealth when served, else v1alpha1). Without a call to make it sends an empty
NodePrepareResources (every driver must answer it with an empty map). The answers are shown as
sent, with the kubelet's verdict: an answer the kubelet would fail the pod for is an error
(exit 1).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO

import anyio

from devplug._text import counted
from devplug.cli.inspect.client import InspectError, follow_until_signalled
from devplug.cli.inspect.dra_client import DraConnection, DraTarget
from devplug.cli.inspect.holders import dra_holders, socket_to_read

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    from devplug.models import ClaimRef
    from devplug.testing._kubelet.dra_resource import ClaimResult, HealthReport


def _service(target: DraTarget) -> str:
    from devplug.testing._kubelet.dra_validation import choose_service

    service, problem = choose_service(target.services)
    if service is None:
        raise InspectError(f"{target.path}: the kubelet would refuse this driver: {problem}")
    return service


def _claims_text(claims: list[ClaimRef]) -> str:
    return ", ".join(f"{c}:{c.uid}" for c in claims)


def header(target: DraTarget, service: str | None) -> tuple[list[str], dict[str, Any]]:
    """The lines and the JSON fields that describe the socket."""
    kind = "DRA registration socket" if target.info is not None else "DRA endpoint"
    lines = [f"socket: {target.path} ({kind})"]
    doc: dict[str, Any] = {
        "socket": target.path,
        "kind": "dra-registration" if target.info else "dra-endpoint",
    }
    if target.info is not None:
        info = target.info
        lines.append(
            f"GetInfo: type {info['type']}, name {info['name']}, endpoint {info['endpoint'] or '(empty)'}"
        )
        lines.append(f"supported versions: {', '.join(info['supported_versions']) or '(none)'}")
        doc["info"] = info
    doc["endpoint"] = target.endpoint
    if service is not None:
        chosen = "the first the kubelet knows" if target.info is not None else "the newest served"
        lines.append(f"service: {service} ({chosen})")
        doc["service"] = service
    return lines, doc


def results_text(results: dict[str, ClaimResult], claims: list[ClaimRef]) -> list[str]:
    names = {c.uid: str(c) for c in claims}
    lines: list[str] = []
    for uid, result in results.items():
        who = f"  {uid} {names.get(uid, '(not asked for)')}"
        if result.error:
            lines.append(f"{who}: error: {result.error}")
            continue
        lines.append(f"{who}: {len(result.devices)} device{'' if len(result.devices) == 1 else 's'}")
        for d in result.devices:
            requests = ",".join(d.request_names) or "(all)"
            share = f" share {d.share_id}" if d.share_id else ""
            cdi = ", ".join(d.cdi_device_ids) or "no CDI IDs"
            lines.append(f"    {d.pool}/{d.device} for {requests}{share}: {cdi}")
    return lines or ["  (no entries)"]


def results_json(results: dict[str, ClaimResult]) -> dict[str, Any]:
    return {
        uid: {
            "error": r.error,
            "devices": [
                {
                    "request_names": list(d.request_names),
                    "pool": d.pool,
                    "device": d.device,
                    "cdi_device_ids": list(d.cdi_device_ids),
                    "share_id": d.share_id,
                }
                for d in r.devices
            ],
        }
        for uid, r in results.items()
    }


async def run(target: DraTarget, args: argparse.Namespace, out: TextIO) -> int:
    """Inspect ``target`` as ``args`` ask; the exit status."""
    from devplug.testing._kubelet.dra_validation import check_prepare, check_unprepare

    service = _service(target)
    lines, doc = header(target, service)
    connection = DraConnection(target.endpoint, timeout=args.timeout)
    error: str | None = None
    try:
        if args.watch:
            return await _watch(
                connection,
                target,
                lines=lines,
                doc=doc,
                as_json=args.json,
                out=out,
                pod_resources=socket_to_read(args.pod_resources),
            )
        prepare, unprepare = args.prepare or [], args.unprepare or []
        if not prepare and not unprepare:
            answered = await connection.prepare(service, [])
            doc["empty_prepare"] = results_json(answered)
            entries = counted(len(answered), "entry", "entries") if answered else "{}"
            lines.append(f"empty NodePrepareResources: {entries}")
            if answered:
                error = "an empty NodePrepareResources must get an empty map"
        if prepare:
            results = await connection.prepare(service, prepare)
            problem = check_prepare(prepare, results)
            doc["prepare"] = {
                "claims": [list(c) for c in prepare],
                "results": results_json(results),
                "kubelet_error": problem,
            }
            lines += [f"NodePrepareResources({_claims_text(prepare)}):", *results_text(results, prepare)]
            error = f"the kubelet would fail: {problem}" if problem else None
        if unprepare and error is None:
            errors = await connection.unprepare(service, unprepare)
            problem = check_unprepare(unprepare, errors)
            doc["unprepare"] = {
                "claims": [list(c) for c in unprepare],
                "errors": errors,
                "kubelet_error": problem,
            }
            lines.append(f"NodeUnprepareResources({_claims_text(unprepare)}):")
            names = {c.uid: str(c) for c in unprepare}
            lines += [
                f"  {uid} {names.get(uid, '(not asked for)')}: {e or 'ok'}" for uid, e in errors.items()
            ]
            error = f"the kubelet would fail: {problem}" if problem else None
    except InspectError as exc:
        error = str(exc)
    finally:
        with anyio.CancelScope(shield=True):
            await connection.close()
    if error is not None:
        doc["error"] = error
    print(json.dumps(doc, indent=2) if args.json else "\n".join(lines), file=out, flush=True)
    if error is not None:
        print(f"devplug inspect: {error}", file=sys.stderr)
        return 1
    return 0


async def _watch(
    connection: DraConnection,
    target: DraTarget,
    *,
    lines: list[str],
    doc: dict[str, Any],
    as_json: bool,
    out: TextIO,
    pod_resources: Path | None = None,
) -> int:
    from devplug.testing._kubelet.dra_validation import HEALTH_V1, HEALTH_V1ALPHA1, health_service

    # A registration socket's GetInfo says which the kubelet opens. A bare endpoint advertises
    # nothing: v1 where it is served, else v1alpha1 (the one every kubelet since 1.34 opens).
    if target.info is not None:
        service = health_service(target.services)
    else:
        service = await connection.served_health((HEALTH_V1, HEALTH_V1ALPHA1))
    if service is None:
        print(
            f"devplug inspect: {target.endpoint} advertises no DRAResourceHealth service "
            f"(supported versions: {', '.join(target.services) or 'none'}); the kubelet "
            "watches the health only of plugins that do",
            file=sys.stderr,
        )
        return 1
    doc["health_service"] = service
    print(
        json.dumps({"event": "info", **doc}) if as_json else "\n".join([*lines, f"health: {service}"]),
        file=out,
        flush=True,
    )

    driver = str(target.info["name"]) if target.info is not None and target.info.get("name") else None

    async def follow() -> None:
        seq = 0
        async for reports in connection.health(service):
            seq += 1
            now = datetime.now(timezone.utc)
            holders = await dra_holders(pod_resources, connection.timeout, driver)
            if as_json:
                event = {"event": "health", "seq": seq, "time": now.isoformat().replace("+00:00", "Z")}
                devices = [_report_json(r, holders) for r in reports]
                print(json.dumps({**event, "devices": devices}), file=out, flush=True)
            else:
                stamp = f"{now.astimezone():%H:%M:%S.%f}"[:-3]
                table = _table(reports, holders)
                print(f"{stamp}  message {seq}: {_summary(reports)}\n{table}", file=out, flush=True)

    failure = await follow_until_signalled(follow)
    if failure is not None:
        print(f"devplug inspect: {failure}", file=sys.stderr)
        return 1
    return 0


def _report_json(r: HealthReport, holders: dict[str, str] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "pool": r.pool,
        "device": r.device,
        "health": r.health,
        "last_updated": r.last_updated,
        "timeout_seconds": r.timeout_seconds,
        "message": r.message,
    }
    if holders is not None:
        doc["holder"] = holders.get(f"{r.pool}/{r.device}")
    return doc


def _summary(reports: tuple[HealthReport, ...]) -> str:
    counts = {h: sum(r.health == h for r in reports) for h in ("Healthy", "Unhealthy", "Unknown")}
    health = ", ".join(f"{n} {h.lower()}" for h, n in counts.items() if n)
    return counted(len(reports), "device") + (f", {health}" if health else "")


def _table(reports: tuple[HealthReport, ...], holders: dict[str, str] | None = None) -> str:
    if not reports:
        return "  (no devices)"
    rows = [("DEVICE", "HEALTH", "TIMEOUT", *(("HOLDER",) if holders is not None else ()), "MESSAGE")]
    for r in reports:
        name = f"{r.pool}/{r.device}"
        timeout = f"{r.timeout_seconds}s" if r.timeout_seconds > 0 else "30s"
        holder = (holders.get(name, "-"),) if holders is not None else ()
        rows.append((name, r.health, timeout, *holder, r.message))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        ("  " + "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]])).rstrip()
        for row in rows
    )
