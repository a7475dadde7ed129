"""HTTP routes of colocated mode (`serve --colocated`): put the servers to sleep for the trainer's update,
then wake them with its checkpoint (admin token, both)."""

from pathlib import Path

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from otel_rl.auth import admin_required
from otel_rl.gateway.colocated import DEFAULT_SLEEP_LEASE_S, ColocatedUpdates
from otel_rl.gateway.proxy import Gateway
from otel_rl.gateway.reload import ReloadRejected

MAX_VERSION = 2**62  # spans store the version as a 64-bit integer


class Sleep(BaseModel):
    """Hold the gateway and put the servers to sleep; they wake by themselves after `lease_s` seconds."""

    lease_s: float = Field(DEFAULT_SLEEP_LEASE_S, gt=0, description="a sleep not woken by then ends")


class Wake(BaseModel):
    """Wake the servers with the trainer's new weights, served as `version`."""

    version: int = Field(ge=1, le=MAX_VERSION)
    checkpoint: str = Field(max_length=4096, description="the model folder the servers reload")


def colocated_router(gateway: Gateway) -> APIRouter:
    """The routes, over one ColocatedUpdates that shares the gateway's reload gate."""
    router = APIRouter(dependencies=[Depends(admin_required(gateway.auth))])
    updates = ColocatedUpdates(
        gateway.coordinator, gateway.client, gateway.metrics, timeout_s=gateway.settings.reload_timeout_s
    )

    @router.post("/v1/admin/policy/sleep")
    async def sleep(body: Sleep | None = None) -> Response:
        if not gateway.settings.colocated:
            return _error(409, "Conflict", "the gateway is not colocated: start it with `serve --colocated`")
        try:
            result = await updates.sleep(lease_s=(body or Sleep()).lease_s)
        except (ReloadRejected, ValueError) as error:
            return _error(409, "Conflict", str(error))
        return JSONResponse(result.to_json())

    @router.post("/v1/admin/policy/wake")
    async def wake(body: Wake) -> Response:
        if not Path(body.checkpoint).is_dir():  # still asleep: the trainer may retry with the right folder
            missing = f"no such folder on the gateway's machine: {body.checkpoint}"
            return _error(400, "BadRequestError", missing)
        try:
            result = await updates.wake(version=body.version, checkpoint=body.checkpoint)
        except ReloadRejected as error:
            return _error(409, "Conflict", str(error))
        report = result.to_json() | {"colocated_pause_ms": result.total_ms}
        # Some servers taken out: still 200 (the new version is live), the failures are in the body.
        return JSONResponse(report, 200 if result.ok else 502)

    return router


def _error(status: int, error_type: str, message: str) -> Response:
    return JSONResponse({"error": {"message": message, "type": error_type, "code": status}}, status)
