"""The groups of runner settings: one model per group, each field with its default, its
docstring (the ``--help`` text) and its validators.

:class:`devplug.settings.Settings` inherits every group, so a field keeps one flat name as flag,
``DEVPLUG_*`` variable, config-file key and attribute; a Settings is an instance of each group, and
code that reads one group may be typed with it (``def check(settings: KubeletGroup)``). Pure data:
pydantic only, no I/O beyond the environment variables two defaults read.
"""

# No ``from __future__ import annotations`` here: pydantic would compile every field's annotation
# string when each class is made, milliseconds of every start (see bench/startup.py).

import os
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from devplug._names import is_dns_subdomain
from devplug.health import HealthSettings

__all__ = [
    "BOTH_APIS",
    "GROUPS",
    "ApiGroup",
    "CdiGroup",
    "ConfigGroup",
    "DraGroup",
    "HealthGroup",
    "HostGroup",
    "KubeletGroup",
    "LoggingGroup",
    "MetricsGroup",
    "RegistrationGroup",
    "ServingGroup",
    "SettingsGroup",
    "fields_of",
    "group_of",
]


def _greater_than_zero(value: float) -> float:
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


_Seconds = Annotated[float, AfterValidator(_greater_than_zero)]
"""A duration in seconds, greater than 0."""


class SettingsGroup(BaseModel):
    """Fields of :class:`~devplug.settings.Settings` that belong together; a model of its own, not a
    settings source."""

    # SettingsConfigDict (a ConfigDict) so that Settings may inherit from a group and from
    # BaseSettings. No schema is built for a group until one is instantiated on its own.
    model_config = SettingsConfigDict(frozen=True, extra="forbid", defer_build=True)


BOTH_APIS = "device-plugin,dra"
"""The ``api`` value that serves the devices through both APIs, with one ledger of holders."""


class ApiGroup(SettingsGroup):
    """Which Kubernetes API the devices are served through."""

    api: Literal["device-plugin", "dra", "device-plugin,dra"] = "device-plugin"
    """Which Kubernetes API serves the devices: device-plugin (extended resources through the
    kubelet's device manager), dra (Dynamic Resource Allocation: ResourceSlices published
    through the API server, claims prepared for the kubelet; Kubernetes >= 1.34), or
    device-plugin,dra: both from one process, a device given through one withheld from the
    other until it is free (the kubelet's pod-resources API says which pods hold what)."""
    withhold_device_plugin_pods: bool = False
    """api=dra: keep every device that a running pod holds through a device plugin (the
    kubelet's pod-resources API says which) out of the slices until that pod ends: a node moves
    from a device plugin to DRA without draining (stop the device plugin, start the driver)."""
    pod_resources_interval: _Seconds = 10.0
    """Seconds between two reads of the kubelet's pod-resources API, when it is followed (both
    APIs served, or a node moving to DRA); it is also read soon after every Allocate."""

    @field_validator("api", mode="before")
    @classmethod
    def _api_list(cls, value: Any) -> Any:
        # "dra,device-plugin", "dra, device-plugin" and "both" name the same thing.
        if isinstance(value, str):
            parts = sorted({p.strip() for p in value.split(",") if p.strip()})
            if value.strip() == "both" or parts == ["device-plugin", "dra"]:
                return BOTH_APIS
        return value

    @property
    def serves_device_plugin(self) -> bool:
        """Whether the device-plugin API is served (alone or beside DRA)."""
        return self.api != "dra"

    @property
    def serves_dra(self) -> bool:
        """Whether DRA is served (alone or beside the device-plugin API)."""
        return self.api != "device-plugin"

    @property
    def keeps_ledger(self) -> bool:
        """Whether the holders of both APIs are followed (both APIs, or the migration mode)."""
        return self.api == BOTH_APIS or (self.api == "dra" and self.withhold_device_plugin_pods)


