"""Regenerate devplug/_proto from proto/ (run: python scripts/gen_proto.py).

The generated modules are committed; tests/test_proto_drift.py regenerates them
into a temporary directory and fails when the committed ones differ.  The
generator is the pinned grpcio-tools of the ``dev`` extra.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PACKAGE = "devplug._proto"
SOURCES = (
    "deviceplugin/v1beta1/api.proto",
    "pluginregistration/v1/api.proto",
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    "drahealth/v1alpha1/api.proto",
    "drahealth/v1/api.proto",
    "podresources/v1/api.proto",
)
# The top-level directories under proto/ (and so under devplug/_proto/).
TOP_DIRS = tuple(sorted({s.split("/", 1)[0] for s in SOURCES}))


def generate(out_dir: Path) -> list[Path]:
    """Write the generated modules for every proto source under ``out_dir``."""
    from grpc_tools import protoc  # dev dependency, imported only when generating

    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp)
        args = [
            "protoc",
            f"-I{PROTO_DIR}",
            f"--python_out={raw}",
            f"--pyi_out={raw}",
            f"--grpc_python_out={raw}",
            *(str(PROTO_DIR / s) for s in SOURCES),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        written: list[Path] = []
        for src in sorted(raw.rglob("*.py*")):
            rel = src.relative_to(raw)
            text = src.read_text()
            # protoc writes imports relative to proto/; make them package-absolute.
            text = re.sub(
                rf"^from ((?:{'|'.join(TOP_DIRS)})(?:\.[\w.]*)?) import",
                lambda m: f"from {PACKAGE}.{m.group(1)} import",
                text,
                flags=re.MULTILINE,
            )
            dest = out_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
            written.append(dest)
        for leaf in {p.parent for p in written}:
            for package_dir in (leaf, *leaf.relative_to(out_dir).parents):
                (out_dir / package_dir / "__init__.py").touch()
        return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "devplug" / "_proto")
    args = parser.parse_args(argv)
    out: Path = args.out
    for child in TOP_DIRS:
        shutil.rmtree(out / child, ignore_errors=True)
    for path in generate(out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
