"""The README's commands and code actually run, and every command is documented."""

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from splitplan.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, re.S)
COMMANDS = [line for lang, body in BLOCKS if lang == "bash" for line in body.splitlines() if line.startswith("splitplan ")]


@pytest.mark.parametrize("line", COMMANDS)
def test_readme_command_runs(line, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(app, shlex.split(line)[1:])
    assert result.exit_code == 0, result.output


def test_readme_python_runs(monkeypatch):
    monkeypatch.chdir(ROOT)
    for lang, body in BLOCKS:
        if lang == "python":
            exec(compile(body, "README.md", "exec"), {})


def test_every_command_is_documented():
    import typer.main
    group = typer.main.get_command(app)
    names = []
    for name, cmd in group.commands.items():
        sub = getattr(cmd, "commands", None)
        names += [f"{name} {s}" for s in sub] if sub else [name]
    for name in names:
        assert f"splitplan {name}" in README, f"README lacks `splitplan {name}`"


def test_quickstart_has_the_two_setup_commands():
    assert "pip install . && splitplan" in README and "pip install '.[test]' && pytest" in README
