from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from devplug.cdi import CdiSpec, parse_qualified_name
from devplug_nvidia import NvidiaSettings
from devplug_nvidia._container._allocate import ImexChannel
from devplug_nvidia._container._cdi import build_cdi_spec, write_cdi_spec
from tests.nvidia.nvidia_records import G0, GPUS, MIG


def test_spec_by_uuid() -> None:
    spec = build_cdi_spec([GPUS[0], MIG], NvidiaSettings(), present=("/dev/nvidiactl",))
    doc: Any = spec.to_dict()
    assert doc["kind"] == "k8s.device-plugin.nvidia.com/gpu"
    assert doc["cdiVersion"] == "0.3.0"  # UUID names, no host paths: the oldest version
    assert [d["name"] for d in doc["devices"]] == [G0, MIG.uuid]
    assert doc["devices"][1]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia1"},
        {"path": "/dev/nvidia-caps/nvidia-cap66"},
        {"path": "/dev/nvidia-caps/nvidia-cap67"},
    ]
    edits = doc["containerEdits"]
    assert edits["deviceNodes"] == [{"path": "/dev/nvidiactl"}]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert edits["hooks"][0]["path"] == "/usr/bin/nvidia-ctk"
    for device in doc["devices"]:
        parse_qualified_name(spec.qualified_name(device["name"]))


def test_spec_by_index_with_dev_root(tmp_path: Path) -> None:
    config = NvidiaSettings(device_id_strategy="index", dev_root="/run/nvidia/driver", cdi_dir=tmp_path)
    spec = build_cdi_spec(GPUS, config, present=())
    assert [d.name for d in spec.devices] == ["0", "1"]
    assert spec.devices[0].container_edits.device_nodes[0].host_path == "/run/nvidia/driver/dev/nvidia0"
    assert spec.required_version() == "0.5.0"
    assert spec.container_edits.hooks == ()  # no MIG devices: no chmod hook


def test_written(tmp_path: Path) -> None:
    config = NvidiaSettings(cdi_dir=tmp_path, nvidia_cdi_hook_path="/usr/bin/nvidia-cdi-hook")
    paths = write_cdi_spec([MIG], config, imex=(ImexChannel("0"),))
    assert [p.name for p in paths] == [
        "k8s.device-plugin.nvidia.com-gpu.json",
        "k8s.device-plugin.nvidia.com-imex-channel.json",
    ]
    doc = json.loads(paths[0].read_text())
    CdiSpec.model_validate(doc)
    assert doc["containerEdits"]["hooks"][0]["args"][:2] == ["nvidia-cdi-hook", "chmod"]
    imex = json.loads(paths[1].read_text())
    assert imex["devices"] == [
        {
            "name": "0",
            "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia-caps-imex-channels/channel0"}]},
        }
    ]
    assert write_cdi_spec([], config) == []
