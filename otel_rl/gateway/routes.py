"""HTTP routes of the gateway: OpenAI-compatible calls, rollout keys, policy reloads, metrics."""

from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from otel_rl.attributes import ATTEMPT_ID, GROUP_ID, SPLIT, TASK_ID
from otel_rl.auth import Forbidden, Unauthorized, admin_required
from otel_rl.gateway.proxy import CallError, Gateway, error_body
from otel_rl.gateway.reload import ReloadRejected
from otel_rl.store import Saturated, StoreUnavailable


class RolloutKeyRequest(BaseModel):
    """The rest of the rollout's identity: applied to every call made with its key."""

    attempt_id: str | None = None
    group_id: str | None = None
    task_id: str | None = None
    split: str | None = None


class PolicyUpdate(BaseModel):
    """New weights for every server: a full checkpoint folder or a LoRA adapter folder, and its version."""

    version: int
    checkpoint: str | None = None
    lora_adapter: str | None = None


CALL_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion"}


class ModelCallRoutes:
    """ASGI middleware serving `POST /v1/chat/completions` and `/v1/completions` ahead of FastAPI's router.

    The hot path: FastAPI's routing, dependency solving and exception layers cost about a fifth of the
    gateway's CPU per call (measured with py-spy), and these two routes need none of them.
    """

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        operation = CALL_PATHS.get(scope["path"]) if scope["type"] == "http" else None
        if operation is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            principal = self.gateway.principal(request.headers)
            response = await self.gateway.call(operation, principal, request.headers, await request.body())
        except CallError as error:
            response = error.response()
        except (Unauthorized, Forbidden, ValueError) as error:
            response = _refusal(error)
        await response(scope, receive, send)


def gateway_router(gateway: Gateway, *, public_metrics: bool = False) -> APIRouter:
    """The gateway's other routes, to include in the `otel-rl serve` app (with ModelCallRoutes).

    The admin routes (and /metrics unless `public_metrics`) check the admin token before their body.
    """
    router = APIRouter()
    admin = [Depends(admin_required(gateway.auth))]

    @router.get("/v1/models")
    async def models(request: Request) -> Response:
        try:
            gateway.principal(request.headers)
            return await gateway.models()
        except CallError as error:
            return error.response()
        except Unauthorized as error:
            return _refusal(error)

    @router.post("/v1/admin/rollouts/{rollout_id}/key", dependencies=admin)
    async def issue_rollout_key(rollout_id: str, body: RolloutKeyRequest | None = None) -> Response:
        try:
            given = body or RolloutKeyRequest()
            identity = gateway.identities.register(
                rollout_id,
                {
                    ATTEMPT_ID: given.attempt_id,
                    GROUP_ID: given.group_id,
                    TASK_ID: given.task_id,
                    SPLIT: given.split,
                },
            )
            key = gateway.auth.issue_rollout_key(rollout_id, identity)
        except ValueError as error:
            return _refusal(error)
        except (Saturated, StoreUnavailable) as error:  # the key's hash could not be stored: retry later
            content = error_body(503, str(error), "ServiceUnavailableError")
            return Response(content, 503, headers={"Retry-After": "1"}, media_type="application/json")
        return JSONResponse({"rollout_id": rollout_id, "key": key, "identity": identity})

    @router.get("/v1/admin/policy", dependencies=admin)
    async def current_policy() -> Response:
        policy = gateway.coordinator.policy
        servers = [
            {"url": s.url, "available": s.available, "healthy": s.healthy, "out_reason": s.out_reason}
            for s in gateway.pool.servers
        ]
        last = gateway.coordinator.last_result
        return JSONResponse(
            {
                "version": policy.version,
                "checkpoint": policy.checkpoint,
                "lora_adapter": policy.lora_adapter,
                "servers": servers,
                "last_reload": last.to_json() if last else None,
            }
        )

    @router.post("/v1/admin/policy", dependencies=admin)
    async def reload_policy(update: PolicyUpdate) -> Response:
        try:
            folder = update.checkpoint or update.lora_adapter
            if folder is not None and not Path(folder).is_dir():
                raise ValueError(f"no such folder on the gateway's machine: {folder}")
            result = await gateway.reload(
                version=update.version, checkpoint=update.checkpoint, lora_adapter=update.lora_adapter
            )
        except ReloadRejected as error:
            return JSONResponse({"error": {"message": str(error), "type": "Conflict", "code": 409}}, 409)
        except ValueError as error:
            return _refusal(error)
        # Some servers taken out: still 200 (the new version is live), the failures are in the body.
        return JSONResponse(result.to_json(), 200 if result.ok else 502)

    @router.get("/metrics", dependencies=[] if public_metrics else admin)
    async def metrics() -> Response:
        return PlainTextResponse(
            gateway.metrics.render(gateway.coordinator, gateway.pool), media_type="text/plain; version=0.0.4"
        )

    return router


def _refusal(error: Exception) -> Response:
    status, error_type = {
        Unauthorized: (401, "AuthenticationError"),
        Forbidden: (403, "PermissionDeniedError"),
    }.get(type(error), (400, "BadRequestError"))
    return Response(error_body(status, str(error), error_type), status, media_type="application/json")
