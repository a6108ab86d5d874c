"""The README is for users: short, no run journal; every train/rollout command the docs show passes ``--check``,
and every command they show runs for real in tests/integration/test_readme_commands.py."""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict
from pathlib import Path

import pytest

from roll_async.cli import main
from roll_async.config.schema import load_config
from tests.integration import readme_runs

REPO = Path(__file__).resolve().parents[3]
#: Every document a user reads commands in.
DOCUMENTS = [
    "README.md",
    *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")),
]
#: Placeholders a reader replaces; the check runs with the offline tiny model instead.
PLACEHOLDER_OVERRIDES = {"model.path=/path/to/hf-model"}
#: The commands that run something (a bare ``roll-async rollout`` in prose names the subcommand).
RUNNABLE = re.compile(
    r"^(?:(?:\.venv/bin/)?roll-async (?:train|rollout|export|check-model|report)|bash scripts/main\.sh)\b"
)


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block, pairing each opening fence with its own closing one."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def _shell_lines(text: str) -> list[str]:
    lines = []
    for language, block in _fenced_blocks(text):
        if language in ("", "bash", "sh", "shell"):
            lines += [line.split(" #")[0].strip() for line in block.splitlines()]
    return lines


def _inline_code(text: str) -> list[str]:
    """The `code spans` of the prose (outside fenced blocks)."""
    prose = re.sub(r"^```\w*\n.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", prose)


def documented_commands() -> list[tuple[str, str]]:
    """(document, command) for each command the docs show in a shell block or inline, as written
    (whitespace collapsed, ``.venv/bin/`` dropped), with at least one argument; in order, without repeats."""
    found: list[tuple[str, str]] = []
    for name in DOCUMENTS:
        text = (REPO / name).read_text()
        for span in _shell_lines(text) + _inline_code(text):
            command = " ".join(span.split()).removeprefix(".venv/bin/")
            if (
                RUNNABLE.match(command)
                and len(command.split()) > 2 - command.startswith("bash")
                and (name, command) not in found
            ):
                found.append((name, command))
    return found


def readme_commands() -> list[tuple[str, list[str]]]:
    """(document, argv) for each train/rollout command, ``bash scripts/main.sh`` included; placeholders out."""
    commands = []
    for name, line in documented_commands():
        words = shlex.split(line)
        if words[:2] == ["bash", "scripts/main.sh"]:
            words = ["roll-async", "train", "configs/default.yaml", *words[2:]]
        if words[1:2] in (["train"], ["rollout"]) and "CONFIG" not in words:
            argv = [w for w in words[1:] if w not in PLACEHOLDER_OVERRIDES]
            if (name, argv) not in commands:
                commands.append((name, argv))
    return commands


COMMANDS = readme_commands()


def test_the_readme_shows_the_main_job_and_some_commands():
    assert ("README.md", ["train", "configs/default.yaml"]) in COMMANDS
    assert len(COMMANDS) >= 5


@pytest.mark.parametrize(
    "document, argv", COMMANDS, ids=[" ".join(argv) for _, argv in COMMANDS]
)
def test_each_documented_command_passes_the_check(
    document, argv, capsys, monkeypatch, tiny_model_path
):
    monkeypatch.chdir(REPO)
    argv = argv if "--check" in argv else [*argv, "--check"]
    rc = main(argv)
    assert rc == 0, (
        f"{document}: roll-async {' '.join(argv)}: {capsys.readouterr().err}"
    )


def test_the_readme_is_for_users_not_a_run_journal():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", text), (
        "dates belong in commit messages"
    )
    assert not re.findall(r"\bissue[s]? ?#?\d+", text, flags=re.I), (
        "no internal issue numbers"
    )


def test_every_documented_command_runs_for_real_in_the_slow_tier():
    """A command added to the README or docs must be added to readme_runs.COVERAGE (and run there)."""
    documented = {command for _, command in documented_commands()}
    missing = sorted(documented - set(readme_runs.COVERAGE))
    assert not missing, (
        "documented but never run: add each to tests/integration/readme_runs.py's COVERAGE "
        f"and a test running it: {missing}"
    )
    stale = sorted(set(readme_runs.COVERAGE) - documented)
    assert not stale, f"COVERAGE lists commands the docs no longer show: {stale}"
    for command, test in readme_runs.COVERAGE.items():
        if test == readme_runs.CHECKED:
            continue
        path, _, name = test.partition("::")
        assert re.search(rf"^(async )?def {name}\(", (REPO / path).read_text(), re.M), (
            command,
            test,
        )


def test_the_learning_demo_commands_shortened_are_the_main_job():
    """Why one run covers both: default.yaml is the demo's config plus validation, which SHORT turns off."""
    short = [*readme_runs.SHORT, *readme_runs.SHORT_SFT]
    for mode in ([], ["mode=async", "max_staleness=1"]):
        demo = asdict(
            load_config(REPO / "configs/demo_learn_frozen_lake.yaml", short + mode)
        )
        main = asdict(load_config(REPO / "configs/default.yaml", short + mode))
        assert demo.pop("val_env_manager") != main.pop("val_env_manager")
        assert demo == main
        assert main["eval_steps"] == 0  # so val_env_manager is never used


def test_the_command_finder_reads_shell_blocks_and_inline_commands():
    found = {command for _, command in documented_commands()}
    assert (
        "roll-async check-model /path/to/hf-model --temperature 0.7 --top-p 0.9"
        in found
    )
    assert (
        "roll-async train configs/default.yaml trainer.strategy=fsdp2 trainer.num_ranks=2"
        in found
    )
    assert "roll-async rollout" not in found  # prose naming the subcommand
