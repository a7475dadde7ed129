"""A vLLM-style fake OpenAI server for tests: vLLM's wire protocol, byte tokens, scripted replies, faults.

What it speaks (as vLLM 0.32 does): `POST /v1/chat/completions` and `/v1/completions`, non-streaming and SSE
streaming (`stream_options.include_usage`, `.continuous_usage_stats`), `n` choices, tools → `tool_calls`,
`return_token_ids` → `prompt_token_ids` + per-choice `token_ids` (streaming: on the role chunks / each chunk's
delta), `logprobs`, vLLM error bodies, `POST /tokenize` (chat messages), `GET /v1/models` and `/health`.
With `dev_mode=True`, VLLM_SERVER_DEV_MODE's `/pause`, `/resume`, `/reset_prefix_cache`, `/weight_checker` and
`/collective_rpc`'s `reload_weights` (the weights become the sha256 of each `*.safetensors` file of the
folder; a folder without one fails as vLLM's loader does).

Tokens are bytes, so ids are checkable by hand: `tokenize(text) == list(text.encode())`; a chat prompt is
`tokenize(render_chat(messages))`; the logprob of token t is `logprob_of(t)` (exact in float32).

    with FakeVLLM(replies=["<tool_call>...</tool_call>", "The answer is 85."]) as fake:
        client = OpenAI(base_url=fake.url, api_key="x")
        fake.inject(Fault(status=503))  # the next request fails
        fake.refuse_connections(0.5)  # the listener closes now and reopens on the same port 0.5 s later
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import itertools
import json
import logging
import pathlib
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import uvicorn
from loopback import ThreadedServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "fake-model"
DEV_PATHS = ("/pause", "/resume", "/reset_prefix_cache", "/weight_checker", "/collective_rpc")
CREATED = 1767225600  # fixed so that responses are reproducible


# --- the toy tokenizer -------------------------------------------------------------------------------


def tokenize(text: str) -> list[int]:
    """Byte-level tokens: the id of a token is its byte value."""
    return list(text.encode())


def detokenize(ids: Iterable[int]) -> str:
    return bytes(ids).decode(errors="ignore")


def logprob_of(token_id: int) -> float:
    """The fake's logprob for a sampled token: a multiple of 1/8, exact in float32."""
    return -((token_id % 7) + 1) / 8


def token_text(token_id: int) -> str:
    # vLLM writes tokens that are not valid UTF-8 on their own as "bytes:\x.."
    return chr(token_id) if token_id < 128 else f"bytes:\\x{token_id:02x}"


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """The text a model generates for one tool call (the calculator task's format)."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def render_chat(messages: list[dict[str, Any]]) -> str:
    """ChatML prompt as the model sees it, ending with the assistant's turn header."""
    rendered = []
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):  # content parts
            content = "".join(part.get("text", "") for part in content)
        for call in message.get("tool_calls") or []:
            function = call["function"]
            content += tool_call_text(function["name"], json.loads(function["arguments"] or "{}"))
        rendered.append(f"<|im_start|>{message['role']}\n{content}<|im_end|>\n")
    return "".join(rendered) + "<|im_start|>assistant\n"


# --- what the test scripts --------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str | None = None


@dataclass(frozen=True)
class Reply:
    """One choice's generation. Tool calls become OpenAI `tool_calls` when the request offers tools, else
    they stay in the text (`<tool_call>{...}</tool_call>`), as with a vLLM server without a tool parser."""

    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None
    finish_reason: str | None = None  # default: "tool_calls" / "stop" / "length" as vLLM decides


# A responder decides choice `index`'s reply from the request body.
Responder = Callable[[dict[str, Any], int], "Reply | str"]


