"""Checks that need more than the schema (envs, model, tokenizer), run before any actor starts.

validate_config() covers rules between fields; this covers what only building the
pieces can tell: an env_config an env rejects, a model path that does not exist,
a tokenizer without a chat template, a template that cannot be used turn by turn, an
architecture the trainer or vLLM cannot load. Each failure names the key and the fix.
The user code a config names (env classes, agent functions, a custom trainer) is imported first, by
:func:`import_user_code`, on the caller's thread; an error inside that code is a ``UserCodeError``
(shown with its traceback), never a config error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from roll_async.agent_gateway.errors import OpenAIError
from roll_async.agent_gateway.task import load_agent_function
from roll_async.agent_gateway.tool_calls import ToolCallParser
from roll_async.config.dotted_paths import calling_user_code, resolve_dotted
from roll_async.config.reward_rules import TINY_MODEL
from roll_async.config.schema import CustomEnvConfig, PipelineConfig
from roll_async.config.seat_rules import parse_seats
from roll_async.config.sections import VERIFIERS_PREFIX
from roll_async.engine.engine_args import engine_dtype
from roll_async.env_service.client import check_service
from roll_async.env_service.process_env import EnvProcessError, ProcessEnv
from roll_async.envs import make_env
from roll_async.envs.adapters.verifiers_env import load_verifiers_env
from roll_async.envs.multiplayer import make_game
from roll_async.envs.multiplayer.seats import check_game_seats
from roll_async.envs.registry import names_user_class
from roll_async.envs.swe.agent_workspace import agent_swe_config
from roll_async.errors import (
    ChatTemplateError,
    ConfigError,
    EnvLibraryError,
    EnvServiceError,
    EnvServiceUnavailable,
    VisionInputError,
)
from roll_async.model.paths import resolve_model_path
from roll_async.prompts.images import (
    VisionProcessor,
    is_vision_tag,
    model_is_vision_language,
    observation_encoder,
)
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.prompts.tokenizers import ChatTokenizer, load_tokenizer
from roll_async.trainer.checkpoint import read_checkpoint_state, resolve_resume_dir
from roll_async.trainer.factory import load_trainer_class
from roll_async.trainer.lora import (
    check_target_modules,
    lora_enabled,
    model_linear_module_names,
)
from roll_async.trainer.parallel.sharded_checkpoint import check_resumable_by_fsdp2

logger = logging.getLogger(__name__)


def used_tags(config: PipelineConfig) -> list[str]:
    """Tags that train or validation envs use, sorted."""
    used = set(config.train_env_manager.tags)
    if config.val_env_manager.num_env_groups > 0:
        used |= set(config.val_env_manager.tags)
    return sorted(used)


def import_user_code(config: PipelineConfig) -> None:
    """Import every module of user code the config names: env classes of in-process tags, agents, ``trainer_cls``.

    Call it on the main thread (``preflight`` does; the train pipeline calls it on its loop's thread before
    preflight's worker thread): only there may a module set a signal handler at import time, and only there
    can roll-async put its own SIGINT/SIGTERM handling back (``resolve_dotted``). The modules stay imported,
    so later imports in any thread are lookups. Env servers' and isolated (``isolation: process``) tags'
    envs are imported where they run, not here.
    """
    for tag in used_tags(config):
        spec = config.custom_envs[tag]
        if spec.agent_function:
            load_agent_function(spec.agent_function, f"custom_envs.{tag}.agent")
            load_verifiers_tag(tag, spec)
            continue
        if spec.service_url or spec.isolation == "process":
            continue
        paths = [("env_type", spec.env_type)]
        paths += [
            (f"seats[{seat.seat}]", seat.player)
            for seat in parse_seats(tag, spec.seats)
            if ":" in seat.player
        ]
        inner = spec.env_config.get("inner_env_type")
        if isinstance(inner, str):
            paths.append(("env_config.inner_env_type", inner))
        for key, path in paths:
            if names_user_class(path):
                resolve_dotted(path, f"custom_envs.{tag}.{key}={path!r}")
    if config.trainer.trainer_cls:
        load_trainer_class(config.trainer.trainer_cls)


def load_verifiers_tag(tag: str, spec: CustomEnvConfig) -> None:
    """Load a ``verifiers:<env id>`` tag's environment here (the main thread, where its signal handlers are
    undone): one that cannot load, or a missing verifiers, fails at load naming the key. No-op for other tags."""
    if spec.env_type.startswith(VERIFIERS_PREFIX):
        load_verifiers_env(
            spec.env_type, dict(spec.env_config), f"custom_envs.{tag}.env_type"
        )


def check_envs(config: PipelineConfig) -> None:
    """Build and reset one env per used tag; any error names ``custom_envs.<tag>``.

    An exception raised by a user env class (``env_type: package.module:Class``) while it is built or reset
    is the user's: a ``UserCodeError`` naming ``custom_envs.<tag>.env_type``, with the original's traceback.
    """
    for tag in used_tags(config):
        spec = config.custom_envs[tag]
        if spec.agent_function:
            try:
                load_agent_function(spec.agent_function, f"custom_envs.{tag}.agent")
                load_verifiers_tag(tag, spec)
                if spec.drives_workspace:  # a key only stepped episodes use fails here
                    agent_swe_config(spec.env_config, f"custom_envs.{tag}.env_config")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            if spec.drives_workspace:  # its task set loads and a workspace starts
                check_env_in_process(tag, spec, config)
            continue
        if spec.seats:
            check_game(tag, spec, config)
            continue
        if spec.service_url or spec.isolation == "process":
            check_env_out_of_process(tag, spec, config)
            continue
        check_env_in_process(tag, spec, config)


def check_game(tag: str, spec: CustomEnvConfig, config: PipelineConfig) -> None:
    """A game tag (``custom_envs.<tag>.seats``): its seats fit the game, its players import, one game starts.

    A game class's own exception while it is built or reset is the user's (a ``UserCodeError``).
    """
    key = f"custom_envs.{tag}.env_type={spec.env_type!r}"
    seats = check_game_seats(tag, spec.env_type, dict(spec.env_config), spec.seats)
    user = names_user_class(spec.env_type)

    def user_call(call: str) -> contextlib.AbstractContextManager[None]:
        return calling_user_code(key, call) if user else contextlib.nullcontext()

    try:
        with user_call("its constructor with env_config"):
            game = make_game(spec.env_type, dict(spec.env_config))
        with user_call(f"reset({config.seed}) and get_observation()"):
            game.reset(config.seed)
            seen = game.get_observation()
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"custom_envs.{tag}: {exc}") from None
    for seat in seats:
        if seat.kind == "frozen":
            check_frozen_model(tag, seat.seat, seat.player, config)
    random_seats = [s.seat for s in seats if s.player == "random"]
    if random_seats and not seen.legal_actions:
        raise ConfigError(
            f"custom_envs.{tag}.seats[{random_seats[0]}]=random: {spec.env_type!r} lists no legal actions "
            "(its first observation has none) for the random player to pick from; use "
            "scripted:package.module:function"
        )


def check_frozen_model(tag: str, seat: int, model: str, config: PipelineConfig) -> None:
    """A ``frozen:`` seat's model exists and its tokenizer loads offline; ConfigError naming the seat."""
    key = f"custom_envs.{tag}.seats[{seat}]='frozen:{model}'"
    try:
        path = resolve_model_path(model)
        load_tokenizer(path, trust_remote_code=config.model.trust_remote_code)
    except Exception as exc:  # a missing directory, a tokenizer that does not load
        raise ConfigError(
            f"{key}: the model cannot be used ({type(exc).__name__}: {exc}); give a local HF model "
            "directory, tiny or tiny-<family>"
        ) from None