class KubeletGroup(SettingsGroup):
    """Where the kubelet's directories and socket are, and how far their permissions are trusted."""

    kubelet_root: Path = Path("/var/lib/kubelet")
    """The kubelet's root directory; device-plugins/, plugins_registry/ and plugins/ are found
    under it unless given one by one (k3s: /var/lib/rancher/k3s/agent/kubelet)."""
    device_plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    """The kubelet's device-plugin directory (default: device-plugins under kubelet_root)."""
    kubelet_socket: Path | None = None
    """The kubelet's registration socket; default: kubelet.sock in the device-plugin directory."""
    plugins_registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    """The kubelet's plugin-watcher directory (registration=watcher, and api=dra); default:
    plugins_registry under kubelet_root."""
    insecure_dir: Literal["refuse", "warn"] = "refuse"
    """A kubelet directory this process uses (device-plugin, plugins_registry, the kubelet
    socket's) that every user may write to, or that lies under such a directory without the
    sticky bit: anyone could then replace the kubelet's socket or this plugin's. refuse exits
    at start with one line (status 2) naming it; warn logs insecure_directory and starts."""

    @model_validator(mode="before")
    @classmethod
    def _under_kubelet_root(cls, data: Any) -> Any:
        # The kubelet's directories follow --kubelet-root unless they are given themselves.
        if isinstance(data, dict) and data.get("kubelet_root") is not None:
            root = Path(data["kubelet_root"])
            data = dict(data)
            data.setdefault("device_plugin_dir", root / "device-plugins")
            data.setdefault("plugins_registry_dir", root / "plugins_registry")
        return data

    @property
    def dra_plugins_dir(self) -> Path:
        """``<kubelet_root>/plugins``: each DRA driver's socket and state live in a directory in it."""
        return self.kubelet_root / "plugins"

    @property
    def kubelet_socket_path(self) -> Path:
        return self.kubelet_socket or self.device_plugin_dir / "kubelet.sock"

    @property
    def pod_resources_socket(self) -> Path:
        """``<kubelet_root>/pod-resources/kubelet.sock``: the kubelet's pod-resources API."""
        return self.kubelet_root / "pod-resources" / "kubelet.sock"


class RegistrationGroup(SettingsGroup):
    """How a device plugin registers with the kubelet, and how long it keeps trying."""

    registration: Literal["kubelet", "watcher"] = "kubelet"
    """kubelet: Register on kubelet.sock; watcher: a socket in the plugins_registry directory."""
    endpoint_host_dir: Path | None = None
    """registration=watcher: the plugins_registry directory as the host sees it, when this process
    sees it at another path (a container mount); default: let the kubelet use the path it found."""
    register_timeout: _Seconds = 15.0
    """Seconds one Register call may take (kubelet >= 1.26 dials back within it, 10 s at most)."""
    retry_initial: _Seconds = 0.05
    """Seconds before the first Register retry; doubles per failure, jittered."""
    retry_max: _Seconds = 10.0
    """Cap, in seconds, of the delay between Register retries (retries never stop)."""


class ServingGroup(SettingsGroup):
    """How the gRPC servers stop."""

    shutdown_grace: _Seconds = 0.5
    """Seconds in-flight RPCs get to finish on shutdown or restart."""


class LoggingGroup(SettingsGroup):
    """What is logged and how it is written (changes apply on a reload)."""

    log_format: Literal["auto", "json", "console"] = "auto"
    """auto: JSON when stderr (where logs go) is not a terminal, console otherwise."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged."""

    @field_validator("log_format", "log_level", mode="before")
    @classmethod
    def _lower_case(cls, value: Any) -> Any:
        # Levels are written DEBUG as often as debug (Python's logging, NVIDIA's flags).
        return value.lower() if isinstance(value, str) else value


class MetricsGroup(SettingsGroup):
    """The HTTP endpoint of metrics, probes and state."""

    metrics_address: str | None = None
    """HOST:PORT (or :PORT for every interface) serving /metrics, /healthz, /readyz and
    /debug/state; off unless set (needs the metrics extra: pip install 'devplug[metrics]')."""

    @field_validator("metrics_address")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^\s:\[\]]*):\d{1,5}", value):
            raise ValueError("expected HOST:PORT, :PORT or [IPv6]:PORT")
        if value is not None and int(value.rpartition(":")[2]) > 65535:
            raise ValueError("port must be at most 65535")
        return value


class ConfigGroup(SettingsGroup):
    """The config file the other settings may come from."""

    config: Path | None = None
    """A YAML or JSON file of settings (field names as keys); flags and DEVPLUG_* override it."""


class CdiGroup(SettingsGroup):
    """Where Container Device Interface specs go."""

    cdi_dir: Path = Path("/var/run/cdi")
    """Where the CDI specs of plugins that define cdi_spec are written (runtimes read it)."""


