"""Supervised warm start on env-solver demonstrations (how the offline demo gets a model that can act).

A random tiny model cannot produce a well-formed action, so GRPO would see only
zero rewards; a short SFT on part of each env expert's turns teaches the answer
format and some good moves while leaving room for RL to show improvement.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from roll_async.envs import make_env
from roll_async.envs.multiplayer.players import (
    HEURISTICS,
    Player,
    random_player,
    seat_seed,
)
from roll_async.envs.multiplayer.registry import make_game, registered_games
from roll_async.errors import InvalidInputError, SftDivergedError
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.prompts.tokenizers import ChatTokenizer
from roll_async.trainer.losses import token_logprobs


@dataclass
class SFTExample:
    """One tokenised demonstration: ``loss_mask`` is 1 on tokens the model should learn to produce."""

    input_ids: list[int]
    loss_mask: list[int]
    seed: int
    #: Assistant turns kept out of the full demonstration.
    num_turns: int
    demo_turns: int
    #: Whether the kept turns alone solve the episode.
    success: bool


def _observation_text(observation: Any) -> str:
    return str(getattr(observation, "text", observation))


def kept_turns(total: int, demo_fraction: float) -> int:
    """Turns kept of a ``total``-turn demo: ``floor(fraction * total)``, at least 1 when fraction > 0."""
    if total <= 0 or demo_fraction <= 0:
        return 0
    return min(total, max(1, math.floor(demo_fraction * total)))


def build_sft_examples(
    env_type: str,
    env_config: dict[str, Any] | None,
    seeds: Iterable[int],
    tokenizer: ChatTokenizer,
    system_prompt: str | None,
    instruction_template: str = "{instruction}\n{observation}",
    observation_template: str = "{observation}",
    demo_fraction: float = 1.0,
    *,
    max_length: int | None = None,
    demonstrator: str = "expert",
) -> list[SFTExample]:
    """Tokenised partial expert demonstrations, one per seed whose solver found a plan.

    Seeds the solver cannot solve (``expert_responses()`` returns None) are
    skipped. ``max_length`` cuts a conversation at that many tokens.

    A random tiny model cannot produce a well-formed action, so GRPO would see
    only zero rewards. :func:`build_sft_examples` plays each env's expert
    (``env.expert_responses()``, which follows the env's solver) and keeps only the
    first ``demo_fraction`` of the turns: the model learns the answer format and
    some good moves, but initial success stays low, leaving room for RL to show
    improvement.

    A game with seats (a name in ``registered_games()``: kuhn_poker, nim, tic_tac_toe) has no
    solver: its demos are games the game's heuristic player plays against itself, each
    seed's demo the conversation of seat ``seed % num_players`` as a policy seat sees it
    (its instruction, its own observations, the heuristic's moves in the game's answer
    format), cut to ``demo_fraction`` of that seat's moves the same way. With ``demonstrator``
    ``random`` the game's random player plays every seat instead (the format and legal moves, no
    strategy); other envs have only their expert.
    """
    builder = ChatPromptBuilder(tokenizer, system_prompt)
    if env_type in registered_games():
        return _game_examples(
            env_type,
            env_config,
            seeds,
            builder,
            instruction_template,
            observation_template,
            demo_fraction,
            max_length,
            demonstrator,
        )
    if demonstrator != "expert":
        raise InvalidInputError(
            f"sft_warmup.demonstrator={demonstrator!r}: {env_type!r} is not a game with seats, so its demos "
            "come from its solver; set sft_warmup.demonstrator=expert"
        )
    env = make_env(env_type, dict(env_config or {}))
    examples: list[SFTExample] = []
    try:
        for seed in seeds:
            observation, info = env.reset(seed=int(seed))
            responses = env.expert_responses()
            if not responses:
                continue
            keep = kept_turns(len(responses), demo_fraction)
            if keep == 0:
                continue
            fields = {
                "instruction": str((info or {}).get("instruction") or ""),
                "observation": _observation_text(observation),
                "reward": 0.0,
                "turn": 0,
            }
            ids = builder.first_turn_ids(instruction_template.format(**fields))
            mask = [0] * len(ids)
            success = False
            for turn, response in enumerate(responses[:keep]):
                reply_ids, reply_mask = _reply(builder, response)
                ids += reply_ids
                mask += reply_mask
                observation, reward, terminated, truncated, step_info = env.step(
                    response
                )
                success = bool((step_info.get("metrics") or {}).get("success", False))
                if terminated or truncated or turn == keep - 1:
                    break
                fields = {
                    **fields,
                    "observation": _observation_text(observation),
                    "reward": float(reward),
                    "turn": turn + 1,
                }
                delta = builder.user_delta_ids(observation_template.format(**fields))
                ids += delta
                mask += [0] * len(delta)
            example = _example(
                ids,
                mask,
                max_length,
                seed=int(seed),
                num_turns=keep,
                demo_turns=len(responses),
                success=success,
            )
            if example is not None:
                examples.append(example)
    finally:
        env.close()
    return examples


def _game_examples(
    game_name: str,
    game_config: dict[str, Any] | None,
    seeds: Iterable[int],
    builder: ChatPromptBuilder,
    instruction_template: str,
    observation_template: str,
    demo_fraction: float,
    max_length: int | None,
    demonstrator: str,
) -> list[SFTExample]:
    """Self-play demos of a game with seats by its heuristic or random player, one seat's conversation per seed (see build_sft_examples)."""
    heuristic = HEURISTICS.get(game_name) if demonstrator == "expert" else None
    if heuristic is None and demonstrator == "expert":
        raise InvalidInputError(
            f"sft_warmup: the game {game_name!r} has no heuristic player to demonstrate it "
            f"(games with one: {', '.join(sorted(HEURISTICS))}); set sft_warmup.demonstrator=random "
            "or disable sft_warmup for this tag"
        )
    game = make_game(game_name, dict(game_config or {}))
    examples: list[SFTExample] = []
    for seed in seeds:
        seat = int(seed) % game.num_players
        players: list[Player] = [
            heuristic or random_player(seat_seed(int(seed), s))
            for s in range(game.num_players)
        ]
        game.reset(int(seed))
        replies: list[tuple[str, str]] = []  # (the seat's observation, its reply)
        done = False
        while not done:
            seen = game.get_observation()
            move = players[seen.seat](seen.text, list(seen.legal_actions))
            reply = game.format_action(move)
            if seen.seat == seat:
                replies.append((seen.text, reply))
            done = game.step(reply).done
        outcome = game.close()
        keep = kept_turns(len(replies), demo_fraction)
        if keep == 0:
            continue
        ids: list[int] = []
        mask: list[int] = []
        for turn, (observation, reply) in enumerate(replies[:keep]):
            fields = {
                "instruction": game.instruction(seat),
                "observation": observation,
                "reward": 0.0,
                "turn": turn,
            }
            if turn == 0:
                prompt = builder.first_turn_ids(instruction_template.format(**fields))
            else:
                prompt = builder.user_delta_ids(observation_template.format(**fields))
            reply_ids, reply_mask = _reply(builder, reply)
            ids += prompt + reply_ids
            mask += [0] * len(prompt) + reply_mask
        won = outcome.rewards[seat] > max(
            r for i, r in enumerate(outcome.rewards) if i != seat
        )
        example = _example(
            ids,
            mask,
            max_length,
            seed=int(seed),
            num_turns=keep,
            demo_turns=len(replies),
            success=won and keep == len(replies),
        )
        if example is not None:
            examples.append(example)
    return examples