@dataclass
class Fault:
    """Make one request misbehave. Faults are consumed in order, one per request."""

    status: int | None = None  # answer with this HTTP status and a vLLM error body
    message: str = "Injected fault"
    delay_s: float = 0.0  # wait before answering (client timeouts)
    disconnect_after_chunks: int | None = None  # drop the connection after this many SSE chunks (body parts)
    error_after_chunks: int | None = None  # after this many SSE chunks, vLLM's error event and [DONE]
    chunk_delay_s: float = 0.0  # wait before each SSE chunk (a stream still generating)


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]  # lower-case names
    body: dict[str, Any]


ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 429: "TooManyRequestsError",
               500: "InternalServerError", 503: "ServiceUnavailableError"}  # fmt: skip


def error_body(status: int, message: str) -> dict[str, Any]:
    """vLLM's error response."""
    error_type = ERROR_TYPES.get(status, "Error")
    return {"error": {"message": message, "type": error_type, "param": None, "code": status}}


class InjectedDisconnect(Exception):
    """Raised inside a response body to make the server drop the connection."""


class QuietInjectedDisconnects(logging.Filter):
    """Keeps uvicorn from logging a traceback for a disconnect the test asked for."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], InjectedDisconnect))


QUIET_INJECTED_DISCONNECTS = QuietInjectedDisconnects()


# --- generation --------------------------------------------------------------------------------------


@dataclass
class Choice:
    content: str | None
    tool_calls: list[dict[str, Any]]  # OpenAI shape
    reasoning: str | None
    finish_reason: str
    pieces: list[tuple[dict[str, Any], str]]  # (stream delta, generated text behind it)

    @property
    def token_ids(self) -> list[int]:
        return [t for _, text in self.pieces for t in tokenize(text)]


def split_words(text: str) -> list[str]:
    return re.findall(r"\S+\s*|\s+", text)


def generate(reply: Reply, *, parse_tools: bool, max_tokens: int | None, call_ids: Iterable[str]) -> Choice:
    """Lay one reply out as vLLM would: generated text, token ids, message fields and stream deltas."""
    pieces: list[tuple[dict[str, Any], str]] = []
    if reply.reasoning:
        pieces.append(({"reasoning": reply.reasoning}, f"<think>{reply.reasoning}</think>"))
    content = reply.content
    if not parse_tools:
        content += "".join(tool_call_text(c.name, c.arguments) for c in reply.tool_calls)
    pieces += [({"content": word}, word) for word in split_words(content)]
    tool_calls = []
    if parse_tools:
        for k, (call, call_id) in enumerate(zip(reply.tool_calls, call_ids, strict=False)):
            arguments = json.dumps(call.arguments)
            tool_calls.append({"id": call.id or call_id, "type": "function",
                               "function": {"name": call.name, "arguments": arguments}})  # fmt: skip
            head = {"index": k, "id": call.id or call_id, "type": "function",
                    "function": {"name": call.name, "arguments": ""}}  # fmt: skip
            text = tool_call_text(call.name, call.arguments)
            # vLLM's tool parser streams the call's header, then the arguments; tokens follow the text.
            split = text.index(arguments)
            pieces.append(({"tool_calls": [head]}, text[:split]))
            arguments_delta = {"index": k, "function": {"arguments": arguments}}
            pieces.append(({"tool_calls": [arguments_delta]}, text[split:]))
    finish = reply.finish_reason or ("tool_calls" if tool_calls else "stop")
    choice = Choice(content or None, tool_calls, reply.reasoning, finish, pieces)
    if max_tokens is not None and len(choice.token_ids) > max_tokens:
        text = detokenize(choice.token_ids[:max_tokens])
        return Choice(text, [], None, "length", [({"content": w}, w) for w in split_words(text)])
    return choice


def logprobs_content(ids: list[int], top_n: int) -> list[dict[str, Any]]:
    def entry(t: int) -> dict[str, Any]:
        return {"token": token_text(t), "logprob": logprob_of(t), "bytes": [t]}

    return [entry(t) | {"top_logprobs": [entry((t + k) % 256) for k in range(top_n)]} for t in ids]


def completion_logprobs(ids: list[int], offset: int) -> dict[str, Any]:
    tokens = [token_text(t) for t in ids]
    offsets = list(itertools.accumulate((len(tok) for tok in tokens), initial=offset))[:-1]
    return {"text_offset": offsets, "token_logprobs": [logprob_of(t) for t in ids], "tokens": tokens,
            "top_logprobs": [{token_text(t): logprob_of(t)} for t in ids]}  # fmt: skip


def usage(prompt_ids: list[int], choices: list[Choice]) -> dict[str, Any]:
    completion = sum(len(c.token_ids) for c in choices)
    return {"prompt_tokens": len(prompt_ids), "total_tokens": len(prompt_ids) + completion,
            "completion_tokens": completion, "prompt_tokens_details": None}  # fmt: skip


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


# --- the server ---------------------------------------------------------------------------------------


class FakeVLLM:
    """The fake server, on 127.0.0.1 and a free port, in a background thread.

    `replies`: a list (a queue: each choice takes the next reply), or a responder `(request, index) -> reply`.
    Without replies every choice answers `"Fake reply {index}."`.
    """

    def __init__(
        self,
        replies: Responder | Iterable[Reply | str] | None = None,
        *,
        model: str = MODEL,
        dev_mode: bool = False,
    ):
        self.model = model
        # VLLM_SERVER_DEV_MODE=1's endpoints: /pause, /resume, /reset_prefix_cache, and /weight_checker,
        # which answers `weights` (tensor name → sha256; a test moves the weights by replacing it).
        self.dev_mode = dev_mode
        self.weights: dict[str, str] = {"model.embed_tokens.weight": "0" * 64, "lm_head.weight": "1" * 64}
        self.paused = False
        # vLLM's sleep (`POST /sleep?level=N`, `POST /wake_up`, `GET /is_sleeping`): the level slept at, 0
        # awake; a generation reaching a sleeping server is refused and counted (real vLLM would hold it)
        self.sleep_level = 0
        self.calls_while_asleep = 0
        self.requests: list[RecordedRequest] = []
        self.health_checks = 0  # GET /health requests answered
        self.health_delay_s = 0.0  # how long /health takes to answer (a busy server)
        self.faults: collections.deque[Fault] = collections.deque()
        self._queue: collections.deque[Reply | str] = collections.deque()
        self._responder: Responder = lambda request, index: f"Fake reply {index}."
        self.script(replies)
        self._ids = itertools.count()
        self._serving: ThreadedServer | None = None
        self.port = 0

    # scripting
    def script(self, replies: Responder | Iterable[Reply | str] | None) -> None:
        """Replace the replies (see the class docstring)."""
        if callable(replies):
            self._responder = replies
        elif replies is not None:
            self._queue = collections.deque(replies)
            self._responder = self._next_queued

    def inject(self, *faults: Fault) -> None:
        self.faults.extend(faults)

    def _next_queued(self, request: dict[str, Any], index: int) -> Reply | str:
        if not self._queue:
            raise LookupError("fake vLLM: the scripted replies are used up")
        return self._queue.popleft()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI base URL (`.../v1`)."""
        return f"{self.base_url}/v1"

    # lifecycle
    def start(self, port: int = 0) -> FakeVLLM:
        """Listen on `port` (0: a free one)."""
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # reopen a port closed a moment ago
        sock.bind(("127.0.0.1", port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
        logging.getLogger("uvicorn.error").addFilter(QUIET_INJECTED_DISCONNECTS)
        self._serving = ThreadedServer(config, sock, what="fake vLLM server").start()
        return self

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.stop()
            self._serving = None

    def refuse_connections(self, seconds: float) -> threading.Thread:
        """Close the listener and its connections now (connects are refused), and reopen it on the same port
        `seconds` later, from a background thread (returned: join it to wait for the reopening)."""
        port = self.port
        self.stop()

        def reopen() -> None:
            time.sleep(seconds)
            self.start(port)

        thread = threading.Thread(target=reopen, daemon=True)
        thread.start()
        return thread

    def __enter__(self) -> FakeVLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # HTTP
    def app(self) -> Starlette:
        routes = [
            Route("/health", self._health),
            Route("/v1/models", self._models),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/tokenize", self._tokenize, methods=["POST"]),
        ]
        if self.dev_mode:
            routes += [Route(path, self._dev, methods=["POST"]) for path in DEV_PATHS]
            routes += [
                Route("/sleep", self._sleep, methods=["POST"]),
                Route("/wake_up", self._wake_up, methods=["POST"]),
                Route("/is_sleeping", self._is_sleeping),
            ]
        return Starlette(routes=routes)

    async def _dev(self, request: Request) -> Response:
        """vLLM's dev-mode endpoints, as far as the gateway uses them."""
        path = request.url.path
        body = json.loads(await request.body() or b"{}")
        self.requests.append(RecordedRequest(path, dict(request.headers), body | dict(request.query_params)))
        if path == "/weight_checker":
            if body.get("action") != "checksum":
                return JSONResponse(error_body(400, "fake vLLM: only action 'checksum'"), status_code=400)
            return JSONResponse({"checksums": dict(self.weights)})
        if path == "/collective_rpc":
            if self.sleep_level:  # its weights are off the device: vLLM fails the load
                return JSONResponse(error_body(500, "fake vLLM: reload_weights while asleep"), 500)
            return self._reload_weights(body)
        if path in ("/pause", "/resume"):
            self.paused = path == "/pause"
            return JSONResponse({"status": "paused" if self.paused else "resumed"})
        return Response(status_code=200)  # /reset_prefix_cache

    async def _sleep(self, request: Request) -> Response:
        """vLLM's `/sleep`: `level` 0..2 (default 1) and `mode` abort|wait|keep as query parameters."""
        self.requests.append(RecordedRequest("/sleep", dict(request.headers), dict(request.query_params)))
        level, mode = request.query_params.get("level", "1"), request.query_params.get("mode", "abort")
        wrong = "level" if not (level.isdigit() and int(level) <= 2) else None
        wrong = wrong or ("mode" if mode not in ("abort", "wait", "keep") else None)
        if wrong is not None:  # FastAPI's validation error
            return JSONResponse({"detail": [{"type": "query", "loc": ["query", wrong]}]}, status_code=422)
        if int(level):  # level 0 only pauses scheduling
            self.sleep_level = int(level)
        self.paused = True
        return JSONResponse({"status": "sleeping", "level": int(level)})

    async def _wake_up(self, request: Request) -> Response:
        """vLLM's `/wake_up` (`tags` repeated, none: all): answers whether it is fully awake."""
        self.requests.append(RecordedRequest("/wake_up", dict(request.headers), dict(request.query_params)))
        tags = request.query_params.getlist("tags") or None
        self.sleep_level, self.paused = 0, False
        return JSONResponse({"status": "awake", "tags": tags})

    async def _is_sleeping(self, request: Request) -> Response:
        return JSONResponse({"is_sleeping": self.sleep_level > 0 or self.paused})

    def _reload_weights(self, body: dict[str, Any]) -> Response:
        folder = pathlib.Path(body.get("kwargs", {}).get("weights_path", ""))
        if body.get("method") != "reload_weights":
            return JSONResponse(error_body(400, "fake vLLM: only method 'reload_weights'"), status_code=400)
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            message = f"Cannot find any model weights with `{folder}`"  # vLLM's loader, as the RPC relays it
            return JSONResponse(error_body(500, message), status_code=500)
        self.weights = {file.stem: hashlib.sha256(file.read_bytes()).hexdigest() for file in files}
        return JSONResponse({"results": [None]})

    async def _health(self, request: Request) -> Response:
        await asyncio.sleep(self.health_delay_s)
        self.health_checks += 1
        return Response(status_code=200)

    async def _models(self, request: Request) -> JSONResponse:
        card = {"id": self.model, "object": "model", "created": CREATED, "owned_by": "vllm",
                "root": self.model, "parent": None, "max_model_len": 2048, "permission": []}  # fmt: skip
        return JSONResponse({"object": "list", "data": [card]})

    async def _receive(self, request: Request, required: str) -> tuple[dict, Fault | None, Response | None]:
        """Record the request and apply the next fault; returns (body, fault, early response or None)."""
        try:
            body = json.loads(await request.body())
        except json.JSONDecodeError as exc:
            body = {}
            early: Response | None = JSONResponse(error_body(400, f"Invalid JSON: {exc}"), status_code=400)
        else:
            early = None
        self.requests.append(RecordedRequest(request.url.path, dict(request.headers), body))
        if self.sleep_level:
            self.calls_while_asleep += 1
            return body, None, JSONResponse(error_body(503, "fake vLLM: the engine is asleep"), 503)
        fault = self.faults.popleft() if self.faults else None
        if fault and fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        if early is None and fault and fault.status:
            early = JSONResponse(error_body(fault.status, fault.message), status_code=fault.status)
        if early is None and body.get("model") != self.model:
            early = JSONResponse(error_body(404, f"The model `{body.get('model')}` does not exist."), 404)
        if early is None and required not in body:
            early = JSONResponse(error_body(400, f"Field required: {required}"), status_code=400)
        return body, fault, early

    def _choices(self, body: dict[str, Any], parse_tools: bool, request_number: int) -> list[Choice]:
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        choices = []
        for index in range(int(body.get("n") or 1)):
            reply = self._responder(body, index)
            reply = Reply(content=reply) if isinstance(reply, str) else reply
            call_ids = (f"chatcmpl-tool-{request_number}-{index}-{k}" for k in itertools.count())
            choices.append(generate(reply, parse_tools=parse_tools, max_tokens=max_tokens, call_ids=call_ids))
        return choices

    def _respond(self, fault: Fault | None, body: dict[str, Any], chunks: list[str]) -> Response:
        """Stream the chunks (SSE) or send the single body, dropping the connection if a fault says so."""
        cut = fault.disconnect_after_chunks if fault else None
        failing = fault.error_after_chunks if fault else None
        if cut is None and not body.get("stream") and not (fault and fault.chunk_delay_s):
            return Response(chunks[0], media_type="application/json")

        async def stream() -> AsyncIterator[str]:
            for number, chunk in enumerate(chunks):
                if fault and fault.chunk_delay_s:
                    await asyncio.sleep(fault.chunk_delay_s)
                if number == cut:
                    raise InjectedDisconnect(f"fake vLLM: disconnect after {cut} chunks")
                if number == failing:  # as vLLM streams an engine error: an error event, then [DONE]
                    yield sse(error_body(500, fault.message)) + "data: [DONE]\n\n"
                    return
                yield chunk

        media_type = "text/event-stream" if body.get("stream") else "application/json"
        return StreamingResponse(stream(), media_type=media_type)

    async def _chat(self, request: Request) -> Response:
        body, fault, early = await self._receive(request, "messages")
        if early is not None:
            return early
        number = next(self._ids)
        parse_tools = bool(body.get("tools")) and body.get("tool_choice") != "none"
        try:
            choices = self._choices(body, parse_tools, number)
        except LookupError as exc:
            return JSONResponse(error_body(500, str(exc)), status_code=500)
        wire = Wire.of(body, tokenize(render_chat(body["messages"])))
        head = {"id": f"chatcmpl-{number:08d}", "created": CREATED, "model": self.model}
        if body.get("stream"):
            return self._respond(fault, body, chat_stream(head, choices, wire))
        return self._respond(fault, body, [json.dumps(chat_response(head, choices, wire))])

    async def _tokenize(self, request: Request) -> Response:
        """vLLM's `/tokenize` of chat messages: the rendered prompt's ids and their count."""
        body, _, early = await self._receive(request, "messages")
        if early is not None:
            return early
        ids = tokenize(render_chat(body["messages"]))
        return JSONResponse({"count": len(ids), "max_model_len": 2048, "tokens": ids, "token_strs": None})

    async def _completions(self, request: Request) -> Response:
        body, fault, early = await self._receive(request, "prompt")
        if early is not None:
            return early
        number = next(self._ids)
        try:
            choices = self._choices(body, False, number)
        except LookupError as exc:
            return JSONResponse(error_body(500, str(exc)), status_code=500)
        prompt = body["prompt"]
        wire = Wire.of(body, list(prompt) if isinstance(prompt, list) else tokenize(prompt))
        head = {"id": f"cmpl-{number:08d}", "created": CREATED, "model": self.model}
        if body.get("stream"):
            return self._respond(fault, body, completion_stream(head, choices, wire))
        return self._respond(fault, body, [json.dumps(completion_response(head, choices, wire))])


# --- response bodies (pure) -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wire:
    """What the request asked to see in the response."""

    prompt_ids: list[int]
    token_ids: bool  # return_token_ids
    top_logprobs: int | None  # chat: None when logprobs were not requested
    logprobs: bool  # completions: logprobs requested
    include_usage: bool  # streaming: stream_options.include_usage
    continuous_usage: bool  # streaming: usage so far on every chunk (stream_options.continuous_usage_stats)

    @classmethod
    def of(cls, body: dict[str, Any], prompt_ids: list[int]) -> Wire:
        return cls(
            prompt_ids=prompt_ids,
            token_ids=bool(body.get("return_token_ids")),
            top_logprobs=int(body.get("top_logprobs") or 0) if body.get("logprobs") is True else None,
            logprobs=body.get("logprobs") not in (None, False),
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
            continuous_usage=bool((body.get("stream_options") or {}).get("continuous_usage_stats")),
        )


def chat_response(head: dict[str, Any], choices: list[Choice], wire: Wire) -> dict[str, Any]:
    out = []
    for index, choice in enumerate(choices):
        message = {"role": "assistant", "content": choice.content, "refusal": None, "annotations": None,
                   "audio": None, "function_call": None, "tool_calls": choice.tool_calls,
                   "reasoning": choice.reasoning}  # fmt: skip
        logprobs = None
        if wire.top_logprobs is not None:
            logprobs = {"content": logprobs_content(choice.token_ids, wire.top_logprobs)}
        out.append({
            "index": index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason,
            "stop_reason": None,
            "token_ids": choice.token_ids if wire.token_ids else None,
        })  # fmt: skip
    return head | {
        "object": "chat.completion",
        "choices": out,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage(wire.prompt_ids, choices),
        "prompt_logprobs": None,
        "prompt_token_ids": wire.prompt_ids if wire.token_ids else None,
        "kv_transfer_params": None,
    }


def chat_stream(head: dict[str, Any], choices: list[Choice], wire: Wire) -> list[str]:
    """SSE chunks in vLLM's order: a role chunk per choice (with prompt_token_ids), each choice's deltas
    (the last one carries finish_reason), the usage chunk, [DONE]. Unset fields are left out, as vLLM does."""
    head = head | {"object": "chat.completion.chunk"}
    prompt = {"prompt_token_ids": wire.prompt_ids} if wire.token_ids else {}
    chunks = []
    generated = 0  # tokens sent so far, for continuous usage

    def so_far() -> dict[str, Any]:
        if not wire.continuous_usage:
            return {}
        prompt_tokens = len(wire.prompt_ids)
        return {"usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + generated,
                          "completion_tokens": generated, "prompt_tokens_details": None}}  # fmt: skip

    for index in range(len(choices)):
        delta = {"role": "assistant", "content": ""}
        role = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        chunks.append(sse(head | {"choices": [role]} | prompt | so_far()))
    for index, choice in enumerate(choices):
        for number, (delta, text) in enumerate(choice.pieces):
            last = number == len(choice.pieces) - 1
            ids = tokenize(text)
            item: dict[str, Any] = {
                "index": index,
                "delta": delta,
                "logprobs": None,
                "finish_reason": choice.finish_reason if last else None,
            }
            if wire.top_logprobs is not None:
                item["logprobs"] = {"content": logprobs_content(ids, wire.top_logprobs)}
            if last:
                item["stop_reason"] = None
            if wire.token_ids:
                item["token_ids"] = ids
            generated += len(ids)
            chunks.append(sse(head | {"choices": [item]} | so_far()))
    if wire.include_usage:
        chunks.append(sse(head | {"choices": [], "usage": usage(wire.prompt_ids, choices)}))
    return [*chunks, "data: [DONE]\n\n"]


def completion_response(head: dict[str, Any], choices: list[Choice], wire: Wire) -> dict[str, Any]:
    out = [
        {
            "index": index,
            "text": detokenize(choice.token_ids),
            "logprobs": completion_logprobs(choice.token_ids, 0) if wire.logprobs else None,
            "finish_reason": choice.finish_reason,
            "stop_reason": None,
            "token_ids": choice.token_ids if wire.token_ids else None,
            "prompt_logprobs": None,
            "prompt_token_ids": wire.prompt_ids if wire.token_ids else None,
        }
        for index, choice in enumerate(choices)
    ]
    return head | {"object": "text_completion", "choices": out, "system_fingerprint": None,
                   "usage": usage(wire.prompt_ids, choices), "kv_transfer_params": None}  # fmt: skip


def completion_stream(head: dict[str, Any], choices: list[Choice], wire: Wire) -> list[str]:
    """SSE chunks for /v1/completions: each choice's text pieces; its first carries prompt_token_ids."""
    head = head | {"object": "text_completion"}
    chunks = []
    for index, choice in enumerate(choices):
        offset = 0
        pieces = [text for _, text in choice.pieces] or [""]
        for number, text in enumerate(pieces):
            ids = tokenize(text)
            last = number == len(pieces) - 1
            item: dict[str, Any] = {
                "index": index,
                "text": text,
                "logprobs": completion_logprobs(ids, offset) if wire.logprobs else None,
                "finish_reason": choice.finish_reason if last else None,
                "stop_reason": None,
            }
            offset += len(text)
            if wire.token_ids:
                item["token_ids"] = ids
                if number == 0:
                    item["prompt_token_ids"] = wire.prompt_ids
            chunks.append(sse(head | {"choices": [item]}))
    if wire.include_usage:
        chunks.append(sse(head | {"choices": [], "usage": usage(wire.prompt_ids, choices)}))
    return [*chunks, "data: [DONE]\n\n"]


@dataclass
class CalcReplies:
    """A responder for the calculator task: a `calc` tool call for the question's `a op b` on the first turn,
    then `The answer is {tool result}.` once a tool message is present. `wrong=True` answers off by one."""

    wrong: bool = False

    def __call__(self, request: dict[str, Any], index: int) -> Reply:
        messages = request["messages"]
        tool_results = [m["content"] for m in messages if m["role"] == "tool"]
        if tool_results:
            numbers = re.findall(r"-?\d+", tool_results[-1])
            if not numbers:
                return Reply(content="I could not compute it.")
            return Reply(content=f"The answer is {int(numbers[-1]) + (1 if self.wrong else 0)}.")
        match = re.search(r"(\d+)\s*([-+*])\s*(\d+)", messages[-1]["content"])
        expression = "".join(match.groups()) if match else "0+0"
        return Reply(tool_calls=(ToolCall("calc", {"expression": expression}),))
