"""Device metadata (KEP-5304): the files that show a prepared claim's devices to its containers.

For each request of a prepared claim the driver writes a metadata file on the host and a CDI
spec whose one device bind-mounts that file, read-only, at a path every container of the pod
can work out from its pod spec:

* ``<container dir>/resourceclaims/<claim>/<request>/<driver>-metadata.json`` for a claim the
  pod names (``resourceClaimName``);
* ``<container dir>/resourceclaimtemplates/<pod claim>/<request>/<driver>-metadata.json`` for a
  claim made from a template (``resourceClaimTemplateName``): the claim's generated name is not
  in the pod spec, so the pod's own name for it (the claim's annotation
  ``resource.kubernetes.io/pod-claim-name``) is used instead.

``<container dir>`` is ``/var/run/kubernetes.io/dra-device-attributes``. ``<request>`` is the
request's own name: ``gpu`` for a device allocated to the subrequest ``gpu/small``, whose full
name is in the file. The prepared device's CDI IDs get ``<driver>/metadata=<uid>_<request>``
(on the request's first device), so the runtime applies the mount.

The layout matches Kubernetes' Go helper for DRA drivers (``kubeletplugin`` with
``EnableDeviceMetadata``), so consumers built for it (the ``devicemetadata`` package) read these
files: on the host ``<host dir>/<namespace>_<claim>/<request>/metadata.json``, where the host
dir is ``dra-device-metadata`` in the driver's data directory
(``/var/lib/kubelet/plugins/<driver>``), and the spec as
``<cdi dir>/<driver>_metadata_<uid>_<request>.json``.

A metadata file is a stream of JSON documents, the same ``DeviceMetadata`` once per API version
(``metadata.resource.k8s.io/v1beta1``, ``v1alpha1``), each followed by a newline: a reader takes
the first version it knows. The documents are written byte for byte as the Go helper writes
them (its JSON encoder's indentation and escapes), so a file does not change when a driver moves
between the two.

Pure but for :func:`write_metadata` and :func:`remove_metadata`: :func:`plan_metadata` turns a
claim and its devices into the files to write, the CDI device IDs and a :class:`MetadataRecord`
(for the checkpoint) of what to remove at unprepare.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from devplug._cdi_files import write_atomically
from devplug._names import is_dns_label, is_dns_subdomain

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from devplug._dra.allocation import PreparedEntry
    from devplug.cdi import CdiSpec

__all__ = [
    "CONTAINER_DIR",
    "DEFAULT_VERSIONS",
    "LATEST_VERSION",
    "VERSIONS",
    "MetadataDevice",
    "MetadataError",
    "MetadataFile",
    "MetadataPlan",
    "MetadataRecord",
    "MetadataRemoval",
    "add_cdi_ids",
    "check_versions",
    "claim_removal",
    "default_host_dir",
    "plan_metadata",
    "remove_metadata",
    "write_metadata",
]

GROUP = "metadata.resource.k8s.io"
KIND = "DeviceMetadata"
VERSIONS = ("v1beta1", "v1alpha1")
"""The API versions of the document that devplug writes, newest first."""
LATEST_VERSION = "v1beta1"
"""Always written: a reader that knows only the latest version must find it."""
DEFAULT_VERSIONS = VERSIONS
"""Both: readers built against Kubernetes 1.36 know only v1alpha1 (they skip v1beta1)."""

CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
"""Where containers find the files: part of the consumers' API, not to be changed lightly."""
CLAIMS_DIR = "resourceclaims"
TEMPLATES_DIR = "resourceclaimtemplates"
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
"""The annotation of a claim made from a template: the pod's name for the claim."""
HOST_DIR = "dra-device-metadata"
"""The host directory's name in the driver's data directory."""
HOST_FILE = "metadata.json"
CDI_CLASS = "metadata"
FILE_MODE = 0o644
"""Metadata files and their CDI specs: the runtime, and the container's user, read them."""
MOUNT_OPTIONS = ("ro", "bind")

