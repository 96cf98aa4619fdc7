"""The REST routes for policies as programs, mounted under /v1 by ``create_app``.

```text
POST   /v1/policies                           🔑  {"filename", "source"}: verify, swap in -> 201 PolicyOut;
                                                  422 PolicyRejected: summary line, then "file:line: …" lines
GET    /v1/policies                               each family the server runs: built-in or file, faults, maps
DELETE /v1/policies/{family}                  🔑  unload: the built-in decides again -> PolicyOut
GET    /v1/policies/{family}/maps/{map}           every entry, sorted by key
GET    /v1/policies/{family}/maps/{map}/{key}     one entry; 404 when the key is not in the map
PUT    /v1/policies/{family}/maps/{map}/{key} 🔑  {"value": …} typed as the map declares -> MapEntryOut
DELETE /v1/policies/{family}/maps/{map}/{key} 🔑  remove the entry -> MapEntryOut (the value it held)
```
The server verifies the source itself (a client's own check proves nothing). Verifying and running the
file's module body happen here, outside the daemon's lock; only the swap takes it, so it lands between
two scheduling passes. Keys in the path are text, parsed as the map's key type ("3", "true", "ml").
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Depends

from gpuslice.programs.loader import load_source
from gpuslice.server.daemon import Daemon
from gpuslice.server.models import (
    ERROR_RESPONSES,
    MapEntryOut,
    MapOut,
    MapValueIn,
    PolicyIn,
    PolicyOut,
)

__all__ = ["policy_router"]


def policy_router(daemon: Daemon, authorized: Callable[..., None]) -> APIRouter:
    """The /v1/policies routes over ``daemon``; ``authorized`` is the app's bearer-token dependency."""
    router = APIRouter(prefix="/v1/policies", tags=["policies"], responses=ERROR_RESPONSES)
    auth = [Depends(authorized)]

    @router.post("", status_code=201, response_model=PolicyOut, dependencies=auth)
    def load(body: PolicyIn) -> PolicyOut:
        loaded = load_source(body.source, body.filename)  # PolicyRejected -> 422 with the violations
        return PolicyOut(**daemon.policy_admin.load_policy(loaded))

    @router.get("", response_model=list[PolicyOut])
    def list_policies() -> list[PolicyOut]:
        return [PolicyOut(**p) for p in daemon.policy_admin.policies()]

    @router.delete("/{family}", response_model=PolicyOut, dependencies=auth)
    def unload(family: str) -> PolicyOut:
        return PolicyOut(**daemon.policy_admin.unload_policy(family))

    @router.get("/{family}/maps/{name}", response_model=MapOut)
    def dump(family: str, name: str) -> MapOut:
        return MapOut(**daemon.policy_admin.policy_map(family, name))

    @router.get("/{family}/maps/{name}/{key:path}", response_model=MapEntryOut)
    def get_entry(family: str, name: str, key: str) -> MapEntryOut:
        return MapEntryOut(**daemon.policy_admin.policy_map_get(family, name, key))

    @router.put("/{family}/maps/{name}/{key:path}", response_model=MapEntryOut, dependencies=auth)
    def put_entry(family: str, name: str, key: str, body: MapValueIn) -> MapEntryOut:
        return MapEntryOut(**daemon.policy_admin.policy_map_update(family, name, key, body.value))

    @router.delete("/{family}/maps/{name}/{key:path}", response_model=MapEntryOut, dependencies=auth)
    def delete_entry(family: str, name: str, key: str) -> MapEntryOut:
        return MapEntryOut(**daemon.policy_admin.policy_map_delete(family, name, key))

    return router
