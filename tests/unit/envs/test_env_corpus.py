"""The tokenizer corpus covers every built-in env's vocabulary and stays fast."""

from __future__ import annotations

import time

from roll_async.envs.corpus import sample_env_texts


def test_corpus_covers_every_env_and_both_action_kinds():
    start = time.perf_counter()
    texts = sample_env_texts(num_seeds=5)
    assert time.perf_counter() - start < 5
    joined = "\n".join(texts)
    for needle in [
        "Sokoban",
        "FrozenLake",
        "sliding puzzle",
        "Countdown",
        "Search results for",
        "Question:",
        "<answer>Up</answer>",
        "<search>",
        "Invalid action:",
        "<image>",
        "Numbers:",
        "Target:",
        "#",
        " _ ",
    ]:
        assert needle in joined, needle
    assert all(isinstance(t, str) and t for t in texts)
    assert sample_env_texts(num_seeds=5) == texts