class HostGroup(SettingsGroup):
    """How the host paths a plugin hands to the runtime are checked."""

    host_path_check: Literal["off", "warn", "refuse"] = "warn"
    """Host paths of the device nodes and mounts that Allocate answers (and, under DRA, the
    default prepare of a claim) that are missing: refuse fails the allocation or the claim with
    the path named, warn logs it, off checks nothing."""
    host_root: Path = Path("/")
    """Where this process sees the host's root filesystem (e.g. /host in a container); host
    paths are checked under it."""


class DraGroup(SettingsGroup):
    """api=dra: the driver's name, its node and pod, and the API server."""

    driver_name: str | None = None
    """api=dra: the DRA driver name (a DNS subdomain, e.g. gpu.example.com), identical in
    ResourceSlices, DeviceClass selectors and claims; default: the resource name turned around
    (example.com/gpu -> gpu.example.com)."""
    node_name: str | None = Field(default_factory=lambda: os.environ.get("NODE_NAME") or None)
    """api=dra: this node's name, the owner and pool of the published ResourceSlices (default:
    the NODE_NAME environment variable, set from spec.nodeName through the downward API)."""
    kubeconfig: Path | None = None
    """api=dra: a kubeconfig file for the API server; default: the pod's service account
    (in-cluster), else $KUBECONFIG or ~/.kube/config."""
    pod_uid: str | None = Field(default_factory=lambda: os.environ.get("POD_UID") or None)
    """api=dra: this pod's UID (default: the POD_UID environment variable); when set, the
    sockets carry it, so an old and a new pod of a rolling update serve side by side."""

    list_attributes: bool = False
    """api=dra: publish list-valued attributes (KEP-5491, alpha: the API server and scheduler
    need the DRAListTypeAttributes feature), and resource.kubernetes.io/numaNode as the list of
    a device's NUMA nodes; off: list attributes are left out, numaNode is the first node."""
    device_metadata: bool = False
    """api=dra: per prepared claim and request, write the devices' attributes as a metadata file
    and a CDI spec mounting it in the containers at
    /var/run/kubernetes.io/dra-device-attributes/ (KEP-5304, as the Go helper's
    EnableDeviceMetadata, off by default there too)."""
    device_metadata_versions: tuple[str, ...] = ("v1beta1", "v1alpha1")
    """api=dra: the metadata.resource.k8s.io versions each metadata file holds, in order
    (v1beta1 is required; v1alpha1 for readers built against Kubernetes 1.36)."""

    @field_validator("device_metadata_versions")
    @classmethod
    def _metadata_versions(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from devplug._dra.metadata import check_versions

        return check_versions(value)

    @field_validator("driver_name")
    @classmethod
    def _driver_name(cls, value: str | None) -> str | None:
        if value is not None and not is_dns_subdomain(value, 63):
            raise ValueError(
                "a DRA driver name is a lowercase DNS subdomain of at most 63 characters "
                "(letters, digits, '-' and '.', e.g. gpu.example.com)"
            )
        return value

    @field_validator("node_name")
    @classmethod
    def _node_name(cls, value: str | None) -> str | None:
        if value is not None and not is_dns_subdomain(value, 253):
            raise ValueError("a node name is a lowercase DNS subdomain of at most 253 characters")
        return value


class HealthGroup(SettingsGroup):
    """The health policy's thresholds (a nested model: --health.*, health: in a config file)."""

    health: HealthSettings = HealthSettings()
    """Health policy thresholds for plugins that use devplug.health (health: in a config file)."""


GROUPS: Mapping[str, type[SettingsGroup]] = MappingProxyType(
    {
        "api": ApiGroup,
        "kubelet": KubeletGroup,
        "registration": RegistrationGroup,
        "serving": ServingGroup,
        "logging": LoggingGroup,
        "metrics": MetricsGroup,
        "config": ConfigGroup,
        "cdi": CdiGroup,
        "host": HostGroup,
        "dra": DraGroup,
        "health": HealthGroup,
    }
)
"""Group name → its model, in the order --help shows them."""


def fields_of(group: str) -> tuple[str, ...]:
    """The names of the settings in ``group`` (a key of :data:`GROUPS`), in their order.

    Raises:
        KeyError: no group of that name.
    """
    return tuple(GROUPS[group].model_fields)


def group_of(field: str) -> str | None:
    """The group ``field`` of :class:`~devplug.settings.Settings` belongs to; None for a backend's
    own setting."""
    return next((name for name, group in GROUPS.items() if field in group.model_fields), None)
