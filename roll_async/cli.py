"""The ``roll-async`` command line: the composition root that wires configs to pipelines.

Subcommands import their pipeline lazily so that ``roll-async --help`` stays fast
and a command never pays for vLLM or Ray unless it uses them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

from roll_async.errors import ConfigError, UserCodeError


def _cmd_make_tiny_model(args: argparse.Namespace) -> int:
    from roll_async.model.tiny_vl import build_tiny_vl_family

    path = build_tiny_vl_family(
        args.family, args.out, force=args.force
    )  # None unless --family names a VL family
    if path is None and args.family is not None:
        from roll_async.model.families import UnknownFamilyError, build_family_model
        from roll_async.model.tiny_vl import FAMILY as VL_FAMILY

        try:
            path = build_family_model(args.family, args.out, force=args.force)
        except UnknownFamilyError as exc:
            print(f"roll-async: {exc}; vision-language: {VL_FAMILY}", file=sys.stderr)
            return 2
    if path is None:
        from roll_async.model.tiny import build_tiny_model

        path = build_tiny_model(args.out, force=args.force)
    print(path)
    return 0


def _cmd_check_model(args: argparse.Namespace) -> int:
    # The engine runs in this process: its INFO lines would bury the table (init_ray's default for the pipelines).
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from roll_async.model.check import CheckSettings, main

    settings = CheckSettings(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        chat_template=args.chat_template,
        system_prompt=args.system_prompt,
    )
    return main(args.model_dir, settings)


def _cmd_demo(args: argparse.Namespace) -> int:
    from roll_async.config.schema import load_config
    from roll_async.pipelines.generate_demo import run_generate_demo

    config = load_config(args.config, args.overrides)
    run_generate_demo(config, num_prompts=args.num_prompts, max_tokens=args.max_tokens)
    return 0


def _check(args: argparse.Namespace, command: Literal["train", "rollout"]) -> int:
    """``--check``: what the pipeline runs before its first actor, nothing more (no Ray, no vLLM).

    Loads and validates the config, resolves the model (building the offline tiny model if missing), checks
    its architecture, tokenizer, chat template and images, and builds one env per tag (the pipelines' own
    ``preflight``). Prints one OK line and returns 0, or the error and 1 (an error raised by user code: its
    traceback first).
    """
    from roll_async.config.schema import load_config
    from roll_async.pipelines.preflight import preflight, used_tags

    try:
        config = load_config(args.config, args.overrides)
        model_path, _ = preflight(config)
    except ConfigError as exc:
        print(f"roll-async: {args.config}: config error: {exc}", file=sys.stderr)
        return 1
    except UserCodeError as exc:
        _print_user_code_error(exc, f"{args.config}: ")
        return 1
    except Exception as exc:
        # the check reports every failure as a result, not a traceback
        print(
            f"roll-async: {args.config}: check failed: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return 1
    work = (
        f"{config.max_steps} steps of {config.rollout_batch_size} trajectories"
        if command == "train"
        else f"{config.num_batches} batches of {config.rollout_batch_size} trajectories"
    )
    rewards = "".join(
        f", {tag} reward: {reward.kind} {reward.model_path}"
        for tag in used_tags(config)
        if (reward := config.custom_envs[tag].reward) is not None
    )
    print(
        f"OK {args.config}: {command} mode={config.mode}, model {model_path}, "
        f"envs {', '.join(used_tags(config))}{rewards}, {work} (checked; nothing started)"
    )
    return 0


def _print_user_code_error(exc: UserCodeError, where: str = "") -> None:
    """The user's own traceback (from their first frame), then one line naming the config key that led to it."""
    print(exc.user_traceback(), end="", file=sys.stderr)
    print(f"roll-async: {where}error in user code: {exc}", file=sys.stderr)


def _rerun_command(
    command: str, args: argparse.Namespace, replaced: tuple[str, ...], *extra: str
) -> str:
    """The command line to go on after an interrupt: the same config and overrides, less ``replaced``."""
    kept = [o for o in args.overrides if not o.startswith(replaced)]
    return " ".join([f"roll-async {command}", args.config, *kept, *extra])


