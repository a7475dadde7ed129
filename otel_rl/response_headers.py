"""Headers on every answer of the server: a browser neither guesses a content type nor sends a Referer."""

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# nosniff: a stored value served as text or JSON is never run as a script or page because a browser guessed
# its type; no-referrer: a link followed from the web view does not tell the other site which page it was on.
SECURITY_HEADERS = ((b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"))


class SecurityHeaders:
    """ASGI middleware adding SECURITY_HEADERS to every HTTP response (streamed ones included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)
