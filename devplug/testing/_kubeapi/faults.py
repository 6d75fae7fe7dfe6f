"""Injected failures and the request record of FakeKubeAPI."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from devplug.testing._kubeapi.status import forbidden_error, injected

if TYPE_CHECKING:
    from devplug.testing._kubeapi.routes import Route
    from devplug.testing._kubeapi.status import APIError


class RecordedRequest(NamedTuple):
    """A request the server answered.

    ``verb`` is the Kubernetes verb (get, list, watch, create, update, patch, delete,
    deletecollection) or, for other paths, the method in lower case; ``path`` has no query.
    """

    verb: str
    path: str
    status: int


@dataclass
class Fault:
    """A failure injected by :meth:`FakeKubeAPI.fail`; ``remaining`` None means until cancelled."""

    status: int
    verbs: tuple[str, ...] | None
    resource: str | None
    name: str | None
    message: str | None
    remaining: int | None

    def matches(self, r: Route) -> bool:
        """Whether this fault answers the request ``r`` (a subresource is ``<plural>/<sub>``)."""
        resource = r.kind.plural + (f"/{r.subresource}" if r.subresource else "")
        return (
            (self.remaining is None or self.remaining > 0)
            and (self.verbs is None or r.verb in self.verbs)
            and (self.resource is None or self.resource == resource)
            and (self.name is None or self.name == r.name)
        )

    def error(self, r: Route, user: str) -> APIError:
        """The answer to ``r`` (counted): 403 in the RBAC authorizer's words, or the injected status."""
        if self.remaining is not None:
            self.remaining -= 1
        if self.status == 403 and self.message is None:
            return forbidden_error(
                r.kind.names,
                r.name,
                user=user,
                verb=r.verb,
                subresource=r.subresource,
                namespace=r.namespace or "",
            )
        return injected(self.status, self.message, r.kind.names, r.name)

    def cancel(self) -> None:
        """Stop injecting this failure."""
        self.remaining = 0