def _cmd_rollout(args: argparse.Namespace) -> int:
    if args.check:
        return _check(args, "rollout")
    from roll_async.config.schema import load_config
    from roll_async.pipelines.interrupt import (
        RolloutInterrupted,
        SignalReceived,
        exit_status,
    )
    from roll_async.pipelines.rollout_pipeline import run_rollout

    config = load_config(args.config, args.overrides)
    try:
        run_rollout(config)
    except RolloutInterrupted as stop:
        # A rollout run has no resume: the command collects the remaining batches in a new run directory.
        command = _rerun_command(
            "rollout",
            args,
            ("num_batches=", "output_dir="),
            f"num_batches={config.num_batches - stop.batch}",
        )
        print(f"{stop}; collect the rest with: {command}", file=sys.stderr, flush=True)
        return exit_status(stop.signal_name)
    except SignalReceived as stop:
        print(
            f"interrupted ({stop}) before the first batch; nothing to keep",
            file=sys.stderr,
            flush=True,
        )
        return exit_status(str(stop))
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    if args.check:
        return _check(args, "train")
    from roll_async.config.schema import load_config
    from roll_async.pipelines.agentic_pipeline import run_train
    from roll_async.pipelines.interrupt import (
        RunInterrupted,
        SignalReceived,
        exit_status,
    )

    config = load_config(args.config, args.overrides)
    try:
        run_train(config)
    except RunInterrupted as stop:
        command = _rerun_command(
            "train",
            args,
            ("checkpoint.resume_from=", "output_dir="),
            f"output_dir={stop.run_dir}",
        )
        if stop.checkpoint:
            print(
                f"{stop}; resume with: {command} checkpoint.resume_from={stop.run_dir}",
                file=sys.stderr,
                flush=True,
            )
        else:
            print(f"{stop}; start again with: {command}", file=sys.stderr, flush=True)
        return exit_status(stop.signal_name)
    except SignalReceived as stop:
        print(
            f"interrupted ({stop}) before the first step; nothing to keep",
            file=sys.stderr,
            flush=True,
        )
        return exit_status(str(stop))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from roll_async.report import write_report, write_trace

    print(write_report(args.run_dir))
    if args.trace:
        print(write_trace(args.run_dir))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from roll_async.model.export import export_checkpoint

    try:
        print(export_checkpoint(args.run_dir, args.out, args.step))
    except FileExistsError as exc:
        print(f"roll-async: {exc}", file=sys.stderr)
        return 2
    return 0


def _cmd_make_env_dataset(args: argparse.Namespace) -> int:
    from roll_async.envs import dataset

    return dataset.main(args)


def _cmd_env_server(args: argparse.Namespace) -> int:
    from roll_async.env_service.server_cli import main as serve

    return serve(args)