# A claim UID as it goes into a file name and a CDI device name.
_UID = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
# The fields of an attribute value and of network data, in the order the API's types declare
# them (the Go encoder writes struct fields in that order, the others not at all).
_ATTRIBUTE_FIELDS = ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")
_NETWORK_FIELDS = ("interfaceName", "ips", "hardwareAddress")
# What Go's encoding/json escapes beyond what Python's json module does with ensure_ascii off.
_GO_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


class MetadataError(ValueError):
    """The claim, a device or a setting cannot be written as device metadata (the message says
    which field and why)."""


@dataclass(frozen=True)
class MetadataDevice:
    """One allocated device as its request's metadata file describes it."""

    request: str
    """The allocation result's request: ``gpu``, or ``gpu/small`` for a subrequest."""
    pool: str
    name: str
    """The device's name in its pool."""
    attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Its attributes in the API's shape (``{"model": {"string": "A100"}}``); none: left out."""
    network_data: Mapping[str, Any] | None = None
    """``interfaceName``, ``ips``, ``hardwareAddress`` of a network device, in the API's shape."""

    @classmethod
    def from_slice(cls, request: str, pool: str, device: Mapping[str, Any]) -> MetadataDevice:
        """The device as a ResourceSlice publishes it (:func:`devplug._dra.slices.device_entry`):
        its name and attributes. Capacity, counters and taints have no place in the document."""
        return cls(
            request=request,
            pool=pool,
            name=str(device.get("name", "")),
            attributes=dict(device.get("attributes") or {}),
        )


@dataclass(frozen=True)
class MetadataFile:
    """A file to write: ``directory/name`` with ``data``, mode ``mode``."""

    directory: Path
    name: str
    data: bytes
    mode: int = FILE_MODE

    @property
    def path(self) -> Path:
        return self.directory / self.name


@dataclass(frozen=True)
class MetadataRemoval:
    """What unprepare removes: ``files`` (a missing one is fine), then ``directories`` in order,
    each only if empty."""

    files: tuple[str, ...] = ()
    directories: tuple[str, ...] = ()


@dataclass(frozen=True)
class MetadataRecord:
    """What a prepare wrote for a claim's metadata, kept in the checkpoint to remove it again."""

    files: tuple[str, ...] = ()
    """Absolute paths: the metadata files, then the CDI specs."""
    directories: tuple[str, ...] = ()
    """The directories made for the claim, deepest first (request directories, the claim's)."""

    def removal(self, keep: Iterable[MetadataRecord] = ()) -> MetadataRemoval:
        """What to remove at unprepare: the files, less any that a record of ``keep`` (the other
        prepared claims) holds too, and the directories.

        A claim deleted and made again under the same name has the same metadata directory: the
        new claim's files stay when the old one is unprepared after it was prepared.
        """
        kept = {path for record in keep for path in record.files}
        return MetadataRemoval(
            files=tuple(p for p in self.files if p not in kept), directories=self.directories
        )

    def to_json(self) -> dict[str, Any]:
        """The checkpoint's form."""
        return {"files": list(self.files), "directories": list(self.directories)}

    @classmethod
    def from_json(cls, data: object, where: str = "metadata") -> MetadataRecord:
        """Read :meth:`to_json`'s form (an absent list is empty).

        Raises:
            MetadataError: ``data`` is not such an object; ``where`` names it in the message.
        """
        if not isinstance(data, dict):
            raise MetadataError(f"{where} is not an object: {data!r:.60}")
        return cls(
            files=_paths(data, "files", where),
            directories=_paths(data, "directories", where),
        )


@dataclass(frozen=True)
class MetadataPlan:
    """A claim's metadata: the files to write, the CDI IDs to add, the record to keep."""

    files: tuple[MetadataFile, ...]
    """The metadata files, then their CDI specs (a spec never names a file not yet written)."""
    cdi_device_ids: Mapping[str, str]
    """Request name (``gpu`` for ``gpu/small`` too) → the fully qualified CDI device to add."""
    record: MetadataRecord


def default_host_dir(data_dir: str | os.PathLike[str]) -> Path:
    """The metadata files' host directory in a driver's data directory
    (``/var/lib/kubelet/plugins/<driver>``), where the Go helper keeps them."""
    return Path(data_dir) / HOST_DIR


