"""HTTP routes of the gateway: OpenAI-compatible calls, rollout keys, policy reloads."""

import asyncio
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from otel_rl.attributes import ATTEMPT_ID, GROUP_ID, SPLIT, TASK_ID
from otel_rl.auth import Forbidden, Unauthorized, admin_required
from otel_rl.gateway import messages
from otel_rl.gateway.attribution import key_identity
from otel_rl.gateway.colocated_routes import colocated_router
from otel_rl.gateway.errors import CallError, error_body, json_object
from otel_rl.gateway.external_routes import external_router
from otel_rl.gateway.protocols import Protocol, ProtocolError, Route, protocols
from otel_rl.gateway.proxy import Gateway
from otel_rl.gateway.reload import ReloadRejected
from otel_rl.gateway.request_fields import check_request
from otel_rl.http_body import BodyTooLarge, ClientGone, read_body
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
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"


class ModelCallRoutes:
    """ASGI middleware serving the model-call routes ahead of FastAPI's router: Chat Completions,
    Completions, the protocols translated into chat calls (`/v1/messages`, `/v1/responses`), Messages'
    `count_tokens`, and `HEAD /` (Claude Code's check that its base URL answers).

    The hot path: FastAPI's routing, dependency solving and exception layers cost about a fifth of the
    gateway's CPU per call (measured with py-spy), and these routes need none of them.
    """

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway
        self.protocols = protocols()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        operation = CALL_PATHS.get(path)
        if operation is not None and method == "POST":
            await self._call(scope, receive, send, operation, None, None)
        elif path in self.protocols and method == "POST":
            protocol, route = self.protocols[path]
            await self._call(scope, receive, send, "chat", protocol, route)
        elif path == COUNT_TOKENS_PATH and method == "POST":
            await self._count_tokens(scope, receive, send)
        elif path == "/" and method == "HEAD":
            await Response(status_code=200)(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _call(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        operation: str,
        protocol: Protocol | None,
        route: Route | None,
    ) -> None:
        request = Request(scope, receive)
        try:
            principal = self.gateway.principal(request.headers, route)
            response = await self.gateway.call(
                operation, principal, request.headers, await self._body(request), protocol
            )
        except CallError as error:
            response = error.response(protocol)
        except (Unauthorized, Forbidden, ValueError) as error:
            response = _refusal(error, protocol)
        await response(scope, receive, send)

    async def _body(self, request: Request) -> bytes:
        try:
            return await read_body(request, self.gateway.settings.max_request_bytes)
        except BodyTooLarge as error:
            raise CallError(413, f"the request {error}", "RequestTooLargeError") from None
        except ClientGone as error:  # logged by read_body; the answer reaches nobody
            raise CallError(400, str(error), "BadRequestError") from None

    async def _count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Messages' `count_tokens`: the prompt's length as vLLM renders it for the same request."""
        protocol, route = self.protocols["/v1/messages"]
        request = Request(scope, receive)
        try:
            self.gateway.principal(request.headers, route)
            body = json_object(await self._body(request))
            check_request(messages.API, body, self.gateway.settings.request_limits)
            tokenize = messages.count_tokens_request(body)
            response: Response = JSONResponse({"input_tokens": await self.gateway.count_tokens(tokenize)})
        except CallError as error:
            response = error.response(protocol)
        except (Unauthorized, ProtocolError) as error:
            response = _refusal(error, protocol)
        await response(scope, receive, send)


def gateway_router(gateway: Gateway) -> APIRouter:
    """The gateway's other routes, to include in the `otel-rl serve` app (with ModelCallRoutes).

    The admin routes check the admin token before their body. (Its metrics are in the server's /metrics.)
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
            identity = key_identity(
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

    @router.delete("/v1/admin/rollouts/{rollout_id}/key", dependencies=admin)
    async def revoke_rollout_keys(
        rollout_id: str, attempt_id: str | None = None, attempt_ended: bool = False
    ) -> Response:
        """Revoke the rollout's keys (of one attempt, with `attempt_id`): refused from now on. The controller
        sends `attempt_ended=true` when the attempt ends; the reason is in the refusal's message."""
        reason = f"attempt {attempt_id} ended" if attempt_ended and attempt_id else "revoked by the admin"
        try:
            revoked = await asyncio.to_thread(
                gateway.auth.revoke_rollout_keys, rollout_id, attempt_id, reason
            )
        except (Saturated, StoreUnavailable) as error:  # the revocation could not be stored: retry later
            content = error_body(503, str(error), "ServiceUnavailableError")
            return Response(content, 503, headers={"Retry-After": "1"}, media_type="application/json")
        return JSONResponse({"rollout_id": rollout_id, "attempt_id": attempt_id, "revoked": revoked})

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
                "colocated": gateway.settings.colocated,
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

    router.include_router(external_router(gateway))  # servers and weight updates verl runs
    router.include_router(colocated_router(gateway))  # sleep and wake around the trainer's update
    return router


def _refusal(error: Exception, protocol: Protocol | None = None) -> Response:
    status, error_type = {
        Unauthorized: (401, "AuthenticationError"),
        Forbidden: (403, "PermissionDeniedError"),
    }.get(type(error), (400, "BadRequestError"))
    body = (protocol.error_body if protocol else error_body)(status, str(error), error_type)
    return Response(body, status, media_type="application/json")