def check_env_in_process(
    tag: str, spec: CustomEnvConfig, config: PipelineConfig
) -> None:
    """Build, reset and close one env of ``tag`` here; a user class's own exception is a ``UserCodeError``."""
    key = f"custom_envs.{tag}.env_type={spec.env_type!r}"
    user = names_user_class(spec.env_type)

    def user_call(call: str) -> contextlib.AbstractContextManager[None]:
        return calling_user_code(key, call) if user else contextlib.nullcontext()

    try:
        with user_call("its constructor with env_config"):
            env = make_env(spec.env_type, dict(spec.env_config))
        with user_call(f"reset(seed={config.seed})"):
            _settle(env.reset(seed=config.seed))
        close = getattr(env, "close", None)
        if callable(close):
            with user_call("close()"):
                _settle(close())
    except (ValueError, TypeError, EnvLibraryError) as exc:
        raise ConfigError(f"custom_envs.{tag}: {exc}") from None


def check_env_out_of_process(
    tag: str, spec: CustomEnvConfig, config: PipelineConfig
) -> None:
    """A tag on env servers: each URL answers and builds one env; an isolated tag: one env builds in a child."""
    timeout = config.train_env_manager.env_step_timeout_s
    if spec.service_url:
        try:
            _run_blocking(
                check_service(
                    spec.service_url,
                    spec.env_type,
                    dict(spec.env_config),
                    config.seed,
                    timeout,
                )
            )
        except (EnvServiceUnavailable, EnvServiceError) as exc:
            raise ConfigError(f"custom_envs.{tag}.service_url: {exc}") from None
        return
    env = ProcessEnv(
        functools.partial(make_env, spec.env_type, dict(spec.env_config)),
        name=f"{tag}-preflight",
    )
    try:
        env.start(timeout_s=max(60.0, timeout))
        _run_blocking(asyncio.wait_for(env.reset(config.seed), timeout))
    except (TimeoutError, EnvProcessError) as exc:
        raise ConfigError(
            f"custom_envs.{tag} (isolation: process): {exc or 'reset timed out'}"
        ) from None
    finally:
        env.kill("preflight done")


