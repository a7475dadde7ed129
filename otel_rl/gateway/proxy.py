"""The OpenAI-compatible proxy: admits a call, sends it to the rollout's vLLM server, relays, records it."""

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import Any

import aiohttp
import orjson
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from otel_rl.attributes import GATEWAY_SCOPE, ROLLOUT_ID, SPLIT
from otel_rl.auth import Auth, Principal, Unauthorized
from otel_rl.collector.ingest import ingest_traces
from otel_rl.gateway.attribution import caller_identity, trace_parent
from otel_rl.gateway.client import UpstreamClient, UpstreamError, upstream_error
from otel_rl.gateway.errors import CallError, json_object, vllm_error
from otel_rl.gateway.export import gateway_tracer_provider, otlp_forwarder
from otel_rl.gateway.metrics import GatewayMetrics
from otel_rl.gateway.outputs import StreamAssembler, parse_chat_response, parse_completion_response
from otel_rl.gateway.protocols import Protocol, ProtocolError, ProtocolStream, Route
from otel_rl.gateway.recording import OPERATION_APIS, CallRecord
from otel_rl.gateway.relay import StreamFailed, relay_events, sse_error
from otel_rl.gateway.reload import GatewayPaused, ReloadCoordinator
from otel_rl.gateway.reload_result import ReloadResult
from otel_rl.gateway.request_fields import check_request
from otel_rl.gateway.rescoring import constraints, policy_logprobs
from otel_rl.gateway.servers import InferenceServer, NoServerAvailable, ServerPool, retry_delay_s
from otel_rl.gateway.settings import GatewaySettings
from otel_rl.gateway.span_rows import CallSpanWriter
from otel_rl.gateway.upstream import ClientAsked, SSEEvents, strip_response, upstream_body
from otel_rl.store import Store

log = logging.getLogger(__name__)

PATHS = {"chat": "/v1/chat/completions", "text_completion": "/v1/completions"}
ABORTED = '"finish_reason":"abort"'  # vLLM's compact JSON for a call cut by `/pause?mode=abort`
RELOAD_RETRY_AFTER_S = 1