def check_versions(versions: Iterable[str]) -> tuple[str, ...]:
    """``versions`` (``v1beta1``, ``v1alpha1``, in the order to write them) if they can be written.

    Raises:
        MetadataError: none, an unknown or repeated one, or the latest one missing.
    """
    chosen = tuple(versions)
    unknown = [v for v in chosen if v not in VERSIONS]
    if unknown:
        raise MetadataError(f"unknown device metadata version {unknown[0]!r} (known: {', '.join(VERSIONS)})")
    if len(set(chosen)) != len(chosen):
        raise MetadataError(f"device metadata versions repeat: {', '.join(chosen)}")
    if LATEST_VERSION not in chosen:
        raise MetadataError(
            f"device metadata versions must include the latest, {LATEST_VERSION} "
            f"(got {', '.join(chosen) or 'none'})"
        )
    return chosen


def plan_metadata(
    driver: str,
    claim: Mapping[str, Any],
    devices: Sequence[MetadataDevice],
    *,
    host_dir: str | os.PathLike[str],
    cdi_dir: str | os.PathLike[str],
    container_dir: str = CONTAINER_DIR,
    versions: Iterable[str] = DEFAULT_VERSIONS,
) -> MetadataPlan:
    """The metadata files and CDI specs of ``claim`` (a ResourceClaim as the API server sent it)
    for ``devices``, this driver's devices of the claim.

    One metadata file and one spec per request, in the order the requests first appear in
    ``devices``, with the request's devices in their order. A claim with the annotation
    ``resource.kubernetes.io/pod-claim-name`` is a template's: its files are mounted under
    ``resourceclaimtemplates/<that name>`` (an empty value counts as absent for the path but is
    written as the document's ``podClaimName``, as the Go helper does). No devices: nothing to
    write.

    Raises:
        MetadataError: a name would not make a safe path or a valid CDI name (names the API
            server accepts always do), a directory is not absolute, two subrequests of one
            request, or ``versions`` are not writable (:func:`check_versions`).
    """
    chosen = check_versions(versions)
    if not is_dns_subdomain(driver, 63):
        raise MetadataError(f"driver name {driver!r} is not a DNS subdomain of at most 63 characters")
    names = _claim_names(claim)
    host, cdi = Path(host_dir), Path(cdi_dir)
    for what, directory in (("host", str(host)), ("CDI", str(cdi)), ("container", container_dir)):
        if not PurePosixPath(directory).is_absolute():
            raise MetadataError(f"the metadata's {what} directory {directory!r} is not absolute")
    claim_dir = host / f"{names.namespace}_{names.name}"
    if names.pod_claim:
        mounted = PurePosixPath(container_dir, TEMPLATES_DIR, names.pod_claim)
    else:
        mounted = PurePosixPath(container_dir, CLAIMS_DIR, names.name)
    documents: list[MetadataFile] = []
    specs: list[MetadataFile] = []
    ids: dict[str, str] = {}
    for request, members in _by_request(names, devices).items():
        base = _base_request(request)
        document = _document(driver, names, request, members)
        metadata_file = MetadataFile(claim_dir / base, HOST_FILE, _stream(document, chosen))
        documents.append(metadata_file)
        cdi_name = f"{names.uid}_{base}"
        spec = _spec(driver, cdi_name, metadata_file.path, mounted / base / f"{driver}-metadata.json")
        specs.append(
            MetadataFile(cdi, f"{driver}_{CDI_CLASS}_{names.uid}_{base}.json", spec.to_json().encode())
        )
        ids[base] = spec.qualified_name(cdi_name)
    files = (*documents, *specs)
    directories = [str(f.directory) for f in documents]
    if documents:
        directories.append(str(claim_dir))
    record = MetadataRecord(files=tuple(str(f.path) for f in files), directories=tuple(directories))
    return MetadataPlan(files=files, cdi_device_ids=ids, record=record)


