"""Device metadata (KEP-5304): the files a prepared claim's containers read its devices from,
byte for byte as Kubernetes' Go helper writes them, and what unprepare removes."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from devplug import Device
from devplug._dra.allocation import PreparedEntry
from devplug._dra.inventory import Inventory
from devplug._dra.metadata import (
    CONTAINER_DIR,
    MetadataDevice,
    MetadataError,
    MetadataPlan,
    MetadataRecord,
    MetadataRemoval,
    add_cdi_ids,
    check_versions,
    claim_removal,
    default_host_dir,
    plan_metadata,
    remove_metadata,
    write_metadata,
)
from devplug._dra.slices import device_entry
from devplug.models import Version
from tests.support import Widgets

UID = "0e9f7a51-1c43-4d0b-9a8c-2f1b3e5d6c7a"
TEMPLATE_UID = "a1b2c3d4-0000-4000-8000-000000000001"


def _claim(name: str, namespace: str, uid: str, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, **meta},
    }


# The inputs the Go program was given (GO_FILES): driver, claim, devices, versions.
CASES: dict[str, tuple[str, dict[str, Any], list[MetadataDevice], tuple[str, ...]]] = {
    # A claim the pod names, two requests (one a subrequest), both versions newest first; the
    # claim's other metadata stays out of the document.
    "claim": (
        "gpu.example.com",
        _claim(
            "shared-gpus",
            "team-a",
            UID,
            annotations={"unrelated": "x"},
            labels={"app": "demo"},
            resourceVersion="12345",
            generation=3,
        ),
        [
            MetadataDevice(
                "gpu",
                "node-1",
                "gpu-0",
                {
                    "resourceName": {"string": "example.com/gpu"},
                    "id": {"string": "GPU-8a3c"},
                    "numaNode": {"int": 1},
                    "resource.kubernetes.io/numaNode": {"int": 1},
                    "healthy": {"bool": True},
                    "driverVersion": {"version": "550.54.15"},
                },
            ),
            MetadataDevice("gpu", "node-1", "gpu-1", {"id": {"string": "GPU-77f0"}}),
            MetadataDevice(
                "nic/fast",
                "node-1",
                "nic-0",
                {"model": {"string": "a<b>&c \u00e9\u2028"}},
                {"interfaceName": "net1", "ips": ["10.0.0.5/24"], "hardwareAddress": "aa:bb:cc:dd:ee:ff"},
            ),
        ],
        ("v1beta1", "v1alpha1"),
    ),
    # A claim made from a template: mounted under the pod's name for it; no attributes.
    "template": (
        "gpu.example.com",
        _claim(
            "my-pod-gpus-x7k2p",
            "default",
            TEMPLATE_UID,
            annotations={"resource.kubernetes.io/pod-claim-name": "gpus"},
        ),
        [MetadataDevice("gpu", "node-1", "gpu-0"), MetadataDevice("gpu", "node-1", "gpu-1")],
        ("v1beta1",),
    ),
    # The annotation empty: written as podClaimName, but the path is a named claim's; a dotted
    # claim name, a pool with a slash, a subrequest, the older version first.
    "empty-annotation": (
        "dra.example.com",
        _claim(
            "claim.v1.x",
            "ns-1",
            "b0000000-0000-4000-8000-000000000002",
            annotations={"resource.kubernetes.io/pod-claim-name": ""},
        ),
        [MetadataDevice("req-1/sub-a", "pool.a/part-2", "dev-0", {})],
        ("v1alpha1", "v1beta1"),
    ),
    # Values at the edges of the encoder: empty, false and zero kept, an empty list and empty
    # network data, control characters, a line separator, a character beyond the BMP, keys
    # sorted by byte.
    "edge": (
        "gpu.example.com",
        _claim("edge", "ns", "c0000000-0000-4000-8000-000000000003"),
        [
            MetadataDevice(
                "r",
                "p",
                "d0",
                {
                    "empty": {"string": ""},
                    "off": {"bool": False},
                    "zero": {"int": 0},
                    "list": {"ints": [1, 2], "strings": ["x"]},
                    "nolist": {"ints": []},
                    "ctl": {"string": 'a\tb\x01\b\f"\\/\u2029\U0001f600'},
                    "Zed": {"string": "upper"},
                },
                {"ips": []},
            )
        ],
        ("v1beta1",),
    ),
}

# The Go helper's output (k8s.io/dynamic-resource-allocation v0.37.2, kubeletplugin's metadata
# writer) for CASES, by case and path under the test's root: a throwaway Go program outside this
# repository ran newMetadataWriter(driver, <root>/plugin, <root>/cdi, versions) and
# processPreparedClaim(claim, devices), then read back every file it wrote. <root> is @ROOT@ and
# the container directory @CONTAINER@ here (only to keep the lines short); nothing else is changed.
GO_FILES: dict[str, dict[str, str]] = {
    "claim": {
        "cdi/gpu.example.com_metadata_0e9f7a51-1c43-4d0b-9a8c-2f1b3e5d6c7a_gpu.json": r"""{
  "cdiVersion": "0.5.0",
  "kind": "gpu.example.com/metadata",
  "devices": [
    {
      "name": "0e9f7a51-1c43-4d0b-9a8c-2f1b3e5d6c7a_gpu",
      "containerEdits": {
        "mounts": [
          {
            "hostPath": "@ROOT@/plugin/dra-device-metadata/team-a_shared-gpus/gpu/metadata.json",
            "containerPath": "@CONTAINER@/resourceclaims/shared-gpus/gpu/gpu.example.com-metadata.json",
            "options": [
              "ro",
              "bind"
            ]
          }
        ]
      }
    }
  ],
  "containerEdits": {}
}""",
        "cdi/gpu.example.com_metadata_0e9f7a51-1c43-4d0b-9a8c-2f1b3e5d6c7a_nic.json": r"""{
  "cdiVersion": "0.5.0",
  "kind": "gpu.example.com/metadata",
  "devices": [
    {
      "name": "0e9f7a51-1c43-4d0b-9a8c-2f1b3e5d6c7a_nic",
      "containerEdits": {
        "mounts": [
          {
            "hostPath": "@ROOT@/plugin/dra-device-metadata/team-a_shared-gpus/nic/metadata.json",
            "containerPath": "@CONTAINER@/resourceclaims/shared-gpus/nic/gpu.example.com-metadata.json",
            "options": [
              "ro",
              "bind"
            ]
          }
        ]
      }
    }
  ],
  "containerEdits": {}
}""",
        "plugin/dra-device-metadata/team-a_shared-gpus/gpu/metadata.json": r"""{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/v1beta1",
  "metadata": {
    "name": "shared-gpus",
    "namespace": "team-a",
    "uid": "0e9f7a51-1c43-4d0b-9a8c-2f1b3e5d6c7a",
    "generation": 1
  },
  "requests": [
    {
      "name": "gpu",
      "devices": [
        {
          "driver": "gpu.example.com",
          "pool": "node-1",
          "name": "gpu-0",
          "attributes": {
            "driverVersion": {
              "version": "550.54.15"
            },
            "healthy": {
              "bool": true
            },
            "id": {
              "string": "GPU-8a3c"
            },
            "numaNode": {
              "int": 1
            },
            "resource.kubernetes.io/numaNode": {
              "int": 1
            },
            "resourceName": {
              "string": "example.com/gpu"
            }
          }
        },
        {
          "driver": "gpu.example.com",
          "pool": "node-1",
          "name": "gpu-1",
          "attributes": {
            "id": {
              "string": "GPU-77f0"
            }
          }
        }
      ]
    }
  ]
}
{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/v1alpha1",
  "metadata": {
    "name": "shared-gpus",
    "namespace": "team-a",
    "uid": "0e9f7a51-1c43-4d0b-9a8c-2f1b3e5d6c7a",
    "generation": 1
  },
  "requests": [
    {
      "name": "gpu",
      "devices": [
        {
          "driver": "gpu.example.com",
          "pool": "node-1",
          "name": "gpu-0",
          "attributes": {
            "driverVersion": {
              "version": "550.54.15"
            },
            "healthy": {
              "bool": true
            },
            "id": {
              "string": "GPU-8a3c"
            },
            "numaNode": {
              "int": 1
            },
            "resource.kubernetes.io/numaNode": {
              "int": 1
            },
            "resourceName": {
              "string": "example.com/gpu"
            }
          }
        },
        {
          "driver": "gpu.example.com",
          "pool": "node-1",
          "name": "gpu-1",
          "attributes": {
            "id": {
              "string": "GPU-77f0"
            }
          }
        }
      ]
    }
  ]
}
""",
        "plugin/dra-device-metadata/team-a_shared-gpus/nic/metadata.json": r"""{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/v1beta1",
  "metadata": {
    "name": "shared-gpus",
    "namespace": "team-a",
    "uid": "0e9f7a51-1c43-4d0b-9a8c-2f1b3e5d6c7a",
    "generation": 1
  },
  "requests": [
    {
      "name": "nic/fast",
      "devices": [
        {
          "driver": "gpu.example.com",
          "pool": "node-1",
          "name": "nic-0",
          "attributes": {
            "model": {
              "string": "a\u003cb\u003e\u0026c é\u2028"
            }
          },
          "networkData": {
            "interfaceName": "net1",
            "ips": [
              "10.0.0.5/24"
            ],
            "hardwareAddress": "aa:bb:cc:dd:ee:ff"
          }
        }
      ]
    }
  ]
}
{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/v1alpha1",
  "metadata": {
    "name": "shared-gpus",
    "namespace": "team-a",
    "uid": "0e9f7a51-1c43-4d0b-9a8c-2f1b3e5d6c7a",
    "generation": 1
  },
  "requests": [
    {
      "name": "nic/fast",
      "devices": [
        {
          "driver": "gpu.example.com",
          "pool": "node-1",
          "name": "nic-0",
          "attributes": {
            "model": {
              "string": "a\u003cb\u003e\u0026c é\u2028"
            }
          },
          "networkData": {
            "interfaceName": "net1",
            "ips": [
              "10.0.0.5/24"
            ],
            "hardwareAddress": "aa:bb:cc:dd:ee:ff"
          }
        }
      ]
    }
  ]
}
""",
    },
    "template": {
        "cdi/gpu.example.com_metadata_a1b2c3d4-0000-4000-8000-000000000001_gpu.json": r"""{
  "cdiVersion": "0.3.0",
  "kind": "gpu.example.com/metadata",
  "devices": [
    {
      "name": "a1b2c3d4-0000-4000-8000-000000000001_gpu",
      "containerEdits": {
        "mounts": [
          {
            "hostPath": "@ROOT@/plugin/dra-device-metadata/default_my-pod-gpus-x7k2p/gpu/metadata.json",
            "containerPath": "@CONTAINER@/resourceclaimtemplates/gpus/gpu/gpu.example.com-metadata.json",
            "options": [
              "ro",
              "bind"
            ]
          }
        ]
      }
    }
  ],
  "containerEdits": {}
}""",
        "plugin/dra-device-metadata/default_my-pod-gpus-x7k2p/gpu/metadata.json": r"""{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/v1beta1",
  "metadata": {
    "name": "my-pod-gpus-x7k2p",
    "namespace": "default",
    "uid": "a1b2c3d4-0000-4000-8000-000000000001",
    "generation": 1
  },
  "podClaimName": "gpus",
  "requests": [
    {
      "name": "gpu",
      "devices": [
        {
          "driver": "gpu.example.com",
          "pool": "node-1",
          "name": "gpu-0"
        },
        {
          "driver": "gpu.example.com",
          "pool": "node-1",
          "name": "gpu-1"
        }
      ]
    }
  ]
}
""",
    },
    "empty-annotation": {
        "cdi/dra.example.com_metadata_b0000000-0000-4000-8000-000000000002_req-1.json": r"""{
  "cdiVersion": "0.3.0",
  "kind": "dra.example.com/metadata",
  "devices": [
    {
      "name": "b0000000-0000-4000-8000-000000000002_req-1",
      "containerEdits": {
        "mounts": [
          {
            "hostPath": "@ROOT@/plugin/dra-device-metadata/ns-1_claim.v1.x/req-1/metadata.json",
            "containerPath": "@CONTAINER@/resourceclaims/claim.v1.x/req-1/dra.example.com-metadata.json",
            "options": [
              "ro",
              "bind"
            ]
          }
        ]
      }
    }
  ],
  "containerEdits": {}
}""",
        "plugin/dra-device-metadata/ns-1_claim.v1.x/req-1/metadata.json": r"""{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/v1alpha1",
  "metadata": {
    "name": "claim.v1.x",
    "namespace": "ns-1",
    "uid": "b0000000-0000-4000-8000-000000000002",
    "generation": 1
  },
  "podClaimName": "",
  "requests": [
    {
      "name": "req-1/sub-a",
      "devices": [
        {
          "driver": "dra.example.com",
          "pool": "pool.a/part-2",
          "name": "dev-0"
        }
      ]
    }
  ]
}
{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/v1beta1",
  "metadata": {
    "name": "claim.v1.x",
    "namespace": "ns-1",
    "uid": "b0000000-0000-4000-8000-000000000002",
    "generation": 1
  },
  "podClaimName": "",
  "requests": [
    {
      "name": "req-1/sub-a",
      "devices": [
        {
          "driver": "dra.example.com",
          "pool": "pool.a/part-2",
          "name": "dev-0"
        }
      ]
    }
  ]
}
""",
    },
    "edge": {
        "cdi/gpu.example.com_metadata_c0000000-0000-4000-8000-000000000003_r.json": r"""{
  "cdiVersion": "0.3.0",
  "kind": "gpu.example.com/metadata",
  "devices": [
    {
      "name": "c0000000-0000-4000-8000-000000000003_r",
      "containerEdits": {
        "mounts": [
          {
            "hostPath": "@ROOT@/plugin/dra-device-metadata/ns_edge/r/metadata.json",
            "containerPath": "@CONTAINER@/resourceclaims/edge/r/gpu.example.com-metadata.json",
            "options": [
              "ro",
              "bind"
            ]
          }
        ]
      }
    }
  ],
  "containerEdits": {}
}""",
        "plugin/dra-device-metadata/ns_edge/r/metadata.json": r"""{
  "kind": "DeviceMetadata",
  "apiVersion": "metadata.resource.k8s.io/v1beta1",
  "metadata": {
    "name": "edge",
    "namespace": "ns",
    "uid": "c0000000-0000-4000-8000-000000000003",
    "generation": 1
  },
  "requests": [
    {
      "name": "r",
      "devices": [
        {
          "driver": "gpu.example.com",
          "pool": "p",
          "name": "d0",
          "attributes": {
            "Zed": {
              "string": "upper"
            },
            "ctl": {
              "string": "a\tb\u0001\b\f\"\\/\u2029😀"
            },
            "empty": {
              "string": ""
            },
            "list": {
              "ints": [
                1,
                2
              ],
              "strings": [
                "x"
              ]
            },
            "nolist": {},
            "off": {
              "bool": false
            },
            "zero": {
              "int": 0
            }
          },
          "networkData": {}
        }
      ]
    }
  ]
}
""",
    },
}
GO_CDI_IDS: dict[str, dict[str, str]] = {
    "claim": {
        "gpu": "gpu.example.com/metadata=0e9f7a51-1c43-4d0b-9a8c-2f1b3e5d6c7a_gpu",
        "nic": "gpu.example.com/metadata=0e9f7a51-1c43-4d0b-9a8c-2f1b3e5d6c7a_nic",
    },
    "template": {"gpu": "gpu.example.com/metadata=a1b2c3d4-0000-4000-8000-000000000001_gpu"},
    "empty-annotation": {"req-1": "dra.example.com/metadata=b0000000-0000-4000-8000-000000000002_req-1"},
    "edge": {"r": "gpu.example.com/metadata=c0000000-0000-4000-8000-000000000003_r"},
}


def _plan(case: str, root: Path) -> MetadataPlan:
    driver, claim, devices, versions = CASES[case]
    return plan_metadata(
        driver,
        claim,
        devices,
        host_dir=root / "plugin" / "dra-device-metadata",
        cdi_dir=root / "cdi",
        versions=versions,
    )


def _go(case: str, root: Path) -> dict[str, str]:
    return {
        path: text.replace("@ROOT@", str(root)).replace("@CONTAINER@", CONTAINER_DIR)
        for path, text in GO_FILES[case].items()
    }


def _documents(data: bytes) -> list[dict[str, Any]]:
    """The documents of a metadata stream, each followed by a newline."""
    text, decoder, documents, at = data.decode(), json.JSONDecoder(), [], 0
    while at < len(text):
        document, at = decoder.raw_decode(text, at)
        documents.append(document)
        assert text[at] == "\n"
        at += 1
    return documents


def _ours(plan: MetadataPlan, root: Path) -> dict[str, bytes]:
    return {str(f.path.relative_to(root)): f.data for f in plan.files}


@pytest.mark.parametrize("case", list(CASES))
def test_the_files_are_the_go_helper_s(case: str, tmp_path: Path) -> None:
    plan = _plan(case, tmp_path)
    ours, go = _ours(plan, tmp_path), _go(case, tmp_path)
    assert sorted(ours) == sorted(go)
    for path, text in go.items():
        if path.endswith("/metadata.json"):
            # The metadata stream byte for byte: a consumer sees the same file from either.
            assert ours[path].decode() == text, path
        else:
            # The CDI spec field by field. Go also writes an empty top-level containerEdits
            # (its struct is never omitted) and no final newline; a runtime reads both alike.
            expected = json.loads(text)
            assert expected.pop("containerEdits") == {}
            assert json.loads(ours[path]) == expected, path
            assert ours[path].endswith(b"}\n")
    assert all(f.mode == 0o644 for f in plan.files)
    assert dict(plan.cdi_device_ids) == GO_CDI_IDS[case]


def test_every_version_holds_the_same_document(tmp_path: Path) -> None:
    documents = _documents(_plan("claim", tmp_path).files[0].data)
    assert [d.pop("apiVersion") for d in documents] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    assert documents[0] == documents[1]
    assert documents[0]["metadata"] == {
        "name": "shared-gpus",
        "namespace": "team-a",
        "uid": UID,
        "generation": 1,
    }
    assert "podClaimName" not in documents[0]


def test_paths_of_a_named_claim_and_of_a_template_s(tmp_path: Path) -> None:
    named, template = _plan("claim", tmp_path), _plan("template", tmp_path)
    mounts = {
        f.name: json.loads(f.data)["devices"][0]["containerEdits"]["mounts"][0]
        for plan in (named, template)
        for f in plan.files
        if f.directory == tmp_path / "cdi"
    }
    gpu = mounts[f"gpu.example.com_metadata_{UID}_gpu.json"]
    assert gpu == {
        "hostPath": f"{tmp_path}/plugin/dra-device-metadata/team-a_shared-gpus/gpu/metadata.json",
        "containerPath": (
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/shared-gpus/gpu/gpu.example.com-metadata.json"
        ),
        "options": ["ro", "bind"],
    }
    generated = mounts[f"gpu.example.com_metadata_{TEMPLATE_UID}_gpu.json"]
    # On the host by the claim's generated name, in the container by the pod's name for it.
    assert generated["hostPath"].endswith("/dra-device-metadata/default_my-pod-gpus-x7k2p/gpu/metadata.json")
    assert generated["containerPath"] == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/gpu/gpu.example.com-metadata.json"
    )
    assert json.loads(template.files[0].data)["podClaimName"] == "gpus"


def test_the_container_directory_is_a_parameter(tmp_path: Path) -> None:
    driver, claim, devices, _ = CASES["template"]
    plan = plan_metadata(
        driver, claim, devices, host_dir=tmp_path / "m", cdi_dir=tmp_path / "c", container_dir="/meta"
    )
    mount = json.loads(plan.files[-1].data)["devices"][0]["containerEdits"]["mounts"][0]
    assert mount["containerPath"] == "/meta/resourceclaimtemplates/gpus/gpu/gpu.example.com-metadata.json"
    assert mount["hostPath"] == f"{tmp_path}/m/default_my-pod-gpus-x7k2p/gpu/metadata.json"
    assert default_host_dir("/var/lib/kubelet/plugins/gpu.example.com") == Path(
        "/var/lib/kubelet/plugins/gpu.example.com/dra-device-metadata"
    )


def test_a_subrequest_is_filed_under_its_request(tmp_path: Path) -> None:
    plan = _plan("claim", tmp_path)
    nic = next(f for f in plan.files if f.directory.name == "nic")
    assert nic.path == tmp_path / "plugin/dra-device-metadata/team-a_shared-gpus/nic/metadata.json"
    assert _documents(nic.data)[0]["requests"][0]["name"] == "nic/fast"
    assert plan.cdi_device_ids["nic"] == f"gpu.example.com/metadata={UID}_nic"
    assert "nic/fast" not in plan.cdi_device_ids


def test_two_subrequests_of_one_request_are_refused(tmp_path: Path) -> None:
    devices = [MetadataDevice("gpu/a", "p", "d0"), MetadataDevice("gpu/b", "p", "d1")]
    with pytest.raises(MetadataError, match="two subrequests of request 'gpu'"):
        plan_metadata("d.example.com", _claim("c", "ns", "u1"), devices, host_dir=tmp_path, cdi_dir=tmp_path)


def test_requests_and_devices_keep_their_order(tmp_path: Path) -> None:
    devices = [
        MetadataDevice("b", "p", "d2"),
        MetadataDevice("a", "p", "d1"),
        MetadataDevice("b", "p", "d0"),
    ]
    plan = plan_metadata(
        "d.example.com", _claim("c", "ns", "u1"), devices, host_dir=tmp_path / "m", cdi_dir=tmp_path / "c"
    )
    assert [f.directory.name for f in plan.files[:2]] == ["b", "a"]
    first = _documents(plan.files[0].data)[0]
    assert [d["name"] for d in first["requests"][0]["devices"]] == ["d2", "d0"]
    assert list(plan.cdi_device_ids) == ["b", "a"]


def test_no_devices_no_files(tmp_path: Path) -> None:
    plan = plan_metadata("d.example.com", _claim("c", "ns", "u1"), [], host_dir=tmp_path, cdi_dir=tmp_path)
    assert plan.files == ()
    assert plan.cdi_device_ids == {}
    assert plan.record == MetadataRecord()


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"claim": _claim("c", "ns_x", "u1")}, "claim namespace 'ns_x' is not a DNS label"),
        ({"claim": _claim("../c", "ns", "u1")}, "claim name '../c' is not a DNS subdomain"),
        ({"claim": _claim("Claim", "ns", "u1")}, "claim name 'Claim' is not a DNS subdomain"),
        ({"claim": _claim("c", "ns", "u/1")}, "claim UID 'u/1' does not fit"),
        ({"claim": _claim("c", "ns", "")}, "the claim has no metadata.uid"),
        ({"claim": {"spec": {}}}, "the claim has no metadata"),
        (
            {"claim": _claim("c", "ns", "u1", annotations={"resource.kubernetes.io/pod-claim-name": "../x"})},
            "annotation resource.kubernetes.io/pod-claim-name of the claim is not a DNS label: '../x'",
        ),
        ({"request": ".."}, "request '..' is not"),
        ({"request": "r/../x"}, "request 'r/../x' is not"),
        ({"request": "R"}, "request 'R' is not"),
        ({"driver": "D_x.com"}, "driver name 'D_x.com' is not a DNS subdomain"),
        ({"driver": "1d.example.com"}, "no valid CDI spec for u1_r"),  # a CDI vendor starts with a letter
        ({"host_dir": "relative"}, "the metadata's host directory 'relative' is not absolute"),
        ({"container_dir": "run/x"}, "the metadata's container directory 'run/x' is not absolute"),
    ],
)
def test_names_that_make_no_safe_path_are_refused(tmp_path: Path, change: dict[str, Any], error: str) -> None:
    args: dict[str, Any] = {
        "driver": "d.example.com",
        "claim": _claim("c", "ns", "u1"),
        "request": "r",
        "host_dir": tmp_path,
        "container_dir": CONTAINER_DIR,
    } | change
    with pytest.raises(MetadataError, match=re.escape(error)):
        plan_metadata(
            args["driver"],
            args["claim"],
            [MetadataDevice(args["request"], "p", "d0")],
            host_dir=args["host_dir"],
            cdi_dir=tmp_path,
            container_dir=args["container_dir"],
        )


def test_odd_but_valid_names(tmp_path: Path) -> None:
    # The longest names the API accepts, dots in claim and driver names, digits first.
    name = "0." + "a" * 60 + "." + "b" * 63
    devices = [MetadataDevice("r-" + "x" * 61, "pool/with.parts", "0d", {"k.example.com/x": {"string": "é"}})]
    plan = plan_metadata(
        "a-b.c.example.com",
        _claim(name, "9ns", "1-2-3"),
        devices,
        host_dir=tmp_path / "m",
        cdi_dir=tmp_path / "c",
    )
    request = "r-" + "x" * 61
    assert plan.files[0].path == tmp_path / "m" / f"9ns_{name}" / request / "metadata.json"
    assert plan.files[1].name == f"a-b.c.example.com_metadata_1-2-3_{request}.json"
    assert plan.cdi_device_ids == {request: f"a-b.c.example.com/metadata=1-2-3_{request}"}
    spec = json.loads(plan.files[1].data)
    assert spec["cdiVersion"] == "0.5.0"  # a device name that starts with a digit needs it
    assert "\u00e9" in plan.files[0].data.decode()  # non-ASCII stays as UTF-8, as Go writes it


def test_attributes_come_from_the_published_device(tmp_path: Path) -> None:
    inventory = Inventory([Widgets()])
    inventory.update(
        0,
        [
            Device(
                id="GPU-1",
                name="gpu-0",
                numa_nodes=(1,),
                attributes={"model": "w", "fw": Version("1.2.3")},
                capacity={"memory": "16Gi"},
            )
        ],
    )
    (entry,) = inventory.current.entries
    published = device_entry(entry, "widget.example.com", taint_unhealthy=True)
    device = MetadataDevice.from_slice("widgets", "node-1", published)
    assert device == MetadataDevice("widgets", "node-1", "gpu-0", published["attributes"])
    plan = plan_metadata(
        "widget.example.com",
        _claim("c", "ns", "u1"),
        [device],
        host_dir=tmp_path / "m",
        cdi_dir=tmp_path / "c",
        versions=["v1beta1"],
    )
    (written,) = json.loads(plan.files[0].data)["requests"][0]["devices"]
    assert written == {
        "driver": "widget.example.com",
        "pool": "node-1",
        "name": "gpu-0",
        "attributes": {
            "fw": {"version": "1.2.3"},
            "id": {"string": "GPU-1"},
            "model": {"string": "w"},
            "numaNode": {"int": 1},
            "resource.kubernetes.io/numaNode": {"int": 1},
            "resourceName": {"string": "example.com/widget"},
        },
    }  # no capacity: the document has no place for it


def test_unknown_attribute_fields_are_left_out_and_non_objects_refused(tmp_path: Path) -> None:
    odd = MetadataDevice("r", "p", "d0", {"a": {"string": "x", "future": 1, "int": None}})
    plan = plan_metadata(
        "d.example.com",
        _claim("c", "ns", "u1"),
        [odd],
        host_dir=tmp_path,
        cdi_dir=tmp_path,
        versions=["v1beta1"],
    )
    assert json.loads(plan.files[0].data)["requests"][0]["devices"][0]["attributes"] == {"a": {"string": "x"}}
    bad = MetadataDevice("r", "p", "d0", {"a": "x"})  # type: ignore[dict-item]
    with pytest.raises(MetadataError, match="attribute a of device d0 is not an object"):
        plan_metadata("d.example.com", _claim("c", "ns", "u1"), [bad], host_dir=tmp_path, cdi_dir=tmp_path)


def test_versions() -> None:
    assert check_versions(["v1beta1"]) == ("v1beta1",)
    assert check_versions(("v1alpha1", "v1beta1")) == ("v1alpha1", "v1beta1")
    with pytest.raises(MetadataError, match="must include the latest, v1beta1"):
        check_versions(["v1alpha1"])
    with pytest.raises(MetadataError, match="must include the latest, v1beta1 \\(got none\\)"):
        check_versions([])
    with pytest.raises(MetadataError, match="unknown device metadata version 'v1'"):
        check_versions(["v1beta1", "v1"])
    with pytest.raises(MetadataError, match="repeat"):
        check_versions(["v1beta1", "v1beta1"])


def test_the_record_lists_every_file_and_directory(tmp_path: Path) -> None:
    plan = _plan("claim", tmp_path)
    claim_dir = tmp_path / "plugin/dra-device-metadata/team-a_shared-gpus"
    assert plan.record == MetadataRecord(
        files=(
            str(claim_dir / "gpu/metadata.json"),
            str(claim_dir / "nic/metadata.json"),
            str(tmp_path / f"cdi/gpu.example.com_metadata_{UID}_gpu.json"),
            str(tmp_path / f"cdi/gpu.example.com_metadata_{UID}_nic.json"),
        ),
        directories=(str(claim_dir / "gpu"), str(claim_dir / "nic"), str(claim_dir)),
    )


def test_record_round_trip(tmp_path: Path) -> None:
    record = _plan("claim", tmp_path).record
    stored = json.loads(json.dumps(record.to_json()))
    assert set(stored) == {"files", "directories"}
    assert MetadataRecord.from_json(stored) == record
    assert MetadataRecord.from_json({}) == MetadataRecord()
    assert MetadataRecord.from_json(MetadataRecord().to_json()) == MetadataRecord()
    with pytest.raises(MetadataError, match=r"claims\.u1\.metadata is not an object"):
        MetadataRecord.from_json(["x"], "claims.u1.metadata")
    with pytest.raises(MetadataError, match=r"metadata\.files is not a list of paths"):
        MetadataRecord.from_json({"files": ["/a", 3]})
    with pytest.raises(MetadataError, match=r"metadata\.directories is not a list of paths"):
        MetadataRecord.from_json({"directories": "/a"})


def test_write_then_remove(tmp_path: Path) -> None:
    plan = _plan("claim", tmp_path)
    write_metadata(plan)
    for item in plan.files:
        assert item.path.read_bytes() == item.data
        assert stat.S_IMODE(item.path.stat().st_mode) == 0o644
    # Written again (a repeated prepare): replaced in place, no temporary file left.
    write_metadata(plan)
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == sorted(
        f.name for f in plan.files if f.directory == tmp_path / "cdi"
    )
    remove_metadata(plan.record.removal())
    # As the Go helper leaves it: the claim's directory gone, the host and CDI directories kept.
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "cdi",
        "plugin",
        "plugin/dra-device-metadata",
    ]
    remove_metadata(plan.record.removal())  # again: nothing left to remove is fine


def test_removal_keeps_what_another_claim_holds(tmp_path: Path) -> None:
    # A claim deleted and made again under its name: same directory, another UID.
    driver, claim, devices, versions = CASES["template"]
    old = _plan("template", tmp_path)
    again = dict(claim, metadata=dict(claim["metadata"], uid="a1b2c3d4-0000-4000-8000-00000000000f"))
    new = plan_metadata(
        driver,
        again,
        devices,
        host_dir=tmp_path / "plugin" / "dra-device-metadata",
        cdi_dir=tmp_path / "cdi",
        versions=versions,
    )
    write_metadata(old)
    write_metadata(new)
    removal = old.record.removal(keep=[new.record])
    assert removal.files == (str(tmp_path / f"cdi/gpu.example.com_metadata_{TEMPLATE_UID}_gpu.json"),)
    remove_metadata(removal)
    assert all(f.path.read_bytes() == f.data for f in new.files)


def test_a_directory_that_is_not_empty_stays(tmp_path: Path) -> None:
    plan = _plan("template", tmp_path)
    write_metadata(plan)
    stranger = plan.files[0].directory / "other-metadata.json"
    stranger.write_text("{}")
    remove_metadata(plan.record.removal())
    assert stranger.exists()
    assert not plan.files[0].path.exists()


def test_a_file_that_cannot_be_removed_is_an_error(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    with pytest.raises(IsADirectoryError):
        remove_metadata(MetadataRemoval(files=(str(directory),)))
    assert directory.exists()


def test_removal_worked_out_from_the_names(tmp_path: Path) -> None:
    plan = _plan("claim", tmp_path)
    derived = claim_removal(
        "gpu.example.com",
        UID,
        "team-a",
        "shared-gpus",
        ["gpu", "gpu", "nic/fast", "Not a request"],
        host_dir=tmp_path / "plugin" / "dra-device-metadata",
        cdi_dir=tmp_path / "cdi",
    )
    assert derived == plan.record.removal()
    write_metadata(plan)
    remove_metadata(derived)
    assert not (tmp_path / "plugin/dra-device-metadata/team-a_shared-gpus").exists()
    assert list((tmp_path / "cdi").iterdir()) == []
    assert claim_removal("d", "u", "ns", "c", [], host_dir=tmp_path, cdi_dir=tmp_path) == MetadataRemoval()


def test_cdi_ids_go_to_each_request_s_first_device() -> None:
    kind = "k8s.gpu.example.com/claim"
    entries = [
        PreparedEntry("gpu-0", "node-1", ("gpu",), (f"{kind}={UID}-gpu",)),
        PreparedEntry("gpu-1", "node-1", ("gpu",)),
        PreparedEntry("nic-0", "node-1", ("nic/fast",)),
        PreparedEntry("x-0", "node-1", ("other",)),
    ]
    ids = {"gpu": "gpu.example.com/metadata=u_gpu", "nic": "gpu.example.com/metadata=u_nic"}
    out = add_cdi_ids(entries, ids)
    assert [e.cdi_device_ids for e in out] == [
        (f"{kind}={UID}-gpu", "gpu.example.com/metadata=u_gpu"),
        (),
        ("gpu.example.com/metadata=u_nic",),
        (),
    ]
    assert out[1] is entries[1]
    # Added once: a repeated call (a restored answer) does not add it twice.
    assert add_cdi_ids(out, ids) == out
