"""What the model sees of a command's output: at most ``max_observation_tokens`` of the policy's tokens.

A long output (a build log, a test run) would otherwise fill the context the agent needs for the
rest of its task, and only the model's own tokens measure what it costs there: characters
over-count code and under-count other scripts. The head (the command's start) and the tail
(where an error message is) are kept, with one marker saying how many tokens of the middle went.
The runtime's byte cap (``runtime_config.max_output_bytes``, docker: ``output_cap_bytes``) bounds
memory before this; this budget bounds context. The policy's tokenizer reaches an env in the
EnvManager's own process (:func:`~roll_async.env_service.env_builder.env_builder` calls
``use_tokenizer``); an env without one (built by ``make_env`` alone, in a child process or on an env
server) counts each UTF-8 byte as a token, never fewer than a byte-level BPE tokenizer counts, so it
stays within the budget and keeps less.
"""

from __future__ import annotations

from roll_async.prompts.tokenizers import ChatTokenizer

#: What an output shows in place of the middle the token budget cut.
TOKEN_CUT_MARKER = "\n... [{} tokens of output cut] ...\n"
#: The same without the policy's tokenizer, counted in bytes (one byte: at most one token); worded apart
#: from the runtime's byte cap (``workspaces.output_cap``), which may have cut the same output before.
BYTE_CUT_MARKER = "\n... [{} bytes of output cut to the budget] ...\n"


def cut_to_budget(
    text: str, max_tokens: int, tokenizer: ChatTokenizer | None
) -> tuple[str, bool]:
    """``text`` within ``max_tokens`` (plus the marker): its head and tail around a marker; and whether it was cut.

    The head keeps the larger half of the budget when it is odd. Without ``tokenizer``, bytes stand in
    for tokens (see the module docstring).
    """
    if tokenizer is None:
        return _cut_bytes(text, max_tokens)
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text, False
    tail = max_tokens // 2
    head = max_tokens - tail
    kept_tail = tokenizer.decode(ids[len(ids) - tail :]) if tail else ""
    return (
        tokenizer.decode(ids[:head])
        + TOKEN_CUT_MARKER.format(len(ids) - max_tokens)
        + kept_tail,
        True,
    )


def _cut_bytes(text: str, max_bytes: int) -> tuple[str, bool]:
    """``text`` within ``max_bytes`` UTF-8 bytes, head and tail kept; a character split at a cut is dropped."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text, False
    tail = max_bytes // 2
    head = max_bytes - tail
    kept_tail = data[len(data) - tail :] if tail else b""
    return (
        data[:head].decode("utf-8", "ignore")
        + BYTE_CUT_MARKER.format(len(data) - max_bytes)
        + kept_tail.decode("utf-8", "ignore"),
        True,
    )
