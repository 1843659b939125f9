"""Fingerprint every output of the README's and docs' commands, to show a change altered none of them.

    python bench/readme_outputs.py --repo DIR --save before.json
    python bench/readme_outputs.py --repo DIR --save after.json --compare before.json

Runs each `splitplan ...` line of the bash blocks of README.md and docs/*.md (each once) with the code and data of
`--repo` (PYTHONPATH and working directory), in JSON form where the command has one
(`--format json` added when the line sets no format; the table form is run as written
too), and files written by `--output-dir`, `--output`, `--residuals` redirected to a
scratch directory. Records the SHA-256 of stdout and of every file written; `--compare`
prints each command whose fingerprints differ and exits 1 if any does. Plots (PNG) are
left out: their bytes depend on the matplotlib build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FILE_FLAGS = ("--output-dir", "--output", "--residuals")


def readme_commands(repo: Path) -> list[str]:
    """The commands of the README and docs/ (docs/ holds them since the README was split; an older
    checkout's README held them all)."""
    docs = [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
    blocks = [b for doc in docs for b in re.findall(r"```(\w*)\n(.*?)```", doc.read_text(), flags=re.S)]
    return list(dict.fromkeys(line for lang, body in blocks if lang == "bash"
                              for line in body.splitlines() if line.startswith("splitplan ")))


def fingerprint(repo: Path, line: str, scratch: Path) -> dict:
    args = shlex.split(line)[1:]
    out = scratch / hashlib.sha256(line.encode()).hexdigest()[:12]  # the same path every run: outputs may name it
    for k, a in enumerate(args):
        if a in FILE_FLAGS:
            args[k + 1] = str(out / Path(args[k + 1]).name)
        if a == "--plot":
            args[k + 1] = str(out / "plot.png")
    env = {**os.environ, "PYTHONPATH": str(repo), "COLUMNS": "200", "NO_COLOR": "1"}
    prefix = [sys.executable, "-c", "from splitplan.cli import main; main()"]
    runs = {"as written": args}
    if "--format" not in args and "--help" not in args:
        runs["json"] = args + ["--format", "json"]
    result = {}
    for tag, argv in runs.items():
        shutil.rmtree(out, ignore_errors=True)
        proc = subprocess.run(prefix + argv, cwd=repo, env=env, capture_output=True, text=True)
        if tag == "json" and proc.returncode == 2 and "No such option: --format" in proc.stderr:
            continue
        files = {}
        if out.exists():
            for f in sorted(out.rglob("*")):
                if f.is_file() and f.suffix != ".png":
                    files[str(f.relative_to(out))] = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
        result[tag] = {"exit": proc.returncode, "stdout": hashlib.sha256(proc.stdout.encode()).hexdigest()[:16], "files": files}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--save", type=Path, required=True)
    parser.add_argument("--compare", type=Path)
    args = parser.parse_args()
    repo = args.repo.resolve()
    scratch = Path(tempfile.gettempdir()) / "splitplan-readme-outputs"
    prints = {line: fingerprint(repo, line, scratch) for line in readme_commands(repo)}
    args.save.write_text(json.dumps(prints, indent=1, sort_keys=True))
    print(f"{len(prints)} README commands fingerprinted into {args.save}")
    if args.compare:
        before = json.loads(args.compare.read_text())
        common = sorted(set(before) & set(prints))
        differ = [line for line in common if before[line] != prints[line]]
        for line in differ:
            print(f"DIFFERS: {line}\n  before {before[line]}\n  after  {prints[line]}")
        only = sorted(set(before) ^ set(prints))
        print(f"{len(common) - len(differ)}/{len(common)} commands identical (stdout of the table and JSON forms, and "
              f"every file written){'; not in both READMEs: ' + str(len(only)) if only else ''}")
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