class Gateway:
    """Routes, relays and records model calls; owns the HTTP client, server pool and reload coordinator."""

    def __init__(self, settings: GatewaySettings, *, auth: Auth, store: Store) -> None:
        self.settings = settings
        self.auth = auth
        self.metrics = GatewayMetrics()
        self.pool = ServerPool(settings.servers)
        forward = otlp_forwarder(settings.forward_otlp) if settings.forward_otlp else None
        self.tracer_provider = gateway_tracer_provider(
            partial(ingest_traces, store), flush_ms=settings.span_flush_ms, forward=forward
        )
        self.tracer = self.tracer_provider.get_tracer(GATEWAY_SCOPE)  # reload spans
        self.call_spans = CallSpanWriter(
            store.submit, self.tracer_provider.resource, flush_ms=settings.span_flush_ms, forward=forward
        )
        self.client = UpstreamClient(
            connect_timeout_s=settings.connect_timeout_s, read_timeout_s=settings.upstream_timeout_s
        )
        self.coordinator = ReloadCoordinator(
            self.pool,
            self.client,
            self.tracer,
            pause_wait_s=settings.pause_wait_s,
            drain_timeout_s=settings.drain_timeout_s,
            reload_timeout_s=settings.reload_timeout_s,
        )
        self._health_task: asyncio.Task | None = None
        self._scoring: set[asyncio.Task] = set()  # streamed calls being scored after their relay ended

    async def start(self) -> None:
        await self.client.start()
        self._health_task = asyncio.create_task(self._probe_forever())

    async def stop(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
        await asyncio.gather(*self._scoring, return_exceptions=True)  # their spans are recorded when done
        await self.client.close()
        self.call_spans.close()  # stores the spans still queued
        self.tracer_provider.shutdown()

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            await self.pool.probe(self.client, timeout_s=self.settings.connect_timeout_s)

    # ------------------------------------------------------------------ a call

    def principal(self, headers: Mapping[str, str], route: Route | None = None) -> Principal:
        """Who calls: `Authorization: Bearer`, or the route's own key header (Anthropic's `x-api-key`)."""
        authorization = headers.get("authorization")
        if authorization is None and route is not None and route.api_key_header is not None:
            key = headers.get(route.api_key_header)
            if not key:
                header = route.api_key_header
                raise Unauthorized(
                    f"missing API key: send '{header}: <token>' or 'Authorization: Bearer <token>'"
                )
            authorization = f"Bearer {key}"
        return self.auth.authenticate(authorization)

    async def call(
        self,
        operation: str,
        principal: Principal,
        headers: Mapping[str, str],
        raw: bytes,
        protocol: Protocol | None = None,
    ) -> Response:
        """Relay one chat or completions call and record it; a `protocol`'s call is translated into a chat
        call (what the model sees, and what is recorded) and its answer back into the protocol's shape."""
        request = body = json_object(raw)
        api = protocol.API if protocol is not None else OPERATION_APIS[operation]
        try:  # bounds first: nothing is translated, allocated or sent for a request over a limit
            check_request(api, request, self.settings.request_limits)
            if protocol is not None:
                body = protocol.chat_request(request)
                check_request("chat_completions", body, self.settings.request_limits)  # what vLLM gets
        except ProtocolError as error:
            raise CallError(400, str(error), "BadRequestError") from None
        if operation == "text_completion" and not isinstance(body.get("prompt"), str | None):
            prompt = body["prompt"]
            if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
                raise CallError(
                    400, "send one prompt per call (a string or a list of token ids)", "BadRequestError"
                )
        identity = caller_identity(principal, headers)
        parent = trace_parent(headers)
        try:
            policy = await self.coordinator.admit()
        except GatewayPaused as paused:
            raise CallError(503, str(paused), "ServiceUnavailableError", paused.retry_after_s) from None
        forced = self.settings.split_sampling.get(identity.get(SPLIT, ""), {})
        sent, asked = upstream_body(operation, body, forced, policy.served_model)
        record = CallRecord(operation, body, sent, identity, parent, policy.version, time.time_ns())
        if protocol is not None:
            record.api = protocol.API
        relaying = False  # a relayed stream releases its admission when it ends
        try:
            try:
                server, response = await self._send(
                    PATHS[operation], orjson.dumps(sent), identity.get(ROLLOUT_ID), record
                )
            except CallError as error:
                record.error_type, record.error_message = error.span_error_type, str(error)
                return self._finish(record, error.response(protocol))
            if sent.get("stream") and response.status == 200:
                relaying = True
                stream = protocol.Stream(request) if protocol is not None else None
                return self._relay_stream(record, asked, server, response, stream)
            try:
                content = await self.client.read(response)
            except UpstreamError as error:
                return self._finish(record, self._upstream_failure(record, error).response(protocol))
            finally:
                response.release()
                server.in_flight -= 1
            answer = self._answer(record, asked, response.status, content, protocol, request)
            await self._score(record)
            return self._finish(record, answer)
        finally:
            if not relaying:
                self.coordinator.release()

    async def _send(
        self, path: str, content: bytes, rollout_id: str | None, record: CallRecord
    ) -> tuple[InferenceServer, aiohttp.ClientResponse]:
        """Send to the rollout's server, retrying only connects that failed (nothing reached vLLM, so the
        call cannot be generating there): on another available server at once, else after a backoff, and
        while every server is down by waiting for one to answer its probe, until the call's deadline."""
        deadline = time.monotonic() + self.settings.upstream_timeout_s
        tried: tuple[InferenceServer, ...] = ()  # servers whose connect failed since the last backoff
        retries = 0
        while True:
            try:
                server = self.pool.pick(rollout_id, exclude=tried)
            except NoServerAvailable as error:
                left_s = deadline - time.monotonic()
                if not (tried or self.pool.may_recover) or left_s <= 0:
                    message = str(error)
                    if left_s <= 0:
                        message += f"; waited {self.settings.upstream_timeout_s:g} s (--upstream-timeout)"
                    raise CallError(503, message, "ServiceUnavailableError", RELOAD_RETRY_AFTER_S) from None
                await asyncio.sleep(min(retry_delay_s(retries), left_s))
                retries += 1
                tried = ()
                if self.pool.may_recover:
                    with contextlib.suppress(TimeoutError):  # the deadline passes during the probe
                        async with asyncio.timeout(deadline - time.monotonic()):
                            await self.pool.reprobe(self.client, timeout_s=self.settings.connect_timeout_s)
                continue
            record.server_url = server.url
            server.in_flight += 1
            try:
                response = await self.client.send(server.url + path, content)
            except UpstreamError as error:
                server.in_flight -= 1
                if error.kind != "connect":
                    raise self._upstream_failure(record, error) from None
                if server.connect_failed(str(error)):
                    log.warning("inference server %s left the pool: %s", server.url, error)
                tried += (server,)
                continue
            except BaseException:  # cancelled: the call is not in flight any more
                server.in_flight -= 1
                raise
            server.consecutive_connect_failures = 0
            return server, response

    def _answer(
        self,
        record: CallRecord,
        asked: ClientAsked,
        status: int,
        content: bytes,
        protocol: Protocol | None,
        request: dict[str, Any],
    ) -> Response:
        """The client's response to a non-streaming call, and its outcome on the record."""
        if status != 200:
            message, error_type = vllm_error(content)
            record.error_type, record.error_message = str(status), message
            if protocol is not None:
                content = protocol.error_body(status, message, error_type)
            return Response(content, status, media_type="application/json")
        response = orjson.loads(content)
        parse = parse_chat_response if record.operation == "chat" else parse_completion_response
        record.output = parse(response)
        if any(choice.finish_reason == "abort" for choice in record.output.choices):
            error = CallError(
                503, "the call was aborted for a weight reload; retry it", "ServiceUnavailableError", 1
            )
            record.error_type, record.error_message = "aborted", str(error)
            return error.response(protocol)
        if protocol is not None:
            try:
                content = orjson.dumps(protocol.response_body(response, request))
            except ProtocolError as error:  # the model's answer has no form in the protocol
                record.error_type, record.error_message = "untranslatable_response", str(error)
                return CallError(502, str(error), "BadGatewayError").response(protocol)
        elif not asked.everything:
            content = orjson.dumps(strip_response(response, asked))
        return Response(content, 200, media_type="application/json")

    def _relay_stream(
        self,
        record: CallRecord,
        asked: ClientAsked,
        server: InferenceServer,
        response: aiohttp.ClientResponse,
        stream: ProtocolStream | None,
    ) -> StreamingResponse:
        """Relay vLLM's chunks (or `stream`'s translation of them) as they come; assemble for the span."""
        assembler = StreamAssembler(record.operation)
        stream_error = stream.error if stream is not None else sse_error

        async def relay() -> AsyncIterator[bytes]:
            sse = SSEEvents()
            try:
                async for data in response.content.iter_any():
                    if record.time_to_first_chunk_s is None:
                        record.time_to_first_chunk_s = (time.time_ns() - record.start_ns) / 1e9
                    payloads = sse.feed(data)
                    if any(ABORTED in payload for payload in payloads):
                        record.error_type, record.error_message = "aborted", "aborted for a weight reload"
                        message = "the call was aborted for a weight reload; retry it"
                        yield stream_error(503, message, "ServiceUnavailableError")
                        return
                    relayed = relay_events(payloads, assembler, asked, data, stream)
                    if relayed:
                        yield relayed
            except StreamFailed as failed:  # vLLM's error event, in a protocol's stream: its last event
                record.error_type, record.error_message = str(failed.status), str(failed)
                yield failed.translated + stream_error(failed.status, str(failed), failed.error_type)
            except (aiohttp.ClientError, TimeoutError) as error:
                failure = self._upstream_failure(record, upstream_error(server.url, error))
                yield stream_error(failure.status, str(failure), failure.error_type)
            finally:
                if assembler.finished:
                    response.release()
                else:  # the client left or the call failed: dropping the connection makes vLLM abort it
                    response.close()
                server.in_flight -= 1
                if record.error_type is None and not assembler.finished:
                    record.error_type, record.error_message = (
                        "client_disconnected",
                        "the client left mid-stream",
                    )
                record.output = assembler.output
                if self._scored(record):
                    # in a task of its own: the relay is cancelled as soon as the client, which has every
                    # chunk already, leaves; the task releases the admission once the call is scored
                    task = asyncio.create_task(self._score_then_finish(record))
                    self._scoring.add(task)
                    task.add_done_callback(self._scoring.discard)
                else:
                    self.coordinator.release()
                    self._finish(record, None)

        return StreamingResponse(relay(), media_type="text/event-stream")

    @staticmethod
    def _scored(record: CallRecord) -> bool:
        """Whether a call needs the scoring pass: it succeeded and vLLM sampled it under constraints."""
        return (
            record.error_type is None
            and record.output is not None
            and record.server_url is not None
            and bool(constraints(record.sent))
        )

    async def _score(self, record: CallRecord) -> None:
        """Give a constrained call the policy's logprobs (rescoring.py) while it still holds its admission: a
        reload waits for it, so the server scores it with the weights that sampled it."""
        if self._scored(record):
            assert record.output is not None and record.server_url is not None  # _scored checked both
            record.logprobs_source = await policy_logprobs(
                self.client, record.server_url, record.sent, record.output, self.settings.upstream_timeout_s
            )

    async def _score_then_finish(self, record: CallRecord) -> None:
        try:
            await self._score(record)
        finally:
            self.coordinator.release()
            self._finish(record, None)

    def _upstream_failure(self, record: CallRecord, error: UpstreamError) -> CallError:
        """The client's error for a transport failure between the gateway and vLLM, noted on the record."""
        if error.kind == "timeout":
            message = f"the inference server did not answer in time: {error}"
            failure = CallError(504, message, "TimeoutError", span_error_type="upstream_timeout")
        else:
            message = f"the inference server failed mid-call: {error}"
            failure = CallError(502, message, "BadGatewayError", span_error_type="upstream_disconnected")
        record.error_type, record.error_message = failure.span_error_type, message
        return failure

    def _finish(self, record: CallRecord, response: Response | None) -> Response | None:
        """Record the call once the client has its response (off the response's critical path)."""
        record.end_ns = time.time_ns()
        self.metrics.count_call(record)
        if response is None:
            self.call_spans.write(record)
        else:
            response.background = BackgroundTask(self._record, record)
        return response

    async def _record(self, record: CallRecord) -> None:
        """A coroutine: Starlette runs a plain function's background task in a thread pool (costly here)."""
        self.call_spans.write(record)

    # ------------------------------------------------------------------ models

    async def models(self) -> Response:
        """The model list of an available server (the policy's LoRA adapter included when one is loaded)."""
        try:
            server = self.pool.pick(None)
            status, content = await self.client.request(
                "GET", f"{server.url}/v1/models", timeout_s=self.settings.connect_timeout_s
            )
        except NoServerAvailable as error:
            raise CallError(503, str(error), "ServiceUnavailableError", RELOAD_RETRY_AFTER_S) from None
        except UpstreamError as error:
            raise CallError(502, f"the inference server failed: {error}", "BadGatewayError") from None
        return Response(content, status, media_type="application/json")

    async def count_tokens(self, tokenize: dict[str, Any]) -> int:
        """A prompt's length in the model's own rendering: vLLM's `/tokenize` of chat messages and tools."""
        served = self.coordinator.policy.served_model
        if served is not None:  # a LoRA policy: vLLM knows only the adapter's name (same tokenizer)
            tokenize = {**tokenize, "model": served}
        try:
            server = self.pool.pick(None)
            status, content = await self.client.request(
                "POST", f"{server.url}/tokenize", timeout_s=self.settings.upstream_timeout_s, json=tokenize
            )
        except NoServerAvailable as error:
            raise CallError(503, str(error), "ServiceUnavailableError", RELOAD_RETRY_AFTER_S) from None
        except UpstreamError as error:
            raise CallError(502, f"the inference server failed: {error}", "BadGatewayError") from None
        if status != 200:
            raise CallError(status, *vllm_error(content))
        return int(orjson.loads(content)["count"])

    # ------------------------------------------------------------------ reloads

    async def reload(self, *, version: int, checkpoint: str | None, lora_adapter: str | None) -> ReloadResult:
        """Switch every server to new weights (see ReloadCoordinator) and count the outcome."""
        result = await self.coordinator.reload(
            version=version, checkpoint=checkpoint, lora_adapter=lora_adapter
        )
        self.metrics.count_reload(result)
        return result