def _settle(result: Any) -> Any:
    """An env call's result; an ``async def`` env's coroutine is run to completion first."""
    return _run_blocking(result) if inspect.isawaitable(result) else result


def _run_blocking(coroutine: Any) -> Any:
    """Run ``coroutine`` to completion on a fresh event loop in a thread (preflight may run inside a loop)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def check_vision(config: PipelineConfig, model_path: str) -> None:
    """Preflight for vision tags: a VL model, a processor that loads offline, env images it accepts.

    Raises ``ConfigError`` naming the key and the fix, before any actor starts.
    """
    tags = [tag for tag in used_tags(config) if is_vision_tag(config.custom_envs[tag])]
    if not tags:
        return
    key = f"custom_envs.{tags[0]}.env_config.render_mode"
    if not model_is_vision_language(model_path):
        raise ConfigError(
            f"{key}=vision needs a vision-language model, but model.path={config.model.path!r} ({model_path}) has no "
            "vision_config; set model.path: tiny-vl (roll-async make-tiny-model --family idefics3_vl) or a local VL model, "
            "or use render_mode: text"
        )
    try:
        vision = VisionProcessor.load(
            model_path, trust_remote_code=config.model.trust_remote_code
        )
    except Exception as exc:
        raise ConfigError(
            f"model.path={config.model.path!r}: the image processor of {model_path!r} cannot be loaded offline "
            f"({type(exc).__name__}: {exc}); save the processor (processor.save_pretrained) into the model directory"
        ) from None
    limit = dict(config.engine.engine_kwargs.get("limit_mm_per_prompt") or {}).get(
        "image"
    )
    for tag in tags:
        spec = config.custom_envs[tag]
        images_per_episode = spec.max_steps + 1
        if limit is not None and int(limit) < images_per_episode:
            raise ConfigError(
                f"engine.engine_kwargs.limit_mm_per_prompt.image={limit} is below the {images_per_episode} images an "
                f"episode of custom_envs.{tag} can hold (max_steps + 1); raise it"
            )
        env = make_env(spec.env_type, dict(spec.env_config))
        try:
            observation, _ = env.reset(seed=config.seed)
            encoder = observation_encoder(spec, vision)
            text = encoder.text(observation)
            encoder.encode(
                vision.tokenizer(text, add_special_tokens=False)["input_ids"],
                observation,
            )
        except VisionInputError as exc:
            raise ConfigError(f"custom_envs.{tag}: {exc}") from None
        finally:
            close = getattr(env, "close", None)
            if callable(close):
                close()


def load_checked_tokenizer(config: PipelineConfig, model_path: str) -> ChatTokenizer:
    from transformers import AutoTokenizer

    try:
        tokenizer: ChatTokenizer = AutoTokenizer.from_pretrained(
            model_path, trust_remote_code=config.model.trust_remote_code
        )
    except Exception as exc:
        # transformers raises OSError/ValueError/... for unusable paths
        raise ConfigError(
            f"model.path={config.model.path!r}: cannot load a tokenizer from {model_path!r}: {exc}"
        ) from None
    if not getattr(tokenizer, "chat_template", None) and not config.model.chat_template:
        raise ConfigError(
            f"model.path={config.model.path!r}: the tokenizer has no chat template; multi-turn prompts need one "
            "(set model.chat_template to a Jinja template file, or use an instruct/chat model or the offline tiny model)"
        )
    if tokenizer.eos_token_id is None:
        raise ConfigError(
            f"model.path={config.model.path!r}: the tokenizer defines no eos token"
        )
    return tokenizer


def check_chat_template(config: PipelineConfig, tokenizer: ChatTokenizer) -> None:
    """Render a mock three-turn conversation per used system prompt, so an unusable template fails here.

    The error names what the template does (drops assistant content, cannot render the role order, ...)
    and the fix (``model.chat_template``).
    """
    tags = set(config.train_env_manager.tags) | set(
        config.val_env_manager.tags if config.val_env_manager.num_env_groups > 0 else []
    )
    for system_prompt in sorted(
        {config.custom_envs[tag].system_prompt or "" for tag in tags}
    ):
        try:
            ChatPromptBuilder.for_model(
                tokenizer, config.model, system_prompt
            ).describe()
        except ChatTemplateError as exc:
            raise ConfigError(f"model.path={config.model.path!r}: {exc}") from None


def check_tool_parser(config: PipelineConfig, tokenizer: ChatTokenizer) -> None:
    """``model.tool_parser`` must name one of vLLM's tool parsers that fits the tokenizer (set only for agents)."""
    name = config.model.tool_parser
    if not name:
        return
    try:
        ToolCallParser(name, tokenizer)
    except OpenAIError as exc:
        raise ConfigError(exc.message) from None


