"""``devplug inspect SOCKET``: talk to any device plugin or DRA driver socket as the kubelet would.

Asks GetDevicePluginOptions, opens ListAndWatch and shows the first list (or, with ``--watch``,
every list until Ctrl-C / SIGTERM), then makes the calls asked for in the kubelet's order:
GetPreferredAllocation (admission), Allocate (admission), PreStartContainer (container start).
A DRA driver's registration socket or DRA socket is recognised and inspected instead
(:mod:`devplug.cli.inspect.dra`): GetInfo, ``--prepare``/``--unprepare``, ``--watch`` for health.
Exit status: 0 when everything answered, 1 when the socket or a call failed (one line on
stderr), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO

import anyio

from devplug.cli._argtypes import positive_seconds
from devplug.cli.inspect import render
from devplug.cli.inspect.client import (
    InspectError,
    PluginConnection,
    SeenDevice,
    check_socket,
    follow_until_signalled,
)
from devplug.cli.inspect.dra_client import detect
from devplug.cli.inspect.holders import DEFAULT_SOCKET, plugin_holders, socket_to_read
from devplug.logging import configure as configure_logging

if TYPE_CHECKING:
    from devplug.models import ClaimRef, PluginOptions


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``inspect`` sub-command to ``sub`` (argparse's sub-parsers) and return its parser."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "inspect",
        help="talk to a device plugin or DRA driver socket as the kubelet would",
        description=(
            "Talk to any device plugin socket, or a DRA driver's registration or DRA socket, as the "
            "kubelet would."
        ),
    )
    # One or more: a shell glob that matches several sockets gets a line naming them, not
    # argparse's "unrecognized arguments" for the second.
    parser.add_argument(
        "socket", metavar="SOCKET", nargs="+", help="the plugin's unix socket (a glob matching one is fine)"
    )
    parser.add_argument(
        "--watch",
        action="store_true",
        help="follow ListAndWatch (DRA: the health stream) until Ctrl-C / SIGTERM",
    )
    parser.add_argument(
        "--allocate", metavar="IDS", type=_ids, help="Allocate these devices to one container"
    )
    parser.add_argument(
        "--preferred",
        metavar="AVAILABLE",
        type=_ids,
        help="GetPreferredAllocation from these available devices",
    )
    parser.add_argument(
        "--must-include", metavar="IDS", type=_ids, default=[], help="devices the choice must include"
    )
    parser.add_argument("--size", metavar="N", type=int, help="devices to choose in all (default: 1)")
    parser.add_argument("--pre-start", metavar="IDS", type=_ids, help="PreStartContainer with these devices")
    parser.add_argument(
        "--prepare",
        metavar="NAMESPACE/NAME:UID",
        type=_claim,
        action="append",
        help="DRA: NodePrepareResources for this claim (repeat for more claims in one call)",
    )
    parser.add_argument(
        "--unprepare",
        metavar="NAMESPACE/NAME:UID",
        type=_claim,
        action="append",
        help="DRA: NodeUnprepareResources for this claim (after --prepare's call when both are given)",
    )
    parser.add_argument(
        "--pod-resources",
        metavar="SOCKET",
        help=(
            "the kubelet's pod-resources socket: adds a HOLDER column, the pod holding each device "
            f"(default: {DEFAULT_SOCKET} where it exists)"
        ),
    )
    parser.add_argument("--json", action="store_true", help="one JSON document (JSON lines with --watch)")
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=positive_seconds,
        default=5.0,
        help="deadline of each call (default: 5)",
    )
    return parser


def _ids(text: str) -> list[str]:
    ids = [part.strip() for part in text.split(",")]
    if not all(ids):
        raise argparse.ArgumentTypeError(f"expected comma-separated device IDs, got {text!r}")
    return ids


def _claim(text: str) -> ClaimRef:
    from devplug.models import ClaimRef

    namespace, _, rest = text.partition("/")
    name, _, uid = rest.rpartition(":")
    if not namespace or not name or not uid:
        raise argparse.ArgumentTypeError(f"expected NAMESPACE/NAME:UID, got {text!r}")
    return ClaimRef(namespace, name, uid)


def _one_socket(given: list[str], parser: argparse.ArgumentParser) -> str:
    """The one socket meant: ``given`` as the shell expanded it, or a quoted glob expanded here.

    Raises:
        SystemExit: status 2 when the paths (or the glob) name more than one (via ``parser.error``).
    """
    paths = given
    if len(given) == 1 and not os.path.lexists(given[0]) and glob.has_magic(given[0]):
        paths = sorted(glob.glob(given[0])) or given
    if len(paths) > 1:
        which = (
            f"{given[0]} matches {len(paths)} paths"
            if paths is not given
            else f"{len(paths)} paths given (a glob that matched more than one?)"
        )
        parser.error(f"SOCKET: {which}: {', '.join(paths)}; inspect one at a time")
    return paths[0]


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    # The kubelet's own rules for these requests: what it would never send is a usage error.
    calls = args.allocate or args.preferred or args.pre_start
    dra_calls = args.prepare or args.unprepare
    if calls and dra_calls:
        parser.error("--prepare and --unprepare (DRA) cannot be combined with device-plugin calls")
    if args.watch and (calls or dra_calls):
        parser.error(
            "--watch cannot be combined with --allocate, --preferred, --pre-start or --prepare/--unprepare"
        )
    if args.pod_resources is not None and not os.path.exists(args.pod_resources):
        parser.error(
            f"--pod-resources {args.pod_resources}: no such file (the kubelet's is {DEFAULT_SOCKET})"
        )
    if args.preferred is None:
        if args.must_include or args.size is not None:
            parser.error("--must-include and --size go with --preferred")
        return
    if args.size is None:
        args.size = max(1, len(args.must_include))
    missing = [i for i in args.must_include if i not in args.preferred]
    if missing:
        parser.error(f"--must-include devices must be among --preferred's: {', '.join(missing)}")
    if not len(args.must_include) <= args.size <= len(args.preferred) or args.size < 1:
        parser.error(
            f"--size must be at least 1 and the number of --must-include devices, and at most the "
            f"{len(args.preferred)} available (got {args.size})"
        )


def main(args: argparse.Namespace, parser: argparse.ArgumentParser, out: TextIO | None = None) -> int:
    """Run ``devplug inspect`` with parsed ``args``; returns the exit status.

    Raises:
        SystemExit: status 2 for arguments the kubelet's rules forbid or more than one socket
            (via ``parser.error``); status 130 for Ctrl-C or SIGTERM before ``--watch`` follows
            its stream (with one line on stderr).
    """
    from devplug._runtime.signals import run_async

    args.socket = _one_socket(args.socket, parser)
    _check(args, parser)
    stream = out or sys.stdout
    # Only warnings from the kit's clients and the signal handling, on stderr, not the report.
    configure_logging("console", "warning", stream=sys.stderr)
    status: list[int] = []

    async def inspecting() -> None:
        status.append(await _inspect(args, stream))

    try:
        run_async(inspecting)
    except InspectError as exc:
        print(f"devplug inspect: {exc}", file=sys.stderr)
        return 1
    return status[0]


async def _inspect(args: argparse.Namespace, out: TextIO) -> int:
    path = check_socket(args.socket)
    target = await detect(path, timeout=args.timeout)
    if target is not None:
        if args.allocate or args.preferred or args.pre_start:
            calls = "--allocate, --preferred and --pre-start"
            raise InspectError(f"{path}: a DRA driver's socket; {calls} are device-plugin calls")
        from devplug.cli.inspect import dra as _inspect_dra

        return await _inspect_dra.run(target, args, out)
    if args.prepare or args.unprepare:
        raise InspectError(
            f"{path}: not a DRA driver's socket: --prepare and --unprepare are for DRA drivers"
        )
    connection = PluginConnection(path, timeout=args.timeout)
    try:
        options = await connection.options()
        if args.watch:
            return await _watch(connection, options, args, out)
        devices = await connection.next_list(within=args.timeout)
        if devices is None:
            raise InspectError(
                f"{path}: no ListAndWatch message within {args.timeout:g} s "
                "(the kubelet shows no capacity until the first list)"
            )
        return await _once(connection, options, devices, args, out)
    finally:
        with anyio.CancelScope(shield=True):
            await connection.close()


async def _once(
    connection: PluginConnection,
    options: PluginOptions,
    devices: list[SeenDevice],
    args: argparse.Namespace,
    out: TextIO,
) -> int:
    holders = await plugin_holders(socket_to_read(args.pod_resources), args.timeout)
    doc: dict[str, Any] = {
        "socket": connection.path,
        "options": render.options_json(options),
        "devices": render.devices_json(devices, holders),
    }
    text = [f"socket: {connection.path}", render.options_text(options), f"devices: {render.summary(devices)}"]
    text.append(render.table(devices, holders=holders))
    error: str | None = None
    try:
        if args.preferred is not None:
            if not options.get_preferred_allocation_available:
                raise InspectError(
                    "GetPreferredAllocation is not offered (get_preferred_allocation_available=no): "
                    "the kubelet would not call it"
                )
            chosen = await connection.preferred(args.preferred, args.must_include, args.size)
            doc["preferred"] = {
                "available": args.preferred,
                "must_include": args.must_include,
                "size": args.size,
                "chosen": chosen,
            }
            shown = (
                "no container response (no preference)" if chosen is None else ", ".join(chosen) or "(none)"
            )
            text.append(f"GetPreferredAllocation(size={args.size}): {shown}")
        if args.allocate is not None:
            responses = await connection.allocate(args.allocate)
            doc["allocate"] = {"devices": args.allocate, "container_responses": responses}
            text.append(f"Allocate({', '.join(args.allocate)}):")
            text += render.allocation_text(responses)
            if not responses:
                error = "Allocate answered no container response (the kubelet would fail the pod)"
        if args.pre_start is not None and error is None:
            if not options.pre_start_required:
                raise InspectError(
                    "PreStartContainer is not offered (pre_start_required=no): the kubelet would not call it"
                )
            await connection.pre_start(args.pre_start)
            doc["pre_start"] = {"devices": args.pre_start, "ok": True}
            text.append(f"PreStartContainer({', '.join(args.pre_start)}): ok")
    except InspectError as exc:
        error = str(exc)
    if error is not None:
        doc["error"] = error
    print(json.dumps(doc, indent=2) if args.json else "\n".join(text), file=out, flush=True)
    if error is not None:
        print(f"devplug inspect: {error}", file=sys.stderr)
        return 1
    return 0


async def _watch(
    connection: PluginConnection, options: PluginOptions, args: argparse.Namespace, out: TextIO
) -> int:
    as_json = args.json
    pod_resources = socket_to_read(args.pod_resources)

    def emit(text: str, doc: dict[str, Any]) -> None:
        print(json.dumps(doc) if as_json else text, file=out, flush=True)

    emit(
        f"socket: {connection.path}\n{render.options_text(options)}",
        {"event": "options", "socket": connection.path, "options": render.options_json(options)},
    )
    first = anyio.Event()

    async def follow() -> None:
        previous: list[SeenDevice] | None = None
        seq = 0
        while True:
            devices = await connection.next_list(within=None)
            assert devices is not None  # no deadline: a list, or an error
            first.set()
            seq += 1
            now = datetime.now(timezone.utc)
            changed = render.changes(previous, devices) if previous is not None else ""
            header = f"{now.astimezone():%H:%M:%S.%f}"[:-3] + f"  list {seq}: {render.summary(devices)}"
            holders = await plugin_holders(pod_resources, connection.timeout)
            emit(
                f"{header}{'; ' + changed if changed else ''}\n{render.table(devices, holders=holders)}",
                {
                    "event": "list",
                    "seq": seq,
                    "time": now.isoformat().replace("+00:00", "Z"),
                    "devices": render.devices_json(devices, holders),
                },
            )
            previous = devices

    async with anyio.create_task_group() as tg:
        tg.start_soon(_warn_if_silent, first, connection.timeout)
        failure = await follow_until_signalled(follow)
        tg.cancel_scope.cancel()
    if failure is not None:
        print(f"devplug inspect: {failure}", file=sys.stderr)
        return 1
    return 0


async def _warn_if_silent(first: anyio.Event, after: float) -> None:
    with anyio.move_on_after(after):
        await first.wait()
    if not first.is_set():
        print(
            f"devplug inspect: no ListAndWatch message after {after:g} s "
            "(the kubelet shows no capacity until the first list); still waiting",
            file=sys.stderr,
            flush=True,
        )