def _reply(builder: ChatPromptBuilder, text: str) -> tuple[list[int], list[int]]:
    """One demonstrated reply as a rollout renders it, with its loss mask: the reply's tokens and the
    template's closure after them, trained up to the closure's EOS."""
    reply = builder.encode(text)
    closure = builder.closure_ids_after(reply)
    return reply + closure, [1] * len(reply) + _end_of_turn_mask(
        closure, builder.eos_token_ids
    )


def _example(
    ids: list[int],
    mask: list[int],
    max_length: int | None,
    *,
    seed: int,
    num_turns: int,
    demo_turns: int,
    success: bool,
) -> SFTExample | None:
    """The demo cut to ``max_length`` tokens; None when the cut leaves no trained token."""
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    if not any(mask):
        return None
    return SFTExample(
        ids,
        mask,
        seed=seed,
        num_turns=num_turns,
        demo_turns=demo_turns,
        success=success,
    )


def _end_of_turn_mask(closure: list[int], eos_ids: set[int]) -> list[int]:
    """1 on the closure's tokens up to and including its first EOS (``<|im_end|>``), 0 after (``\\n``)."""
    mask = []
    learning = True
    for token in closure:
        mask.append(1 if learning else 0)
        if token in eos_ids:
            learning = False
    return mask if not learning else [0] * len(closure)


