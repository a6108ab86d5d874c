"""The loopback OpenAI-compatible endpoint agent code talks to: one aiohttp server per EnvManagerWorker.

Agent code written against the plain ``openai.AsyncOpenAI`` client should run
unchanged; giving each episode its own base URL on a loopback server in the
worker's event loop lets it reach its own session with no custom headers, and
every request the session cannot serve gets an OpenAI-style error, never a hang.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from roll_async.agent_gateway.chat_request import parse_chat_request
from roll_async.agent_gateway.errors import OpenAIError
from roll_async.agent_gateway.responses_api import (
    parse_responses_request,
    response_body,
    response_events,
)
from roll_async.agent_gateway.session import AgentSession
from roll_async.agent_gateway.streaming import SSE_DONE, chat_chunks, sse
from roll_async.errors import LifecycleError

logger = logging.getLogger(__name__)

#: Largest request body accepted (long agent conversations).
_MAX_BODY_BYTES = 64 * 1024 * 1024


class AgentGateway:
    """Serves the chat-completions sessions of one worker's agent episodes.

    Each episode gets a session and a base URL ``http://127.0.0.1:<port>/sessions/<id>/v1``,
    so the plain ``openai.AsyncOpenAI(base_url=...)`` client reaches its own
    session with no custom headers. Routes under that prefix:

    * ``GET  /v1/models`` (and ``/v1/models/<id>``): the served model;
    * ``POST /v1/chat/completions``: :meth:`AgentSession.serve`, as a
      ``chat.completion`` or, with ``stream: true``, server-sent chunks;
    * ``POST /v1/responses``: the Responses API over the same session
      (stateless; streamed too with ``stream: true``).

    Everything else, an unknown or ended session, a malformed body or a request
    the session cannot serve gets an OpenAI-style ``{"error": {...}}`` response
    with a 4xx status, never a hang. aiohttp is the project's HTTP library (servers
    and clients); the server runs in the worker's event loop beside the env loops,
    binds the loopback only and an ephemeral port, and starts on the first agent
    episode.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port: int | None = None
        self.sessions: dict[str, AgentSession] = {}
        self._runner: web.AppRunner | None = None
        self._start_lock = asyncio.Lock()

    async def ensure_started(self) -> None:
        """Start listening (once); safe to call from every episode."""
        async with self._start_lock:
            if self._runner is not None:
                return
            app = web.Application(client_max_size=_MAX_BODY_BYTES)
            app.router.add_get("/sessions/{sid}/v1/models", self._models)
            app.router.add_get("/sessions/{sid}/v1/models/{model:.+}", self._model)
            app.router.add_post(
                "/sessions/{sid}/v1/chat/completions", self._chat_completions
            )
            app.router.add_post("/sessions/{sid}/v1/responses", self._responses)
            app.router.add_route("*", "/{tail:.*}", self._not_served)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, self.host, 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._runner = runner
            logger.info("agent gateway listening on http://%s:%s", self.host, self.port)

    def open_session(self, session: AgentSession) -> str:
        """Register ``session``; returns the base URL to give ``openai.AsyncOpenAI``."""
        if self.port is None:
            raise LifecycleError("AgentGateway.open_session before ensure_started()")
        self.sessions[session.session_id] = session
        return f"http://{self.host}:{self.port}/sessions/{session.session_id}/v1"

    def close_session(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            session.close()

    async def stop(self) -> None:
        for session_id in list(self.sessions):
            self.close_session(session_id)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- handlers ----------------------------------------------------------------------

    def _session(self, request: web.Request) -> AgentSession:
        session = self.sessions.get(request.match_info["sid"])
        if session is None:
            raise OpenAIError(
                404, "unknown or ended agent session", code="session_not_found"
            )
        return session

    async def _models(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(self._session(request).models())
        except OpenAIError as exc:
            return _error(exc)

    async def _model(self, request: web.Request) -> web.Response:
        try:
            session = self._session(request)
            if request.match_info["model"] != session.model_name:
                raise OpenAIError(
                    404,
                    f"the model {request.match_info['model']!r} is not served here",
                    code="model_not_found",
                )
            return web.json_response(session.model_card())
        except OpenAIError as exc:
            return _error(exc)

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        async def serve(session: AgentSession, body: Any) -> web.StreamResponse:
            chat = parse_chat_request(body, session.model_name)
            reply = await session.serve(chat)
            completion = session.completion_body(reply)
            if not chat.stream:
                return web.json_response(completion)
            chunks = chat_chunks(
                reply,
                completion_id=completion["id"],
                model=session.model_name,
                include_usage=chat.include_usage,
            )
            return await _stream(request, [(None, c) for c in chunks], done=True)

        return await self._handle(request, serve)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        async def serve(session: AgentSession, body: Any) -> web.StreamResponse:
            chat = parse_responses_request(body, session.model_name)
            reply = await session.serve(chat)
            response = response_body(
                reply,
                response_id=f"resp_{session.session_id}_{reply.call_index}",
                model=session.model_name,
                body=body,
            )
            if not chat.stream:
                return web.json_response(response)
            return await _stream(request, response_events(response), done=False)

        return await self._handle(request, serve)

    async def _handle(
        self,
        request: web.Request,
        serve: Callable[[AgentSession, Any], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """Run ``serve(session, body)``; every failure becomes an OpenAI-style error response."""
        try:
            session = self._session(request)
            try:
                body: Any = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise OpenAIError(400, f"the request body is not JSON: {exc}") from None
            return await serve(session, body)
        except OpenAIError as exc:
            return _error(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # an engine failure after its retries: the agent sees a server error
            logger.warning("agent gateway: model call failed: %s", exc)
            return _error(
                OpenAIError(500, f"{type(exc).__name__}: {exc}", type="server_error")
            )

    async def _not_served(self, request: web.Request) -> web.Response:
        return _error(
            OpenAIError(
                404,
                f"{request.method} {request.path} is not served; the agent endpoint serves "
                "GET /sessions/<id>/v1/models, POST /sessions/<id>/v1/chat/completions and "
                "POST /sessions/<id>/v1/responses",
                code="not_found",
            )
        )


async def _stream(
    request: web.Request, events: Any, *, done: bool
) -> web.StreamResponse:
    """Send ``(event name, payload)`` pairs as server-sent events (then ``[DONE]`` for chat chunks)."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for name, event in events:
        await response.write(sse(event, name))
    if done:
        await response.write(SSE_DONE)
    await response.write_eof()
    return response


def _error(exc: OpenAIError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)
