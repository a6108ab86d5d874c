"""The rollout side of the env server: an aiohttp client and RemoteEnv, an async env proxy.

Envs that are heavy, untrusted or need other hardware run on env servers; the
rollout loop should not notice, so ``RemoteEnv`` looks like any async env to the
EnvManager while this module handles deadlines, retries and spreading envs over
a tag's servers.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

import aiohttp

from roll_async.env_service.fd_limit import raise_open_files_limit
from roll_async.env_service.wire import API, NOT_APPLIED_KINDS, decode_observation
from roll_async.errors import (
    EnvServiceError,
    EnvServiceUnavailable,
    InvalidInputError,
    LifecycleError,
)

logger = logging.getLogger(__name__)

#: Client deadline = the call's timeout_s + this, so the server's own timeout answers first.
_DEADLINE_MARGIN_S = 10.0
#: A URL whose retries all failed gets no new envs for this long.
_DOWN_FOR_S = 30.0
#: Errors that prove the request never reached the server (no connection was made: refused,
#: DNS, connect timeout): any call is retried. aiohttp < 3.10 has no ConnectionTimeoutError (its
#: connect timeout is then a plain timeout, not retried).
_NEVER_SENT: tuple[type[BaseException], ...] = (aiohttp.ClientConnectorError,) + (
    (aiohttp.ConnectionTimeoutError,)
    if hasattr(aiohttp, "ConnectionTimeoutError")
    else ()
)
#: Errors after the request may have been sent (reset, disconnected mid-response, a cut body):
#: retried only for a call the server answers once however often it arrives (``idempotent``).
_MAYBE_SENT = (
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
    ConnectionError,
)
_clients: dict[tuple[int, tuple[str, ...], int, float], EnvServiceClient] = {}
_raised_open_files = False


def normalize_urls(service_url: str | Sequence[str]) -> tuple[str, ...]:
    urls = [service_url] if isinstance(service_url, str) else list(service_url)
    return tuple(str(u).rstrip("/") for u in urls)


class EnvServiceClient:
    """Calls to one tag's env servers: retries, deadlines, load spreading.

    One ``EnvServiceClient`` (one connection pool) exists per event loop and URL
    list, shared by every RemoteEnv of that loop.
    """

    def __init__(
        self, urls: Sequence[str], *, max_retries: int = 3, retry_backoff_s: float = 0.5
    ) -> None:
        if not urls:
            raise InvalidInputError("EnvServiceClient needs at least one URL")
        self.urls = tuple(urls)
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.envs_on = {url: 0 for url in self.urls}
        self.in_flight = {url: 0 for url in self.urls}
        self._down_until = {url: 0.0 for url in self.urls}
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def shared(
        cls,
        service_url: str | Sequence[str],
        *,
        max_retries: int = 3,
        retry_backoff_s: float = 0.5,
    ) -> EnvServiceClient:
        """The client of the running event loop for these URLs (one connection pool per loop)."""
        loop = asyncio.get_running_loop()
        key = (id(loop), normalize_urls(service_url), max_retries, retry_backoff_s)
        client = _clients.get(key)
        if client is None or client._closed_loop(loop):
            client = _clients[key] = cls(
                key[1], max_retries=max_retries, retry_backoff_s=retry_backoff_s
            )
        return client

    def _closed_loop(self, loop: asyncio.AbstractEventLoop) -> bool:
        return self._session is not None and (
            self._session.closed or self._session._loop is not loop
        )

    def _session_for_loop(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            _ensure_open_files()
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(
                connector=connector, raise_for_status=False
            )
        return self._session

    def pick_url(self) -> str:
        """The up URL with the fewest envs of this client (then fewest calls in flight); all down: the first."""
        now = time.monotonic()
        up = [u for u in self.urls if self._down_until[u] <= now] or list(self.urls)
        return min(up, key=lambda u: (self.envs_on[u], self.in_flight[u]))

    def others_up(self, url: str) -> bool:
        now = time.monotonic()
        return any(u != url and self._down_until[u] <= now for u in self.urls)

    async def request(
        self,
        url: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout_s: float,
        idempotent: bool | None = None,
    ) -> dict[str, Any]:
        """One JSON call with retries of transport errors; server-reported failures raise EnvServiceError.

        An error that proves the request never reached the server (no connection) is retried for
        any call. One after the request may have arrived (reset, disconnected, a cut response) is
        retried, with the same body, only when ``idempotent``: the server applies that call once
        however often it arrives (a reset or step with its ``seq``, a create with its ``env_id``;
        GET and DELETE by default). Otherwise the call fails ``outcome_unknown`` rather than risk
        applying it twice. A client deadline past is not retried: the server's own timeout answers
        first, so by then the server is wedged and the call's time is spent.
        """
        if idempotent is None:
            idempotent = method in ("GET", "DELETE")
        session = self._session_for_loop()
        deadline = aiohttp.ClientTimeout(
            total=timeout_s + _DEADLINE_MARGIN_S,
            connect=min(10.0, timeout_s + _DEADLINE_MARGIN_S),
        )
        attempt = 0
        self.in_flight[url] += 1
        try:
            while True:
                try:
                    async with session.request(
                        method, url + path, json=body, timeout=deadline
                    ) as response:
                        try:
                            payload = await response.json(content_type=None)
                        except ValueError:
                            payload = {
                                "error": (await response.text())[:500],
                                "kind": "bad_response",
                            }
                        if response.status >= 400:
                            raise EnvServiceError(
                                f"env server {url} answered {response.status} to {method} {path}: "
                                f"{payload.get('error', payload) if isinstance(payload, dict) else payload}",
                                kind=payload.get("kind", "env_error")
                                if isinstance(payload, dict)
                                else "env_error",
                                status=response.status,
                            )
                        self._down_until[url] = 0.0
                        answer: dict[str, Any] = payload  # a JSON object on success
                        return answer
                except _NEVER_SENT as exc:
                    attempt += 1
                    self._give_up_after(url, method, path, exc, attempt)
                    await self._back_off(url, method, path, exc, attempt, "")
                except TimeoutError:
                    raise EnvServiceError(
                        f"env server {url} did not answer {method} {path} within {timeout_s + _DEADLINE_MARGIN_S:g}s",
                        kind="timeout",
                    ) from None
                except _MAYBE_SENT as exc:
                    if not idempotent:
                        raise EnvServiceError(
                            f"env server {url}: {method} {path} failed after it may have reached "
                            f"the server ({type(exc).__name__}: {exc}); not retried, since the "
                            "server may have applied it (a call with a seq or a client-chosen "
                            "env_id is retried: the server answers it once)",
                            kind="outcome_unknown",
                        ) from exc
                    attempt += 1
                    self._give_up_after(url, method, path, exc, attempt)
                    await self._back_off(
                        url,
                        method,
                        path,
                        exc,
                        attempt,
                        " (the same call: answered once)",
                    )
        finally:
            self.in_flight[url] -= 1

    def _give_up_after(
        self, url: str, method: str, path: str, exc: BaseException, attempt: int
    ) -> None:
        """Past max_retries: mark the URL down and raise (EnvServiceUnavailable if no other URL is up)."""
        if attempt <= self.max_retries:
            return
        self._down_until[url] = time.monotonic() + _DOWN_FOR_S
        message = (
            f"env server {url} unreachable: {method} {path} failed {attempt} times "
            f"({type(exc).__name__}: {exc})"
        )
        if self.others_up(url):
            raise EnvServiceError(
                message + "; other servers of the tag take the next episodes",
                kind="unreachable",
            ) from exc
        raise EnvServiceUnavailable(
            message + "; no other server of the tag is up"
        ) from exc

    async def _back_off(
        self,
        url: str,
        method: str,
        path: str,
        exc: BaseException,
        attempt: int,
        note: str,
    ) -> None:
        logger.warning(
            "env server %s: %s %s failed (%s); retry %d/%d%s",
            url,
            method,
            path,
            exc,
            attempt,
            self.max_retries,
            note,
        )
        await asyncio.sleep(self.retry_backoff_s * 2 ** (attempt - 1))

    async def health(self, url: str, timeout_s: float = 10.0) -> dict[str, Any]:
        return await self.request(url, "GET", "/health", timeout_s=timeout_s)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _ensure_open_files() -> None:
    """Once per process: every session is a connection, so raise a low open-files limit (and say so)."""
    global _raised_open_files
    if not _raised_open_files:
        _raised_open_files = True
        before, after = raise_open_files_limit()
        if after != before:
            logger.info("raised the open-files limit from %d to %d", before, after)


class RemoteEnv:
    """An env instance on an env server, seen as an ordinary async env.

    ``RemoteEnv`` looks like any ``async def reset/step/close`` env to the
    EnvManager, so the rollout loop does not change. Its env instance is created
    (``prepare``, or the first ``reset``) on the server of the tag's list with the
    fewest envs of this client (spread by load), and stays there. Each call carries ``timeout_s`` (the server kills the env past
    it) and has a client-side deadline a little longer. Every call that changes
    the env carries the session's sequence number (create: the client-chosen id,
    call 0; each reset and step: the next number), so transport errors
    (connection refused or reset, server disconnected, a cut response) are
    retried ``max_retries`` times with backoff, resending the same call: the
    server answers a repeat from its record and never applies a call twice.
    After that the URL is marked down for a while. If another URL of the tag is
    up, the episode just ends ``env_error`` (the next one goes elsewhere); if none
    is, :class:`EnvServiceUnavailable` ends the rollout and ``get_batch`` reports
    it, naming the URLs. A server that lost the env (it restarted) answers 404
    saying so; the episode ends there, and nothing is stepped in its place.
    """

    def __init__(
        self,
        service_url: str | Sequence[str],
        env_type: str,
        env_config: dict[str, Any] | None = None,
        *,
        call_timeout_s: float = 60.0,
        max_retries: int = 3,
    ) -> None:
        self.service_url = service_url
        self.env_type = env_type
        self.env_config = dict(env_config or {})
        self.call_timeout_s = float(call_timeout_s)
        self.max_retries = max_retries
        self.url: str | None = None
        self.env_id: str | None = None
        #: the number of this env's last call that changes it (the create is 0)
        self.seq = 0
        self._client: EnvServiceClient | None = None

    def _get_client(self) -> EnvServiceClient:
        if self._client is None:
            self._client = EnvServiceClient.shared(
                self.service_url, max_retries=self.max_retries
            )
        return self._client

    async def prepare(self) -> None:
        """Create the instance on the least-loaded server (the EnvManager calls it after building the proxy)."""
        if self.env_id is not None:
            return
        client = self._get_client()
        url = client.pick_url()
        client.envs_on[url] += 1
        # The id is chosen here, so a create interrupted mid-request can still be closed (DELETE) by id.
        self.url, self.env_id, self.seq = url, f"c{uuid.uuid4().hex}", 0
        body = {
            "env_type": self.env_type,
            "env_config": self.env_config,
            "timeout_s": self.call_timeout_s,
            "env_id": self.env_id,
        }
        try:
            await self._send(url, "POST", f"{API}/envs", body)
        except asyncio.CancelledError:
            raise  # close() deletes it by id
        except BaseException:
            if self.env_id is not None:
                self._forget()
            raise

    async def reset(self, seed: int) -> tuple[Any, dict[str, Any]]:
        if self.env_id is None:
            await self.prepare()
        payload = await self._send_sequenced(
            "reset", {"seed": int(seed), "timeout_s": self.call_timeout_s}
        )
        return decode_observation(payload["observation"]), payload.get("info") or {}

    async def step(
        self, action_text: str
    ) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self.env_id is None:
            raise LifecycleError(
                f"RemoteEnv({self.env_type}).step() called before reset()"
            )
        payload = await self._send_sequenced(
            "step", {"action": action_text, "timeout_s": self.call_timeout_s}
        )
        return (
            decode_observation(payload["observation"]),
            float(payload["reward"]),
            bool(payload["terminated"]),
            bool(payload["truncated"]),
            payload.get("info") or {},
        )

    async def close(self) -> None:
        """Delete the server's instance (a failed env is already gone there: 404 is fine)."""
        env_id, url = self.env_id, self.url
        if env_id is None or url is None:
            return
        self.env_id = None
        client = self._get_client()
        client.envs_on[url] -= 1
        try:
            await client.request(url, "DELETE", f"{API}/envs/{env_id}", timeout_s=5.0)
        except (EnvServiceError, EnvServiceUnavailable):
            pass

    async def _send_sequenced(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        """A reset or step with the next sequence number; every retry of it resends this number.

        A call the server answered without applying it (``NOT_APPLIED_KINDS``) gives its number back.
        """
        assert self.url is not None
        self.seq += 1
        try:
            return await self._send(
                self.url,
                "POST",
                f"{API}/envs/{self.env_id}/{op}",
                {**body, "seq": self.seq},
            )
        except EnvServiceError as exc:
            if exc.kind in NOT_APPLIED_KINDS:
                self.seq -= 1
            raise

    async def _send(
        self, url: str, method: str, path: str, body: Any
    ) -> dict[str, Any]:
        """A call the server answers once (a create by its id, a reset or step by its seq), so retried."""
        try:
            return await self._get_client().request(
                url, method, path, body, timeout_s=self.call_timeout_s, idempotent=True
            )
        except EnvServiceError as exc:
            if (
                exc.kind
                in ("timeout", "crashed", "env_error", "not_found", "unreachable")
                and self.env_id is not None
            ):
                self._forget()  # the server dropped the instance: nothing to close there
            raise

    def _forget(self) -> None:
        if self.url is not None and self.env_id is not None:
            self._get_client().envs_on[self.url] -= 1
        self.env_id = None


async def check_service(
    service_url: str | Sequence[str],
    env_type: str,
    env_config: dict[str, Any],
    seed: int,
    timeout_s: float,
) -> None:
    """Preflight for a tag served remotely: every URL answers /health, and one env builds and resets there."""
    client = EnvServiceClient(
        normalize_urls(service_url), max_retries=1, retry_backoff_s=0.2
    )
    try:
        for url in client.urls:
            try:
                health = await client.health(url, timeout_s=min(10.0, timeout_s))
            except (EnvServiceUnavailable, EnvServiceError) as exc:
                raise EnvServiceUnavailable(
                    f"service_url {url} does not answer /health: {exc}"
                ) from None
            if health.get("status") != "ok":
                raise EnvServiceUnavailable(f"service_url {url}: /health says {health}")
            payload = await client.request(
                url,
                "POST",
                f"{API}/envs",
                {
                    "env_type": env_type,
                    "env_config": env_config,
                    "seed": int(seed),
                    "timeout_s": timeout_s,
                    "env_id": f"c{uuid.uuid4().hex}",
                },
                timeout_s=timeout_s,
                idempotent=True,
            )
            await client.request(
                url, "DELETE", f"{API}/envs/{payload['env_id']}", timeout_s=timeout_s
            )
    finally:
        await client.close()
