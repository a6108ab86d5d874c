"""``roll-async check-model DIR``: will this model work here?

A model that loads is not yet one that trains: its chat template may not be
append-only, vLLM and transformers may disagree on logprobs, or a weight sync
may leave the engine stale. This runs each of those checks against the real
engine and trainer, prints one table row per check with the fix for a failure,
and exits 0 only when every check passes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from roll_async.config.schema import EngineConfig, TrainerConfig
from roll_async.engine.router import EngineClient
from roll_async.engine.vllm_engine import VLLMEngine
from roll_async.errors import ChatTemplateError, EngineStartupError, MissingFileError
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.prompts.tokenizers import ChatTokenizer, load_tokenizer
from roll_async.sampling import SamplingSettings
from roll_async.trainer.collate import collate_trajectories, padding_token_id
from roll_async.trainer.grpo_trainer import GRPOTrainer
from roll_async.trajectory import GenerationRequest, Trajectory

#: Engine vs trainer agreement on per-token logprobs of generated tokens (float32 on both sides).
LOGPROB_MAX_ABS_TOLERANCE = 1e-3
LOGPROB_MEAN_ABS_TOLERANCE = 1e-4
#: Relative scale of the random perturbation in the weight-sync round trip.
PERTURB_SCALE = 0.5

DEFAULT_SYSTEM_PROMPT = "You are an agent solving a task step by step. Reply with your action inside <answer></answer>."
_USER_TURNS = [
    "Grid:\n#####\n#P_G#\n#####\nMove the player to the goal. Actions: Up, Down, Left, Right.",
    "Invalid action. Grid:\n#####\n#P_G#\n#####\nTry again.",
    "You moved Right. Grid:\n#####\n#_PG#\n#####\nOne more step.",
]


@dataclass
class CheckRow:
    check: str
    status: str  # "ok", "FAIL" or "info"
    detail: str
    fix: str = ""


@dataclass
class CheckSettings:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    turns: int = 3
    max_tokens: int = 24
    seed: int = 0
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    #: A Jinja chat template file that overrides the tokenizer's (model.chat_template).
    chat_template: str | None = None
    cpu_kv_cache_space_gib: float = 0.25
    max_model_len: int = 1024


@dataclass
class SampledConversation:
    """A token-exact conversation sampled from the engine: ids, mask, behaviour logprobs, texts."""

    token_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    user_texts: list[str] = field(default_factory=list)
    generated: list[list[int]] = field(default_factory=list)
    #: True when every request's prompt was exactly the ids built so far.
    prompts_exact: bool = True

    def append(
        self, ids: list[int], generated: bool, logprobs: list[float] | None = None
    ) -> None:
        self.token_ids += ids
        self.response_mask += [int(generated)] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)


def read_chat_template(path: str | None) -> str | None:
    """The text of a ``model.chat_template`` file, or None; a missing file is a one-line error."""
    if not path:
        return None
    file = Path(path).expanduser()
    if not file.is_file():
        raise MissingFileError(
            f"model.chat_template={path!r} does not exist; point it at a Jinja chat template file"
        )
    return file.read_text()


async def sample_conversation(
    engine: EngineClient,
    builder: ChatPromptBuilder,
    settings: CheckSettings,
    request_prefix: str = "check",
) -> SampledConversation:
    """Play ``settings.turns`` turns against ``engine`` (a VLLMEngine or EngineClient) the way an EnvManager does."""
    conversation = SampledConversation(user_texts=list(_USER_TURNS[: settings.turns]))
    conversation.append(
        builder.first_turn_ids(conversation.user_texts[0]), generated=False
    )
    for turn in range(settings.turns):
        prompt = list(conversation.token_ids)
        result = await engine.generate(
            GenerationRequest(
                request_id=f"{request_prefix}-{turn}-{time.monotonic_ns()}",
                prompt_token_ids=prompt,
                max_tokens=settings.max_tokens,
                temperature=settings.temperature,
                top_p=settings.top_p,
                top_k=settings.top_k,
                seed=settings.seed + turn,
            )
        )
        conversation.prompts_exact &= result.num_prompt_tokens in (0, len(prompt))
        conversation.append(
            result.output_token_ids, generated=True, logprobs=result.logprobs
        )
        conversation.generated.append(list(result.output_token_ids))
        if turn + 1 < settings.turns:
            delta = builder.closure_ids_after(
                result.output_token_ids
            ) + builder.user_delta_ids(conversation.user_texts[turn + 1])
            conversation.append(delta, generated=False)
    return conversation


def trainer_logprob_gap(
    trainer: GRPOTrainer,
    conversation: SampledConversation,
    pad_token_id: int,
    sampling: SamplingSettings | None = None,
) -> tuple[float, float, int]:
    """(max, mean) |engine - trainer| logprob over the generated tokens, and how many tokens were compared.

    The trainer scores under ``sampling`` (a SamplingSettings: the engine's temperature/top-p/top-k), as in training.
    """
    trajectory = Trajectory(
        tag="check",
        group_id=0,
        episode_id=0,
        env_id=0,
        seed=0,
        traj_id="check",
        created_step=0,
        token_ids=conversation.token_ids,
        response_mask=conversation.response_mask,
        logprobs=conversation.logprobs,
    )
    batch = collate_trajectories(
        [trajectory], pad_token_id=pad_token_id, sampling=sampling or SamplingSettings()
    )
    scored = trainer.compute_logprobs(batch)[0]
    mask = batch.response_mask[0].bool()
    gaps = (scored[mask] - batch.old_logprobs[0][mask]).abs()
    if gaps.numel() == 0:
        return 0.0, 0.0, 0
    return float(gaps.max()), float(gaps.mean()), int(gaps.numel())


def perturb_weights(
    model: torch.nn.Module, seed: int, scale: float = PERTURB_SCALE
) -> None:
    """Add seeded noise to every parameter, relative to its own magnitude (norm weights of 1 included)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            magnitude = float(param.detach().abs().mean()) or 1.0
            noise = torch.randn(
                param.shape, generator=generator, dtype=torch.float32
            ).to(param.device, param.dtype)
            param.add_(noise * magnitude * scale)


def _sampling_settings(settings: CheckSettings) -> Any:
    return SamplingSettings.from_generation(settings)


def _fails(check: str, detail: str, fix: str) -> CheckRow:
    return CheckRow(check, "FAIL", detail, fix)


def check_template(
    tokenizer: ChatTokenizer, settings: CheckSettings
) -> tuple[list[CheckRow], Any]:
    """The template rows and a ChatPromptBuilder (None when the template is unusable)."""
    try:
        builder = ChatPromptBuilder(
            tokenizer,
            settings.system_prompt,
            chat_template=read_chat_template(settings.chat_template),
        )
        behaviour = builder.describe()
    except ChatTemplateError as exc:
        return [
            _fails(
                "chat template",
                str(exc).split(";")[0],
                "set model.chat_template to a template file that keeps every message",
            )
        ], None
    rows = [
        CheckRow(
            "template append-only",
            "info",
            "yes" if behaviour.append_only else "no: " + "; ".join(behaviour.notes),
        ),
        CheckRow("template turn closure", "ok", repr(behaviour.closure)),
        CheckRow("template next user turn", "ok", repr(behaviour.user_turn)),
    ]
    if behaviour.append_only and behaviour.notes:
        rows.append(CheckRow("template notes", "info", "; ".join(behaviour.notes)))
    return rows, builder


async def run_checks(
    model_dir: str,
    settings: CheckSettings,
    also_sampling: list[CheckSettings] | None = None,
) -> list[CheckRow]:
    """Every check in order; later checks are skipped (not failed) when an earlier one leaves nothing to test.

    In order: the chat template (can every turn be derived, is it append-only, what it rewrites);
    transformers loads the model (the trainer's view); vLLM loads it (the engine's view); a sampled
    multi-turn conversation whose every prompt is exactly the ids built so far, compared with a fresh
    render of its text; engine vs trainer logprobs on the generated tokens; and a weight-sync round
    trip (perturb the trainer's weights, sync them, check the engine's outputs change and its logprobs
    match the perturbed trainer: no stale weights or prefix).

    ``also_sampling``: more sampling settings to sample a conversation at and compare logprobs (same engine).
    """
    path = Path(model_dir).expanduser()
    if not (path / "config.json").is_file():
        return [
            _fails(
                "model directory",
                f"{model_dir!r} has no config.json",
                "point check-model at a Hugging Face model directory (save_pretrained output)",
            )
        ]
    try:
        tokenizer = load_tokenizer(str(path))
    except Exception as exc:
        return [
            _fails(
                "tokenizer",
                f"{type(exc).__name__}: {exc}",
                "save the tokenizer into the model directory",
            )
        ]
    rows, builder = check_template(tokenizer, settings)
    if builder is None:
        return rows

    try:
        trainer = GRPOTrainer(
            TrainerConfig(device="cpu", dtype="float32", micro_batch_size=1),
            str(path),
            tokenizer=tokenizer,
        )
        trainer.model.eval()
        rows.append(CheckRow("transformers load", "ok", type(trainer.model).__name__))
    except Exception as exc:
        rows.append(
            _fails(
                "transformers load",
                f"{type(exc).__name__}: {str(exc)[:200]}",
                "use an architecture transformers supports (or trust_remote_code for a custom one)",
            )
        )
        return rows

    engine = VLLMEngine(
        str(path),
        EngineConfig(
            dtype="float32",
            max_model_len=settings.max_model_len,
            max_num_seqs=8,
            cpu_kv_cache_space_gib=settings.cpu_kv_cache_space_gib,
            seed=settings.seed,
        ),
    )
    started = time.perf_counter()
    try:
        await engine.start()
    except EngineStartupError as exc:
        rows.append(
            _fails(
                "vLLM load",
                str(exc)[-300:],
                "use an architecture vLLM supports on this device (see vLLM's supported models list)",
            )
        )
        return rows
    try:
        rows.append(
            CheckRow(
                "vLLM load", "ok", f"started in {time.perf_counter() - started:.0f} s"
            )
        )
        pad = padding_token_id(tokenizer)
        for index, current in enumerate([settings, *(also_sampling or [])]):
            rows += await _conversation_rows(
                engine, builder, trainer, current, pad, with_template_rows=index == 0
            )
        rows.append(
            await _weight_sync_round_trip(
                engine, trainer, builder, settings, pad, GenerationRequest
            )
        )
    finally:
        await engine.shutdown()
    return rows


async def _conversation_rows(
    engine: VLLMEngine,
    builder: ChatPromptBuilder,
    trainer: GRPOTrainer,
    settings: CheckSettings,
    pad: int,
    with_template_rows: bool,
) -> list[CheckRow]:
    """Sample a conversation at ``settings``: token-in/token-out, fresh render, engine vs trainer logprobs."""
    sampling = (
        f"T={settings.temperature}, top_p={settings.top_p}, top_k={settings.top_k}"
    )
    conversation = await sample_conversation(engine, builder, settings)
    rows = []
    if with_template_rows:
        rows.append(
            CheckRow(
                "token-in/token-out",
                "ok" if conversation.prompts_exact else "FAIL",
                f"{settings.turns} turns, {sum(conversation.response_mask)} generated of {len(conversation.token_ids)} ids ({sampling})",
                ""
                if conversation.prompts_exact
                else "the engine saw a different prompt length than the ids built; report a bug",
            )
        )
        differs = builder.fresh_render_differs(
            conversation.token_ids, conversation.user_texts, conversation.generated
        )
        rows.append(
            CheckRow(
                "fresh render vs incremental ids",
                "info",
                "differs (the template re-renders earlier turns; the model's own ids are kept)"
                if differs
                else "identical text",
            )
        )
    worst, average, count = trainer_logprob_gap(
        trainer, conversation, pad, _sampling_settings(settings)
    )
    ok = (
        count > 0
        and worst <= LOGPROB_MAX_ABS_TOLERANCE
        and average <= LOGPROB_MEAN_ABS_TOLERANCE
    )
    rows.append(
        CheckRow(
            f"engine vs trainer logprobs ({sampling})",
            "ok" if ok else "FAIL",
            f"max |diff| {worst:.2e}, mean {average:.2e} over {count} tokens (tolerance max {LOGPROB_MAX_ABS_TOLERANCE}, mean {LOGPROB_MEAN_ABS_TOLERANCE})",
            ""
            if ok
            else "run engine and trainer in float32 (engine.dtype=float32); the trainer must score under the same sampling settings",
        )
    )
    return rows


async def _weight_sync_round_trip(
    engine: VLLMEngine,
    trainer: GRPOTrainer,
    builder: ChatPromptBuilder,
    settings: CheckSettings,
    pad: int,
    GenerationRequest: type[GenerationRequest],
) -> CheckRow:
    """Perturb, sync, compare: outputs must change and match the perturbed trainer on the same (cached) prompt."""
    greedy = dataclasses.replace(
        settings, temperature=0.0, top_p=1.0, top_k=-1, turns=1, max_tokens=16
    )
    before = await sample_conversation(engine, builder, greedy, "sync-before")
    perturb_weights(trainer.model, settings.seed + 1)
    await engine.pause("wait")
    try:
        await engine.update_weights(
            trainer.state_dict_for_engine(), engine.get_weight_version() + 1
        )
    finally:
        await engine.resume()
    after = await sample_conversation(engine, builder, greedy, "sync-after")
    worst, average, count = trainer_logprob_gap(
        trainer, after, pad, _sampling_settings(greedy)
    )
    changed = before.token_ids != after.token_ids or any(
        not math.isclose(a, b, abs_tol=1e-3)
        for a, b in zip(before.logprobs, after.logprobs)
    )
    ok = changed and count > 0 and worst <= LOGPROB_MAX_ABS_TOLERANCE
    detail = f"outputs {'changed' if changed else 'UNCHANGED'}; after sync max |engine - trainer| {worst:.2e} over {count} tokens"
    return CheckRow(
        "weight sync round trip",
        "ok" if ok else "FAIL",
        detail,
        ""
        if ok
        else "the engine did not take all weights (names, tied/fused layers) or reused a stale prefix cache",
    )


def format_table(rows: list[CheckRow]) -> str:
    width = max(len(r.check) for r in rows)
    lines = [
        f"{'check'.ljust(width)}  status  detail",
        f"{'-' * width}  ------  ------",
    ]
    for row in rows:
        lines.append(f"{row.check.ljust(width)}  {row.status.ljust(6)}  {row.detail}")
        if row.fix:
            lines.append(f"{''.ljust(width)}  {''.ljust(6)}  fix: {row.fix}")
    return "\n".join(lines)


def main(model_dir: str, settings: CheckSettings) -> int:
    rows = asyncio.run(run_checks(model_dir, settings))
    print(format_table(rows))
    failed = [r for r in rows if r.status == "FAIL"]
    print(
        f"\n{model_dir}: {'FAILED: ' + ', '.join(r.check for r in failed) if failed else 'all checks passed'}"
    )
    return 1 if failed else 0