def collate_sft(
    examples: list[SFTExample], pad_token_id: int
) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask``, ``position_ids`` and ``loss_mask``."""
    width = max(len(e.input_ids) for e in examples)
    size = len(examples)
    input_ids = torch.full((size, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((size, width), dtype=torch.long)
    loss_mask = torch.zeros((size, width), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        input_ids[row, :n] = torch.tensor(example.input_ids)
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(example.loss_mask)
    loss_mask[:, 0] = 0  # the first token has no prefix to predict it from
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0) * attention_mask
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "loss_mask": loss_mask,
    }


def sft_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean negative log-likelihood over the batch's ``loss_mask`` tokens."""
    mask = batch["loss_mask"].bool()
    logp = token_logprobs(
        model,
        batch["input_ids"],
        batch["attention_mask"],
        batch["position_ids"],
        score_mask=mask,
    ).logprobs
    return -(logp * mask).sum() / mask.sum().clamp(min=1)


def run_sft(
    target: Any,
    examples: list[SFTExample],
    *,
    steps: int,
    lr: float,
    batch_size: int,
    pad_token_id: int | None = None,
    max_grad_norm: float = 1.0,
    weight_decay: float = 0.0,
    seed: int = 0,
) -> dict[str, float]:
    """Cross-entropy on the demonstrations' masked tokens for ``steps`` AdamW steps; returns ``sft/...`` metrics.

    ``target`` is an HF causal LM or a trainer with a ``model`` attribute. The
    SFT optimizer is separate from the RL one (its Adam moments would be wrong
    for RL). A trainer with ``reset_reference()`` gets its KL reference set to
    the warmed-up weights, because the KL should anchor to the policy RL starts
    from, not to the random init. Batches are drawn in a fixed order from
    ``seed`` (a local generator; global RNG untouched).

    Conversations are rendered token-exactly the way rollouts build them
    (:class:`~roll_async.prompts.prompt_builder.ChatPromptBuilder`: first turn through the
    chat template, then response ids, the turn closure, and the next user delta),
    with the same ``instruction_template``/``observation_template`` fields as the
    EnvManager (``instruction``, ``observation``, ``reward``, ``turn``). The loss
    mask covers the assistant's tokens plus the end-of-turn token that closes them
    (``<|im_end|>`` in ChatML), so the model also learns to stop.
    """
    if not examples:
        raise InvalidInputError(
            "run_sft got no examples; did every demonstration fail (check env solver and demo_fraction)?"
        )
    model = getattr(target, "model", target)
    if pad_token_id is None:
        tokenizer = getattr(target, "tokenizer", None)
        pad_token_id = getattr(tokenizer, "pad_token_id", None)
        if pad_token_id is None:
            pad_token_id = (
                getattr(getattr(model, "config", None), "pad_token_id", None) or 0
            )
    world_size = getattr(getattr(target, "rank", None), "world_size", 1)
    device = getattr(target, "device", None) or next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    losses: list[float] = []
    was_training = model.training
    model.train()
    for _ in range(steps):
        picked: list[int] = []
        while len(picked) < min(batch_size, len(examples)):
            if not order:
                order = torch.randperm(len(examples), generator=generator).tolist()
            picked.append(order.pop())
        batch = {
            k: v.to(device)
            for k, v in collate_sft([examples[i] for i in picked], pad_token_id).items()
        }
        optimizer.zero_grad(set_to_none=True)
        loss = sft_loss(model, batch)
        if not torch.isfinite(loss):
            raise SftDivergedError(
                f"SFT loss became {float(loss)} at step {len(losses)}; lower sft_warmup.lr"
            )
        # fsdp2 ranks each run the whole batch and sum their gradients: each backwards its 1/N share
        (loss / world_size).backward()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        losses.append(float(loss.detach()))
    model.train(was_training)
    optimizer.zero_grad(set_to_none=True)
    reset = getattr(target, "reset_reference", None)
    if callable(reset) and target is not model:
        reset()
    tail = losses[-max(1, len(losses) // 10) :] if losses else [float("nan")]
    return {
        "sft/loss/first": losses[0] if losses else float("nan"),
        "sft/loss/last": losses[-1] if losses else float("nan"),
        "sft/loss/final_mean": sum(tail) / len(tail),
        "sft/steps": float(steps),
        "sft/examples": float(len(examples)),
        "sft/demo_success_rate": sum(e.success for e in examples) / len(examples),
    }