def _cmd_build_image(args: argparse.Namespace) -> int:
    """scripts/docker_setup.sh from the source checkout: dockerd installed and answering, the base image built."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "docker_setup.sh"
    if not script.is_file():
        print(
            f"roll-async: {script} is missing: build-image runs from a source checkout of roll-async",
            file=sys.stderr,
        )
        return 2
    env = {**os.environ, "ROLL_ASYNC_SWE_IMAGE": args.image}
    return subprocess.run(["bash", str(script)], env=env, check=False).returncode


def _add_check_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help="check the config, model, tokenizer and envs as the run would before its first actor, "
        "print one OK line and exit (0: OK, 1: the error); starts neither Ray nor vLLM",
    )


def _importable_from_working_directory() -> None:
    """Modules a config names (env_type, agent, trainer_cls) resolve from the directory the command runs in.

    Ray puts the driver's working directory on its workers' import path; the console script does not put
    it on the driver's, so without this the driver's checks could not import what the workers will.
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="roll-async",
        description="Asynchronous per-environment rollout engine for multi-turn LLM agent RL.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "make-tiny-model",
        help="build the offline tiny model (idempotent) and print its path",
    )
    p.add_argument(
        "--out",
        default=None,
        help="directory (default: ~/.cache/roll_async/<build id>)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="rebuild even if the directory is up to date",
    )
    p.add_argument(
        "--family",
        default=None,
        help="build a tiny random-init model of a real family instead (qwen2_5, qwen3, qwen3_moe, llama3, mistral, "
        "gemma3, phi3; idefics3_vl: the tiny vision-language model)",
    )
    p.set_defaults(func=_cmd_make_tiny_model)

    from roll_async.model.check import DEFAULT_SYSTEM_PROMPT

    p = sub.add_parser(
        "check-model",
        help="will this model work here? template behaviour, incremental ids, engine vs trainer logprobs, weight sync",
    )
    p.add_argument("model_dir", help="a Hugging Face model directory")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument(
        "--chat-template",
        default=None,
        help="a Jinja chat template file overriding the tokenizer's (model.chat_template)",
    )
    p.add_argument(
        "--system-prompt",
        default=DEFAULT_SYSTEM_PROMPT,
        help="system prompt of the mock conversation ('' for none)",
    )
    p.set_defaults(func=_cmd_check_model)

    p = sub.add_parser(
        "demo",
        help="start the engine on the configured model and generate for a batch of env chat prompts",
    )
    p.add_argument(
        "config",
        nargs="?",
        default="configs/default.yaml",
        help="YAML config (default: configs/default.yaml)",
    )
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser(
        "rollout",
        help="collect num_batches batches of trajectories and write the run directory",
    )
    p.add_argument("config", help="YAML config, e.g. configs/sokoban.yaml")
    p.add_argument(
        "overrides",
        nargs="*",
        help="key=value config overrides, e.g. num_batches=4 output_dir=runs/x",
    )
    _add_check_flag(p)
    p.set_defaults(func=_cmd_rollout)

    p = sub.add_parser(
        "train",
        help="the agentic training pipeline (rollout, GRPO step, weight sync; sync or async)",
    )
    p.add_argument("config", help="YAML config, e.g. configs/sokoban.yaml")
    p.add_argument(
        "overrides",
        nargs="*",
        help="key=value config overrides, e.g. mode=async max_staleness=2",
    )
    _add_check_flag(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser(
        "report",
        help="write RUN_DIR/report.html: env timeline, curves, staleness, trajectory browser",
    )
    p.add_argument(
        "run_dir",
        help="a run directory (the output_dir of roll-async train or rollout)",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="also write RUN_DIR/trace.json (Chrome trace / Perfetto)",
    )
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser(
        "export",
        help="write a run's checkpoint as a Hugging Face model directory (weights, config, tokenizer, template)",
    )
    p.add_argument(
        "run_dir", help="a run directory with checkpoints/step_N (or one checkpoint)"
    )
    p.add_argument(
        "--step", type=int, default=None, help="the checkpoint's step (default: newest)"
    )
    p.add_argument("--out", required=True, help="a new (or empty) output directory")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser(
        "make-env-dataset",
        help="write an env-config parquet (one row per env instance)",
    )
    from roll_async.envs import dataset

    dataset.add_arguments(p)
    p.set_defaults(func=_cmd_make_env_dataset)

    p = sub.add_parser(
        "env-server",
        help="serve registered envs over HTTP (create/reset/step/close, /health) for custom_envs.<Tag>.service_url",
    )
    from roll_async.env_service.server_cli import (
        add_arguments as add_env_server_arguments,
    )

    add_env_server_arguments(p)
    p.set_defaults(func=_cmd_env_server)

    p = sub.add_parser(
        "build-image",
        help="for the docker workspace runtime: install and start dockerd if needed and build the offline "
        "base image from Debian packages (scripts/docker_setup.sh; idempotent)",
    )
    p.add_argument(
        "--image",
        default="roll-async/swe-base:1",
        help="the base image's name (default: roll-async/swe-base:1)",
    )
    p.set_defaults(func=_cmd_build_image)

    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _importable_from_working_directory()
    from roll_async.run_output.logs import configure_console

    # pipelines narrow it to logging.level and add RUN_DIR/logs/ once they know the run
    configure_console("INFO")
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"roll-async: config error: {exc}", file=sys.stderr)
        return 2
    except UserCodeError as exc:
        # the user's bug, not the config's: their traceback, and 1 as for any failure (2 is a config error)
        _print_user_code_error(exc)
        return 1
    except FileNotFoundError as exc:
        print(f"roll-async: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # a Ctrl-C before a pipeline installed its own handling (e.g. during start-up)
        print("roll-async: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
