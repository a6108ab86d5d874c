"""Representative env texts, for training a small tokenizer on exactly what the envs show and expect.

The offline tiny models need a tokenizer trained without a download; the texts
here are what a model reads and writes in these envs (instructions, rendered
observations over a few expert steps, invalid-action feedback, tagged answers,
retrieval results), so its vocabulary fits the envs.
"""

from __future__ import annotations

from typing import Any

from roll_async.envs.registry import make_env

#: (env name, env_config) variants sampled per seed; small sizes keep this fast.
_VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("sokoban", {}),
    ("sokoban", {"dim_room": [7, 7], "num_boxes": 2, "max_actions_per_turn": 3}),
    ("frozen_lake", {}),
    ("frozen_lake", {"size": 6, "is_slippery": True, "max_actions_per_turn": 2}),
    ("sliding_puzzle", {}),
    ("sliding_puzzle", {"size": 4, "num_scramble": 12}),
    ("countdown", {}),
    ("countdown", {"num_numbers": 3, "max_number": 50}),
    ("retrieval_qa", {}),
]
_INVALID = [
    "<answer>Jump</answer>",
    "Up",
    "<answer></answer>",
    "<answer>up, down, sideways</answer>",
    "I think Left.",
]
_STEPS = 4


def sample_env_texts(num_seeds: int = 20) -> list[str]:
    """Texts from every built-in env over ``num_seeds`` seeds; deterministic."""
    texts: list[str] = []
    for name, cfg in _VARIANTS:
        env = make_env(name, cfg)
        for seed in range(num_seeds):
            obs, info = env.reset(seed)
            texts += [info["instruction"], _text(obs)]
            plan = env.expert_responses() or []
            for k, response in enumerate(plan[:_STEPS]):
                if env.done:
                    break
                if k == 1:  # one invalid turn per episode, to show the feedback text
                    bad = _INVALID[seed % len(_INVALID)]
                    obs, *_ = env.step(bad)
                    texts += [bad, _text(obs)]
                    if env.done:
                        break
                obs, *_ = env.step(response)
                texts += [response, _text(obs)]
        if name in ("sokoban", "frozen_lake"):
            vision = make_env(name, {**cfg, "render_mode": "vision"})
            obs, info = vision.reset(0)
            texts += [info["instruction"], obs.text]
        if name == "retrieval_qa":
            env.reset(0)
            texts += [
                f"[{i}] {p['title']}: {p['text']}"
                for i, p in enumerate(env.passages, 1)
            ]
            texts += [q["question"] for q in env.questions[: num_seeds * 4]]
        env.close()
    return texts


def _text(obs: Any) -> str:
    return obs if isinstance(obs, str) else obs.text
