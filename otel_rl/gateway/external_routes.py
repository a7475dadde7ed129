"""HTTP routes for inference servers and weight updates run by someone else (verl's replicas and its
checkpoint engine): register and deregister servers, pause → commit or abort (admin token, all of them)."""

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from otel_rl.auth import admin_required
from otel_rl.gateway.external_reload import DEFAULT_LEASE_S, ExternalReloads
from otel_rl.gateway.proxy import Gateway
from otel_rl.gateway.registration import (
    RegistrationRefused,
    ServerNotRegistered,
    ServerUnreachable,
    deregister,
    register,
)
from otel_rl.gateway.reload import ReloadRejected

MAX_URL_CHARS = 2048
MAX_VERSION = 2**62  # spans store the version as a 64-bit integer


class ServerRegistration(BaseModel):
    """A running vLLM server (started with VLLM_SERVER_DEV_MODE=1) to route calls to."""

    url: str = Field(max_length=MAX_URL_CHARS, description="http://HOST:PORT or http://HOST:PORT/v1")


class ExternalPause(BaseModel):
    """Hold the gateway for a weight update made by someone else, for at most `lease_s` seconds."""

    version: int | None = Field(None, ge=1, le=MAX_VERSION, description="the version to commit; default +1")
    lease_s: float = Field(DEFAULT_LEASE_S, description="the lease ends by itself after this long")


class LeaseEnd(BaseModel):
    lease: str = Field(max_length=64, description="the lease `pause` answered with")


def external_router(gateway: Gateway) -> APIRouter:
    """The routes, over one ExternalReloads that shares the gateway's reload gate."""
    router = APIRouter(dependencies=[Depends(admin_required(gateway.auth))])
    updates = ExternalReloads(
        gateway.coordinator, gateway.client, gateway.metrics, timeout_s=gateway.settings.reload_timeout_s
    )
    timeout_s = gateway.settings.reload_timeout_s

    @router.post("/v1/admin/servers")
    async def register_server(body: ServerRegistration) -> Response:
        try:
            server = await register(
                gateway.pool, gateway.coordinator, gateway.client, body.url, timeout_s=timeout_s
            )
        except (RegistrationRefused, ServerUnreachable, ValueError) as error:
            return _error(error)
        return JSONResponse({"url": server.url, "available": server.available, "servers": _urls(gateway)})

    @router.delete("/v1/admin/servers")
    async def deregister_server(url: str = Query(max_length=MAX_URL_CHARS)) -> Response:
        try:
            server = deregister(gateway.pool, gateway.coordinator, url)
        except (RegistrationRefused, ServerNotRegistered, ValueError) as error:
            return _error(error)
        return JSONResponse({"url": server.url, "removed": True, "servers": _urls(gateway)})

    @router.post("/v1/admin/policy/pause")
    async def pause(body: ExternalPause | None = None) -> Response:
        given = body or ExternalPause()
        try:
            lease = await updates.pause(version=given.version, lease_s=given.lease_s)
        except (ReloadRejected, ValueError) as error:
            return _error(error)
        return JSONResponse(lease.to_json())

    @router.post("/v1/admin/policy/commit")
    async def commit(body: LeaseEnd) -> Response:
        try:
            result, outcome = await updates.commit(body.lease)
        except ReloadRejected as error:
            return _error(error)
        report = result.to_json() | {"outcome": outcome}
        if outcome == "unchanged":
            message = f"no server's weights changed: the policy stays at version {result.version}"
            return JSONResponse(report | _error_body(409, "Conflict", message), 409)
        # Some servers taken out: still 200 (the new version is live), the failures are in the body.
        return JSONResponse(report, 200 if result.ok else 502)

    @router.post("/v1/admin/policy/abort")
    async def abort(body: LeaseEnd) -> Response:
        try:
            result, outcome = await updates.abort(body.lease)
        except ReloadRejected as error:
            return _error(error)
        return JSONResponse(result.to_json() | {"outcome": outcome})

    return router


STATUSES = {
    RegistrationRefused: (409, "Conflict"),
    ServerNotRegistered: (404, "NotFoundError"),
    ServerUnreachable: (502, "BadGatewayError"),
}


def _error(error: Exception) -> Response:
    status, error_type = next(
        (status for kind, status in STATUSES.items() if isinstance(error, kind)),
        (409, "Conflict") if isinstance(error, ReloadRejected) else (400, "BadRequestError"),
    )
    return JSONResponse(_error_body(status, error_type, str(error)), status)


def _error_body(status: int, error_type: str, message: str) -> dict:
    return {"error": {"message": message, "type": error_type, "code": status}}


def _urls(gateway: Gateway) -> list[str]:
    return [server.url for server in gateway.pool.servers]