def check_architecture(config: PipelineConfig, model_path: str) -> None:
    """The model's architecture must be one transformers (trainer) and vLLM (engine) can load.

    The trainer loads a vision-language model through transformers' image-text-to-text classes and any
    other model as a causal LM (roll_async.trainer.model_loading.load_causal_lm); the check follows it.
    """
    import json
    from pathlib import Path

    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        return  # a hub id: its loaders report problems themselves
    architectures = json.loads(config_file.read_text()).get("architectures") or []
    if not architectures or config.model.trust_remote_code:
        return
    from transformers.models.auto import modeling_auto

    if model_is_vision_language(model_path):
        kind = "image-text-to-text"
        names = modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    else:
        kind, names = "causal-LM", modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    loaders = [("transformers (the trainer)", _class_names(names.values()))]
    try:
        from vllm.model_executor.models.registry import ModelRegistry

        loaders.append(("vLLM (the engine)", set(ModelRegistry.get_supported_archs())))
    except ImportError:
        pass  # no engine installed here: the engine's own start reports it
    for loader, supported in loaders:
        for arch in architectures:
            if arch not in supported:
                raise ConfigError(
                    f"model.path={config.model.path!r}: {loader} has no {kind} implementation of architecture {arch}; "
                    "use a supported architecture (`roll-async make-tiny-model --family` lists tested ones; "
                    "model.trust_remote_code=true for custom code)"
                )


def check_lora_targets(config: PipelineConfig, model_path: str) -> None:
    """trainer.lora.target_modules must name linear modules the model has (its architecture built on meta)."""
    lora = config.trainer.lora
    if not lora_enabled(lora):
        return
    try:
        names = model_linear_module_names(model_path, config.model.trust_remote_code)
    except (
        OSError,
        ValueError,
    ) as exc:  # a hub id not cached, an unknown architecture: the trainer reports it
        logger.warning("trainer.lora.target_modules not checked: %s", exc)
        return
    check_target_modules(names, lora.target_modules)


