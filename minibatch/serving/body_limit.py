"""An ASGI middleware that refuses request bodies over a size limit with a 413, before parsing.

It reads the whole body itself (up to the limit), so an oversized one is refused whether it
announces its size in Content-Length or arrives in chunks, and then hands the app the body it
read, followed by whatever the connection says next (a disconnect, which the handlers watch for).
"""
from __future__ import annotations

from starlette.responses import JSONResponse

from minibatch.serving.protocol import APIError


class BodyLimit:
    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def __getattr__(self, name):           # let callers reach the wrapped app's attributes (state, routes)
        return getattr(self.app, name)

    async def refuse(self, scope, receive, send, size: str) -> None:
        error = APIError(413, f"the request body is {size} bytes; this server accepts at most {self.max_bytes} "
                         "(--max-body-bytes)", code="body_too_large")
        await JSONResponse(error.body(), status_code=413)(scope, receive, send)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await self.refuse(scope, receive, send, declared.decode())
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self.refuse(scope, receive, send, f"over {size}")
            if not message.get("more_body"):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)
