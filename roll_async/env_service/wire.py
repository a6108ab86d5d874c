"""The env server's wire format: JSON bodies, observation encoding, error kinds, client-side exceptions.

Server and client must agree on every body, status and error kind; keeping the
format in one module both import means a change to it is made once.
"""

from __future__ import annotations

import base64
import io
from typing import Any

from PIL import Image

from roll_async.envs.base import Observation
from roll_async.errors import RollAsyncError

# Endpoints (all JSON; ``timeout_s`` is optional and defaults to the server's ``--env-timeout-s``):
#
# =======================  ===============================================  ==========================================
# ``GET  /health``         -                                                ``{status, envs, isolation, registered}``
# ``POST /v1/envs``        ``{env_type, env_config, seed?, timeout_s?,      ``{env_id}`` (+ ``observation, info`` with a seed:
#                          env_id?}``                                       create and reset in one round trip)
# ``POST /v1/envs/{id}/reset``  ``{seed, seq, timeout_s?}``                 ``{env_id, observation, info}``
# ``POST /v1/envs/{id}/step``   ``{action, seq, timeout_s?}``               ``{observation, reward, terminated, truncated, info}``
# ``DELETE /v1/envs/{id}``      -                                           ``{closed: true}``
# ``POST /v1/batch``       ``{calls: [{op: create|reset|step|close, ...}]}``  ``{results: [{ok, status, body}]}`` (run
#                                                                           concurrently; one round trip for many envs)
# =======================  ===============================================  ==========================================
#
# Exactly once: every call that changes an env carries the session's sequence number. A create
# with a client-chosen ``env_id`` is call 0 of that session (a create without one cannot be
# repeated safely); each reset and step carries ``seq``, the previous call's number + 1. The server
# keeps each env's last call and its answer: the same ``seq`` again (the same op and arguments) is
# answered from that record, waiting for it if the call is still running, and never applied twice;
# a failed call's repeat gets the same failure. So a client may resend a call whose answer it lost.
# A ``seq`` that is neither the next one nor the last one is 409 ``out_of_sequence`` (nothing is
# applied; the env is kept, for the client to close); so is the last one reused for another call.
# A missing, non-integer or negative ``seq`` is 400 naming the field.
#
# Errors carry ``{error: <reason>, kind: <kind>}``: 400 ``bad_request`` (the
# request is malformed: the reason names the field), 404 ``not_found`` (unknown
# env id or env_type; the reason says whether the env was closed, dropped after a
# failed call, or is unknown, as after a server restart: envs do not survive one),
# 409 ``busy`` (a call on that env is already running) or ``out_of_sequence``, 429
# ``full`` (the server holds ``--max-envs`` envs), 500 ``env_error`` / ``timeout``
# / ``crashed`` (the env raised, ran past its timeout and was killed, or its
# process died; the env is gone and the client builds a new one), 503
# ``overloaded`` (all ``--max-threads`` threads were busy for the whole timeout;
# the env was not called and is kept, and the call's ``seq`` is free again).
API = "/v1"
ENV_FAILURE_KINDS = ("env_error", "timeout", "crashed")
#: Error kinds of a call the server refused before calling the env: its ``seq`` was not used.
NOT_APPLIED_KINDS = ("bad_request", "busy", "out_of_sequence", "overloaded")


class BadRequest(RollAsyncError, ValueError):
    """A malformed request; the server answers 400 with this message."""


def to_jsonable(value: Any) -> Any:
    """Plain JSON types for env results (numpy scalars and arrays, tuples, sets); anything else as ``str``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [to_jsonable(v) for v in value]
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():
        return item()
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return to_jsonable(tolist())
    return str(value)


def encode_observation(observation: Any) -> Any:
    """A str stays a str; an Observation with images becomes ``{text, images: [base64 PNG]}``."""
    if isinstance(observation, str):
        return observation
    images = getattr(observation, "images", None)
    text = getattr(observation, "text", None)
    if isinstance(text, str) and images is not None:
        encoded = []
        for image in images:
            buffer = io.BytesIO()
            image.save(buffer, format="PNG")
            encoded.append(base64.b64encode(buffer.getvalue()).decode("ascii"))
        return {"text": text, "images": encoded}
    return str(observation)


def decode_observation(data: Any) -> Any:
    if isinstance(data, dict) and "text" in data:
        images = [
            Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB")
            for b in data.get("images", [])
        ]
        return Observation(text=str(data["text"]), images=images)
    return data if isinstance(data, str) else str(data)


def require(
    body: Any, key: str, kind: type | tuple[type, ...], *, what: str = ""
) -> Any:
    """``body[key]`` of the given type, or BadRequest naming the field."""
    if not isinstance(body, dict):
        raise BadRequest(
            f"the request body must be a JSON object{what and ' for ' + what}"
        )
    if key not in body:
        raise BadRequest(f"missing field {key!r}{what and ' in ' + what}")
    value = body[key]
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise BadRequest(f"field {key!r} must be a number, got a boolean")
    if not isinstance(value, kind):
        expected = (
            kind.__name__
            if isinstance(kind, type)
            else " or ".join(k.__name__ for k in kind)
        )
        raise BadRequest(
            f"field {key!r} must be {expected}, got {type(value).__name__}"
        )
    return value


def require_seq(body: Any) -> int:
    """The call's sequence number ``body["seq"]``: a non-negative int, or BadRequest naming the field."""
    seq: int = require(body, "seq", int)
    if seq < 0:
        raise BadRequest(f"field 'seq' must be a non-negative integer, got {seq}")
    return seq