def claim_removal(
    driver: str,
    uid: str,
    namespace: str,
    name: str,
    requests: Iterable[str],
    *,
    host_dir: str | os.PathLike[str],
    cdi_dir: str | os.PathLike[str],
) -> MetadataRemoval:
    """What :func:`plan_metadata` wrote for a claim's ``requests`` (``gpu/small`` counts as
    ``gpu``; one that is not a DNS label never had files), worked out again from its names: for
    a claim recorded without a :class:`MetadataRecord` (by a version that did not keep one)."""
    claim_dir = Path(host_dir) / f"{namespace}_{name}"
    bases = list(dict.fromkeys(b for b in (r.partition("/")[0] for r in requests) if is_dns_label(b)))
    files = [str(claim_dir / b / HOST_FILE) for b in bases]
    files += [str(Path(cdi_dir) / f"{driver}_{CDI_CLASS}_{uid}_{b}.json") for b in bases]
    directories = [str(claim_dir / b) for b in bases]
    if bases:
        directories.append(str(claim_dir))
    return MetadataRemoval(files=tuple(files), directories=tuple(directories))


def add_cdi_ids(entries: Sequence[PreparedEntry], ids: Mapping[str, str]) -> list[PreparedEntry]:
    """``entries`` with each request's metadata CDI device (``ids``, from :class:`MetadataPlan`)
    added to the first entry that serves the request: the runtime then mounts the file once in
    every container that uses the request. A request no entry serves gets none."""
    added: set[str] = set()
    out = []
    for entry in entries:
        extra = []
        for request in entry.requests:
            base = request.partition("/")[0]
            cdi_id = ids.get(base)
            if cdi_id is not None and base not in added:
                added.add(base)
                if cdi_id not in entry.cdi_device_ids:
                    extra.append(cdi_id)
        out.append(replace(entry, cdi_device_ids=(*entry.cdi_device_ids, *extra)) if extra else entry)
    return out


def write_metadata(plan: MetadataPlan) -> None:
    """Write ``plan``'s files, each atomically, metadata files first (missing directories are
    made).

    Raises:
        OSError: a file could not be written; those before it are written.
    """
    for item in plan.files:
        write_atomically(item.directory, item.name, item.data, item.mode)


def remove_metadata(removal: MetadataRemoval) -> None:
    """Remove ``removal``'s files (a missing one is fine), then its directories that are empty.

    Raises:
        OSError: a file, or a directory that is empty, could not be removed.
    """
    for path in removal.files:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    for directory in removal.directories:
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise


# -- the document ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ClaimNames:
    uid: str
    namespace: str
    name: str
    pod_claim: str | None
    """The annotation's value (perhaps empty), None without it."""


def _claim_names(claim: Mapping[str, Any]) -> _ClaimNames:
    """The claim's names, checked to make safe paths and CDI names.

    Raises:
        MetadataError: one does not.
    """
    meta = claim.get("metadata") if isinstance(claim, dict) else None
    if not isinstance(meta, dict):
        raise MetadataError("the claim has no metadata")
    uid, namespace, name = (_field(meta, key) for key in ("uid", "namespace", "name"))
    if not _UID.fullmatch(uid):
        raise MetadataError(f"claim UID {uid!r} does not fit in a file name and a CDI device name")
    if not is_dns_label(namespace):
        raise MetadataError(f"claim namespace {namespace!r} is not a DNS label")
    if not is_dns_subdomain(name):
        raise MetadataError(f"claim name {name!r} is not a DNS subdomain")
    annotations = meta.get("annotations") or {}
    pod_claim = annotations.get(POD_CLAIM_NAME) if isinstance(annotations, dict) else None
    if pod_claim is not None and (
        not isinstance(pod_claim, str) or (pod_claim and not is_dns_label(pod_claim))
    ):
        raise MetadataError(f"annotation {POD_CLAIM_NAME} of the claim is not a DNS label: {pod_claim!r}")
    return _ClaimNames(uid, namespace, name, pod_claim)


def _by_request(names: _ClaimNames, devices: Sequence[MetadataDevice]) -> dict[str, list[MetadataDevice]]:
    """``devices`` by request, in the order the requests first appear.

    Raises:
        MetadataError: a request name is malformed, or two subrequests of one request.
    """
    out: dict[str, list[MetadataDevice]] = {}
    seen: dict[str, str] = {}
    for device in devices:
        base = _base_request(device.request)
        known = seen.setdefault(base, device.request)
        if known != device.request:
            raise MetadataError(
                f"claim {names.namespace}/{names.name}: devices for {known!r} and "
                f"{device.request!r}, two subrequests of request {base!r}"
            )
        out.setdefault(device.request, []).append(device)
    return out