def check_resume_checkpoint(config: PipelineConfig) -> None:
    """checkpoint.resume_from must exist and suit this run's strategy and LoRA setting (it is read before any actor)."""
    source = config.checkpoint.resume_from
    if not source:
        return
    key = f"checkpoint.resume_from={source!r}"
    try:
        path = resolve_resume_dir(source)
        trainer_state, _ = read_checkpoint_state(path)
    except FileNotFoundError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    saved = trainer_state.get("trainer_config") or {}
    trainer = config.trainer
    if trainer.strategy == "fsdp2":
        check_resumable_by_fsdp2(path, source)
    saved_lora = int((saved.get("lora") or {}).get("rank", 0))
    if saved and bool(saved_lora) != lora_enabled(trainer.lora):
        raise ConfigError(
            f"{key}: the checkpoint holds {'LoRA adapters' if saved_lora else 'full weights'} but this run has "
            f"trainer.lora.rank={trainer.lora.rank}; set trainer.lora.rank={saved_lora} to resume it"
        )


def _class_names(values: Any) -> set[str]:
    """Class names of a transformers auto mapping (a value is one name or a tuple of names)."""
    names: set[str] = set()
    for value in values:
        names.update([value] if isinstance(value, str) else value)
    return names


def check_rewards(config: PipelineConfig) -> None:
    """Each used tag's reward model (custom_envs.<Tag>.reward) has a tokenizer that loads offline, and a judge's a
    chat template; the path, config.json and head were checked at load (RewardConfig.validate)."""
    for tag in used_tags(config):
        reward = config.custom_envs[tag].reward
        if reward is None or reward.model_path == TINY_MODEL:
            continue
        key = f"custom_envs.{tag}.reward.model_path={reward.model_path!r}"
        assert reward.model_path is not None  # RewardConfig.validate requires it
        try:
            tokenizer = load_tokenizer(
                reward.model_path, trust_remote_code=reward.trust_remote_code
            )
        except (
            Exception
        ) as exc:  # transformers raises OSError/ValueError/... for unusable paths
            raise ConfigError(
                f"{key}: cannot load its tokenizer offline ({type(exc).__name__}: {exc}); save the tokenizer "
                "(tokenizer.save_pretrained) into the model directory"
            ) from None
        if reward.kind == "judge" and not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"{key}: the judge's tokenizer has no chat template; use an instruct/chat model as the judge"
            )


def check_engine_dtypes(config: PipelineConfig) -> None:
    """An explicit bfloat16 engine (the policy's or a judge's) on a CPU that cannot run vLLM's bfloat16 kernels
    fails here, before any actor (engine_args.engine_dtype); ``auto`` is resolved by each engine on its node."""
    engines = [("engine.dtype", config.engine.dtype)]
    for tag in used_tags(config):
        reward = config.custom_envs[tag].reward
        if reward is not None and reward.kind == "judge":
            key = f"custom_envs.{tag}.reward.engine.dtype"
            engines.append((key, reward.engine.get("dtype", "auto")))
    for key, dtype in engines:
        if dtype != "bfloat16":
            continue
        try:
            engine_dtype(dtype, key)
        except ImportError:
            return  # no engine installed here: the engine's own start decides


def preflight(config: PipelineConfig) -> tuple[str, Any]:
    """Run every pre-actor check; returns the resolved model path and its tokenizer."""
    import_user_code(config)
    check_engine_dtypes(config)
    check_envs(config)
    check_rewards(config)
    try:
        model_path = resolve_model_path(config.model.path)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    check_architecture(config, model_path)
    check_lora_targets(config, model_path)
    check_resume_checkpoint(config)
    tokenizer = load_checked_tokenizer(config, model_path)
    check_chat_template(config, tokenizer)
    check_tool_parser(config, tokenizer)
    check_vision(config, model_path)
    return model_path, tokenizer
