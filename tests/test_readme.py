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


# Whole studies, Ray start-ups and the calibration run in the slow suite (pytest -m slow).
SLOW = ("iso-power", "--executor ray", "splitplan calibrate")


@pytest.mark.parametrize("line", [pytest.param(c, marks=pytest.mark.slow) if any(s in c for s in SLOW) else c
                                  for c in COMMANDS])
def test_readme_command_runs(line, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    args = shlex.split(line)[1:]
    shipped = None
    if "--output" in args:  # write elsewhere; the repository's file is the expected result
        k = args.index("--output") + 1
        shipped, args[k] = ROOT / args[k], str(tmp_path / Path(args[k]).name)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    if shipped is not None and args[0] == "calibrate":
        _same_profile(Path(args[args.index("--output") + 1]), shipped)


def _same_profile(made: Path, shipped: Path) -> None:
    """The README's calibrate command reproduces the shipped profile (to fit precision)."""
    import yaml
    a, b = yaml.safe_load(made.read_text()), yaml.safe_load(shipped.read_text())
    assert a.keys() == b.keys() and a["hardware_overrides"].keys() == b["hardware_overrides"].keys()
    for key in ["defaults", *(f"hardware_overrides.{k}" for k in b["hardware_overrides"])]:
        x, y = a, b
        for part in key.split(".", 1):
            x, y = x[part], y[part]
        for name in y:
            assert x[name] == pytest.approx(y[name], rel=2e-3, abs=1e-9), (key, name)


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