def _spec(driver: str, cdi_name: str, host_path: Path, container_path: PurePosixPath) -> CdiSpec:
    """The CDI spec of one request: its one device mounts the metadata file read-only.

    Raises:
        MetadataError: the driver name is no CDI vendor name (it starts with a digit).
    """
    from devplug.cdi import CdiDevice, CdiMount, CdiSpec, ContainerEdits

    mount = CdiMount(host_path=str(host_path), container_path=str(container_path), options=MOUNT_OPTIONS)
    try:
        return CdiSpec(
            kind=f"{driver}/{CDI_CLASS}",
            devices=(CdiDevice(name=cdi_name, container_edits=ContainerEdits(mounts=(mount,))),),
        )
    except ValueError as exc:
        raise MetadataError(f"no valid CDI spec for {cdi_name}: {exc}") from None


def _document(
    driver: str, names: _ClaimNames, request: str, devices: Sequence[MetadataDevice]
) -> dict[str, Any]:
    """One request's ``DeviceMetadata``, fields in the Go types' order, empty ones left out as
    the Go encoder leaves them out. ``kind`` and ``apiVersion`` come first, set per version."""
    out: dict[str, Any] = {
        "kind": KIND,
        "apiVersion": "",
        "metadata": {"name": names.name, "namespace": names.namespace, "uid": names.uid, "generation": 1},
    }
    if names.pod_claim is not None:
        out["podClaimName"] = names.pod_claim
    out["requests"] = [{"name": request, "devices": [_device(driver, d) for d in devices]}]
    return out


def _device(driver: str, device: MetadataDevice) -> dict[str, Any]:
    out: dict[str, Any] = {"driver": driver, "pool": device.pool, "name": device.name}
    if device.attributes:
        out["attributes"] = {
            key: _known(value, _ATTRIBUTE_FIELDS, f"attribute {key} of device {device.name}", scalars=True)
            for key, value in sorted(device.attributes.items())
        }
    if device.network_data is not None:
        out["networkData"] = _known(
            device.network_data, _NETWORK_FIELDS, f"networkData of device {device.name}", scalars=False
        )
    return out


def _known(value: Mapping[str, Any], names: Sequence[str], where: str, *, scalars: bool) -> dict[str, Any]:
    """The fields of ``value`` the API's type has, in its order, left out where the Go encoder
    leaves them out: null, an empty list, and an empty string unless ``scalars`` (an attribute's
    values are pointers there, written even when empty). Unknown fields are not written."""
    if not isinstance(value, dict):
        raise MetadataError(f"{where} is not an object: {value!r:.60}")
    out = {}
    for name in names:
        item = value.get(name)
        if item is None or item == [] or (item == "" and not scalars):
            continue
        out[name] = item
    return out


def _stream(document: dict[str, Any], versions: Sequence[str]) -> bytes:
    """The document once per version, each as Go's indented JSON and a newline."""
    parts = []
    for version in versions:
        document["apiVersion"] = f"{GROUP}/{version}"
        parts.append(json.dumps(document, indent=2, ensure_ascii=False).translate(_GO_ESCAPES) + "\n")
    return "".join(parts).encode()


# -- fields ----------------------------------------------------------------------------------------


def _field(meta: Mapping[str, Any], key: str) -> str:
    value = meta.get(key)
    if not isinstance(value, str) or not value:
        raise MetadataError(f"the claim has no metadata.{key}")
    return value


def _base_request(request: str) -> str:
    base, _, sub = request.partition("/")
    if not is_dns_label(base) or (sub and not is_dns_label(sub)):
        raise MetadataError(f"request {request!r} is not <request> or <request>/<subrequest> of DNS labels")
    return base


def _paths(data: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    values = data.get(key)
    if values is None:
        return ()
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise MetadataError(f"{where}.{key} is not a list of paths: {values!r:.60}")
    return tuple(values)
