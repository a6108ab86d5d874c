"""The README is for users: short, no run journal, and every train/rollout command it shows passes ``--check``."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from roll_async.cli import main

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = ["README.md", "docs/learning-demo.md", "docs/architecture.md"]
#: Placeholders a reader replaces; the check runs with the offline tiny model instead.
PLACEHOLDER_OVERRIDES = {"model.path=/path/to/hf-model"}


def _shell_lines(text: str) -> list[str]:
    lines = []
    for block in re.findall(r"```(?:bash|sh|shell)?\n(.*?)```", text, flags=re.S):
        lines += [line.split(" #")[0].strip() for line in block.splitlines()]
    return lines


def readme_commands() -> list[tuple[str, list[str]]]:
    """(document, argv) for each train/rollout command, ``bash scripts/main.sh`` included."""
    commands = []
    for name in DOCUMENTS:
        for line in _shell_lines((REPO / name).read_text()):
            if "roll-async" not in line and "scripts/main.sh" not in line:
                continue
            words = shlex.split(line)
            if words[:2] == ["bash", "scripts/main.sh"]:
                words = ["roll-async", "train", "configs/default.yaml", *words[2:]]
            if (
                words
                and words[0].endswith("roll-async")
                and words[1:2]
                in (
                    ["train"],
                    ["rollout"],
                )
            ):
                argv = [w for w in words[1:] if w not in PLACEHOLDER_OVERRIDES]
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
