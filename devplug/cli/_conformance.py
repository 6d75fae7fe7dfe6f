"""``devplug conformance [--dra] -- CMD ...``: run the conformance checks and print their table.

The checks themselves live in :mod:`devplug.testing.conformance` (``run_conformance`` for device
plugins, ``run_dra_conformance`` with ``--dra``); this only parses the arguments and formats the
report. Exit status: 0 when no check failed, 1 otherwise, 2 for
bad arguments (a command that cannot be started included).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, TextIO

from devplug._text import os_error_text
from devplug.cli._argtypes import positive_seconds, whole_number
from devplug.logging import configure as configure_logging

if TYPE_CHECKING:
    from devplug.testing.conformance import ConformanceReport

_MARK = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``conformance`` sub-command to ``sub`` (argparse's sub-parsers) and return its parser."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "conformance",
        help="run a plugin command against a private fake kubelet and check it (exit 1 on a failure)",
        description=(
            "Start CMD against a private fake kubelet and run the conformance checks. The device-plugin "
            "directory is passed as DEVPLUG_DEVICE_PLUGIN_DIR and replaces a literal {dir} in CMD. "
            "With --dra, CMD is a DRA driver, run against a private kubelet and API server: it gets "
            "NODE_NAME and KUBECONFIG, and {kubelet_root}, {kubeconfig}, {node} and {cdi_dir} in CMD "
            "are replaced."
        ),
        usage="devplug conformance [options] [--dra] -- CMD ...",
    )
    parser.add_argument("--dra", action="store_true", help="CMD is a DRA driver (kubelet plugin)")
    parser.add_argument(
        "--resource", metavar="NAME", help="the resource to check (default: the first registered)"
    )
    parser.add_argument(
        "--driver", metavar="NAME", help="--dra: the driver to check (default: the first registered)"
    )
    parser.add_argument("--node", metavar="NAME", help="--dra: the node's name (default: node-1)")
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=positive_seconds,
        default=10.0,
        help=(
            "how long to wait for a registration, at start and after each kubelet restart; with --dra "
            "also for the slices and the first health report (default: 10)"
        ),
    )
    parser.add_argument(
        "--restarts", metavar="N", type=whole_number, help="kubelet restarts in a row (default: 3)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON document")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also print the end of the plugin's output"
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the plugin command, after --")
    return parser


def main(args: argparse.Namespace, parser: argparse.ArgumentParser, out: TextIO | None = None) -> int:
    """Run ``devplug conformance`` with parsed ``args``; returns the exit status.

    Raises:
        SystemExit: status 2 for a missing or unstartable command (via ``parser.error``); status
            130 for Ctrl-C or SIGTERM, once the plugin is stopped (with one line on stderr).
    """
    from devplug._runtime.signals import run_async
    from devplug.testing.conformance import run_conformance, run_dra_conformance

    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        parser.error("no plugin command given (devplug conformance -- CMD ...)")
    _check_options(args, parser)
    stream = out or sys.stdout
    # The fake kubelet logs each step; the table says it better. Warnings still show.
    configure_logging("console", "warning", stream=sys.stderr)
    reports: list[ConformanceReport] = []

    async def checking() -> None:
        timeout = args.timeout
        if args.dra:
            node, driver = args.node or "node-1", args.driver
            reports.append(await run_dra_conformance(command, driver=driver, node_name=node, timeout=timeout))
        else:
            restarts = 3 if args.restarts is None else args.restarts
            reports.append(
                await run_conformance(command, resource=args.resource, timeout=timeout, restarts=restarts)
            )

    try:
        # A Ctrl-C or SIGTERM stops the plugin and the fakes, then exits 130 with one line.
        run_async(checking)
    except OSError as exc:
        parser.error(os_error_text(exc, f"start {command[0]}"))
    report = reports[0]
    if args.json:
        print(json.dumps(report.model_dump(mode="json") | {"passed": report.passed}, indent=2), file=stream)
    else:
        print(format_report(report, verbose=args.verbose), file=stream)
    return 0 if report.passed else 1


def _check_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    # An option of one kind of run is a usage error with the other.
    if args.dra:
        if args.resource is not None:
            parser.error("--resource is for device plugins; with --dra, --driver names the driver")
        if args.restarts is not None:
            parser.error("--restarts is for device plugins, not with --dra")
        return
    for flag, value in (("--driver", args.driver), ("--node", args.node)):
        if value is not None:
            parser.error(f"{flag} goes with --dra")


def format_report(report: ConformanceReport, *, verbose: bool = False) -> str:
    """The report as a table of check, result and reason, with a summary line."""
    width = max(len(r.name) for r in report.results)
    subject = "driver" if report.api == "dra" else "resource"
    lines = [
        f"conformance of {' '.join(report.command)}",
        f"{subject}: {report.resource or '(none registered)'}",
        "",
    ]
    lines += [f"{_MARK[r.status]}  {r.name.ljust(width)}  {r.reason}" for r in report.results]
    counts = {status: sum(r.status == status for r in report.results) for status in _MARK}
    lines += ["", f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped"]
    if verbose and report.output_tail:
        lines += [
            "",
            "plugin output (last lines):",
            *(f"  {line}" for line in report.output_tail.splitlines()),
        ]
    elif not report.passed and report.output_tail:
        lines.append("(-v shows the end of the plugin's output)")
    return "\n".join(lines)
