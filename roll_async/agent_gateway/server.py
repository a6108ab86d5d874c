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
from typing import Any

from aiohttp import web

from roll_async.agent_gateway.session import AgentSession, OpenAIError

logger = logging.getLogger(__name__)

#: Largest request body accepted (long agent conversations).
_MAX_BODY_BYTES = 64 * 1024 * 1024


class AgentGateway:
    """Serves the chat-completions sessions of one worker's agent episodes.

    Each episode gets a session and a base URL ``http://127.0.0.1:<port>/sessions/<id>/v1``,
    so the plain ``openai.AsyncOpenAI(base_url=...)`` client reaches its own
    session with no custom headers. Routes under that prefix:

    * ``GET  /v1/models`` (and ``/v1/models/<id>``): the served model;
    * ``POST /v1/chat/completions``: :meth:`AgentSession.chat_completion`.

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
            raise RuntimeError("AgentGateway.open_session before ensure_started()")
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

    async def _chat_completions(self, request: web.Request) -> web.Response:
        try:
            session = self._session(request)
            try:
                body: Any = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise OpenAIError(400, f"the request body is not JSON: {exc}") from None
            return web.json_response(await session.chat_completion(body))
        except OpenAIError as exc:
            return _error(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # an engine failure after its retries: the agent sees a server error
            logger.warning("agent gateway: chat completion failed: %s", exc)
            return _error(
                OpenAIError(500, f"{type(exc).__name__}: {exc}", type="server_error")
            )

    async def _not_served(self, request: web.Request) -> web.Response:
        return _error(
            OpenAIError(
                404,
                f"{request.method} {request.path} is not served; the agent endpoint serves "
                "GET /sessions/<id>/v1/models and POST /sessions/<id>/v1/chat/completions",
                code="not_found",
            )
        )


def _error(exc: OpenAIError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)
