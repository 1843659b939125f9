"""Export as a security boundary (issue 26): whatever a plan, a spec or an option holds, the files
`splitplan export` writes run only the engine, router and Ray commands they mean to, each value
arriving as exactly one argument, unchanged, or the export refuses the value (exit 2, one line).

The generated launch.sh entries, compose entrypoints and llm-d container scripts run under bash
with fake `vllm`, `vllm-router`, `python3`, `ray`, `docker` and `sglang` that log their argv; PATH holds only
them, and bash reports any other command (command_not_found_handle), so a smuggled `touch` or
`rm` is seen, as is any file the run leaves behind."""

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from splitplan.cli import app
from splitplan.deploy import RFC1123_LABEL, image_ref, model_id, slug

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
FAKES = ("vllm", "vllm-router", "python3", "ray", "docker", "sglang")

NASTY = ["org/m$(touch pwned)", "org/m`touch pwned`", 'org/m"; touch pwned; "', "org/m\ntouch pwned", "--trust-remote-code",
         "x|*) touch pwned;; y", "$((1/0))", "${IFS}x", "a\x00b", "\x1b[31mred", "org/\u202emodel", "ünï/cödé", "-x",
         "org/m'; touch pwned; '", "org/m\\", "a" * 10_000, "org/" + "m" * 97, "org/m$HOME", "..", "org/..", "/models/../etc",
         "org/m;touch pwned", "org/m&&touch pwned", "org/m|touch pwned", "org/m>pwned", "org/m\r", "~root/x", "org/m*"]
VALID_IDS = st.from_regex(r"[A-Za-z0-9]{1,8}/[A-Za-z0-9][A-Za-z0-9_.-]{0,12}[A-Za-z0-9]", fullmatch=True)
VALUES = st.one_of(st.sampled_from(NASTY), st.text(max_size=40), VALID_IDS,
                   st.builds(lambda a, b: a + b, st.sampled_from(NASTY), st.text(max_size=20)))


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A folder of fake programs that log their argv (NUL-separated, one record per call), and a
    BASH_ENV that logs any other command bash is asked to run."""
    root = tmp_path_factory.mktemp("sandbox")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name in FAKES:
        fake = bin_dir / name
        fake.write_text('#!/bin/bash\n{ printf "%s\\0" "${0##*/}" "$@"; printf "\\n"; } >> "$ARGV_LOG"\n'
                        'printf "%s\\n" "${LWS_GROUP_SIZE:-}"\n')
        fake.chmod(0o755)
    (root / "bash_env").write_text('command_not_found_handle() { printf "%s\\n" "$1" >> "$UNEXPECTED_LOG"; return 127; }\n')
    return root


def _plan(tmp_path: Path, hardware: str = "h100-80gb", model: str = "deepseek-v3", name: str = "plan.json",
          engine: str = "vllm-fp8") -> Path:
    pools = {"prompt_pools": [{"hardware": hardware, "tp": 8, "machines": 2}],
             "token_pools": [{"hardware": hardware, "tp": 1, "dp": 16, "ep": 16, "layout": "dp16ep16", "machines": 2}]}
    doc = {"schema_version": 2, "inputs": {"model": model, "slo": "chat", "engine": engine, "max_batch_tokens": 2048},
           "plan": {**pools, "machines": 4, "cost_usd_per_hour": 0.0, "power_kw": 0.0, "predicted": {}, "slo": [],
                    "binding": ""}}
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _run(argv: list[str], sandbox: Path, cwd: Path, env: dict) -> list[list[str]]:
    """Run argv (bash or a fake) in `cwd`; the argv of every fake called. Fails on any other
    command or any file left behind."""
    log, unexpected = cwd / ".argv", cwd / ".unexpected"
    log.write_bytes(b"")
    unexpected.write_text("")
    before = set(os.listdir(cwd))
    subprocess.run(argv, cwd=cwd, timeout=20, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={"PATH": str(sandbox / "bin"), "BASH_ENV": str(sandbox / "bash_env"), "ARGV_LOG": str(log),
                        "UNEXPECTED_LOG": str(unexpected), **env})
    assert unexpected.read_text() == "", f"ran a command it should not: {unexpected.read_text()!r}"
    assert set(os.listdir(cwd)) == before, f"left files behind: {set(os.listdir(cwd)) - before}"
    calls = [c.split(b"\0")[:-1] for c in log.read_bytes().split(b"\0\n") if c]
    return [[w.decode("utf-8", "surrogateescape") for w in c] for c in calls]


def _interpolate(word: str, env: dict) -> str:
    """What docker compose makes of a word: ${VAR} from the environment, $$ a literal $."""
    return re.sub(r"\$\$|\$\{([A-Za-z0-9_]+)\}", lambda m: "$" if m.group(0) == "$$" else env[m.group(1)], word)


def _run_everything(out: Path, target: str, sandbox: Path, work: Path) -> list[list[str]]:
    """Every entry of launch.sh and docker-compose.yaml (vllm, sglang) or every container script of
    llm-d.yaml, run; the fakes' argv."""
    calls = []
    if target == "llm-d":
        env = {"LWS_LEADER_ADDRESS": "10.0.0.1", "LWS_WORKER_INDEX": "1", "LWS_GROUP_SIZE": "2"}
        for doc in yaml.safe_load_all((out / "llm-d.yaml").read_text()):
            for node in _pod_specs(doc):
                for c in node["containers"]:
                    assert c["command"] == ["/bin/bash", "-c"]
                    calls += _run(["/bin/bash", "-c", *c["args"]], sandbox, work, env)
        return calls
    script = (out / "launch.sh").read_text()
    assert os.access(out / "launch.sh", os.X_OK), "launch.sh is written executable"
    env = {v: "10.0.0.1" for v in re.findall(r"\$\{([A-Z0-9_]+_HOST)\}", script)}
    services = yaml.safe_load((out / "docker-compose.yaml").read_text())["services"]
    for name, service in services.items():
        calls += _run(["/bin/bash", str(out / "launch.sh"), name], sandbox, work, env)
        argv = [_interpolate(w, env) for w in service["entrypoint"]]
        calls += _run(["/bin/bash", *argv[1:]] if argv[0] == "bash" else [str(sandbox / "bin" / argv[0]), *argv[1:]],
                      sandbox, work, env)
    return calls


def _pod_specs(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    if doc["kind"] == "Deployment":
        return [spec["template"]["spec"]]
    if doc["kind"] == "LeaderWorkerSet":
        group = spec["leaderWorkerTemplate"]
        return [group[k]["spec"] for k in ("leaderTemplate", "workerTemplate") if k in group]
    return []


def _served(call: list[str]) -> str | None:
    """The model a fake engine call serves (vllm serve MODEL, sglang --model-path MODEL)."""
    if call[0] == "vllm" and call[1:2] == ["serve"]:
        return call[2]
    if "--model-path" in call:
        return call[call.index("--model-path") + 1]
    return None


def _refused(result) -> bool:
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    return result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ")


def _check(result, out: Path, target: str, sandbox: Path, work: Path, served: str | None = None) -> None:
    if result.exit_code != 0:
        assert _refused(result), (result.exit_code, result.stderr, repr(result.exception))
        assert not out.exists(), "a refused export writes nothing"
        return
    calls = _run_everything(out, target, sandbox, work)
    engines = [c for c in calls if _served(c) is not None]
    assert engines, "every engine entry ran its engine"
    if served is not None:
        assert {_served(c) for c in engines} == {served}


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(value=VALUES, target=st.sampled_from(["vllm", "sglang", "llm-d"]))
def test_a_model_id_option_is_one_argument_or_refused(tmp_path, sandbox, value, target):
    case = Path(tempfile.mkdtemp(dir=os.path.realpath(tmp_path)))
    out = case / "out"
    result = runner.invoke(app, ["export", str(_plan(case)), "--to", target, "--output", str(out), "--model-id", value])
    _check(result, out, target, sandbox, case, served=value)


@SETTINGS
@given(value=VALUES, target=st.sampled_from(["vllm", "sglang", "llm-d"]))
def test_a_model_specs_hf_repo_is_one_argument_or_refused(tmp_path, sandbox, value, target):
    case = Path(tempfile.mkdtemp(dir=os.path.realpath(tmp_path)))
    (case / "cat" / "model_specs").mkdir(parents=True)
    spec = yaml.safe_load((ROOT / "model_specs" / "deepseek-v3.yaml").read_text())
    (case / "cat" / "model_specs" / "deepseek-v3.yaml").write_text(yaml.safe_dump({**spec, "hf_repo": value}))
    out = case / "out"
    result = runner.invoke(app, ["--catalog", str(case / "cat"), "export", str(_plan(case)), "--to", target,
                                 "--output", str(out)])
    _check(result, out, target, sandbox, case, served=value)


def _file_name(value: str) -> str | None:
    name = value.replace("/", "_").replace("\x00", "_")[:200]
    return name if name not in ("", ".", "..") else None


@SETTINGS
@given(value=VALUES, target=st.sampled_from(["vllm", "sglang", "llm-d", "dynamo"]))
def test_a_hardware_name_becomes_a_valid_name_or_is_refused(tmp_path, sandbox, value, target):
    name = _file_name(value)
    if name is None:
        return
    case = Path(tempfile.mkdtemp(dir=os.path.realpath(tmp_path)))
    (case / "cat" / "hardware_specs").mkdir(parents=True)
    spec = yaml.safe_load((ROOT / "hardware_specs" / "h200-141gb.yaml").read_text())
    try:
        (case / "cat" / "hardware_specs" / f"{name}.yaml").write_text(yaml.safe_dump({**spec, "name": name}))
    except (OSError, UnicodeEncodeError):
        return  # (not a file name this file system takes)
    out = case / "out"
    result = runner.invoke(app, ["--catalog", str(case / "cat"), "export", str(_plan(case, hardware=name)),
                                 "--to", target, "--output", str(out)])
    if result.exit_code == 0 and target in ("llm-d", "dynamo"):
        for doc in yaml.safe_load_all((out / f"{target}.yaml").read_text()):
            names = [doc["metadata"]["name"], *doc["metadata"].get("labels", {}).values()]
            names += [c["name"] for c in doc.get("spec", {}).get("components", [])[1:]]  # (the template's Frontend)
            assert all(RFC1123_LABEL.match(n) for n in names if n != "true"), names
        return
    if result.exit_code == 0:
        services = yaml.safe_load((out / "docker-compose.yaml").read_text())["services"]
        assert all(re.match(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$", s) for s in services)
    _check(result, out, target, sandbox, case)


@SETTINGS
@given(value=VALUES, target=st.sampled_from(["vllm", "sglang", "llm-d"]))
def test_a_model_file_named_anything_gives_valid_names(tmp_path, sandbox, value, target):
    """The plan's inputs.model is a path; the model's name (its file's) becomes the deployment's."""
    name = _file_name(value)
    if name is None:
        return
    case = Path(tempfile.mkdtemp(dir=os.path.realpath(tmp_path)))
    spec = yaml.safe_load((ROOT / "model_specs" / "deepseek-v3.yaml").read_text())
    spec.pop("name", None)
    try:
        (case / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    except (OSError, UnicodeEncodeError):
        return
    out = case / "out"
    result = runner.invoke(app, ["export", str(_plan(case, model=str(case / f"{name}.yaml"))), "--to", target,
                                 "--output", str(out)])
    if result.exit_code == 0 and target == "llm-d":
        for doc in yaml.safe_load_all((out / "llm-d.yaml").read_text()):
            assert RFC1123_LABEL.match(doc["metadata"]["name"]) and RFC1123_LABEL.match(
                doc["metadata"].get("labels", {}).get("llm-d.ai/model", "x"))
    _check(result, out, target, sandbox, case, served=spec["hf_repo"])


@SETTINGS
@given(value=VALUES)
def test_an_image_is_a_reference_or_refused(tmp_path, value):
    case = Path(tempfile.mkdtemp(dir=os.path.realpath(tmp_path)))
    out = case / "out"
    result = runner.invoke(app, ["export", str(_plan(case)), "--to", "vllm", "--output", str(out), "--image", value])
    if result.exit_code != 0:
        assert _refused(result) and "--image" in result.stderr
        return
    services = yaml.safe_load((out / "docker-compose.yaml").read_text())["services"]
    assert {s["image"] for s in services.values()} == {value}


@SETTINGS
@given(value=VALUES, target=st.sampled_from(["vllm", "sglang"]))
def test_a_plan_file_name_never_leaves_its_comment(tmp_path, sandbox, value, target):
    name = _file_name(value)
    if name is None:
        return
    case = Path(tempfile.mkdtemp(dir=os.path.realpath(tmp_path)))
    try:
        plan = _plan(case, name=name)
    except (OSError, UnicodeEncodeError):
        return
    out = case / "out"
    result = runner.invoke(app, ["export", str(plan), "--to", target, "--output", str(out)])
    _check(result, out, target, sandbox, case)


@settings(max_examples=200, deadline=None)
@example(words=["org/m$(touch pwned)", "`id`", '"; echo hi; "', "a'b", "${IFS}", "$((1/0))", "x\ny", "-rf", "$HOME"])
@given(words=st.lists(st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))),
                      min_size=1, max_size=4))
def test_shell_words_reach_the_program_unchanged_whatever_they_hold(words):
    """Defence in depth: whatever a word holds ($, backticks, quotes, newlines), bash passes it on
    as one argument, as written (the fields' checks refuse most of these before they get here)."""
    from splitplan.deploy import shell_words
    out = subprocess.run(["/bin/bash", "-c", "printf '%s\\0' " + shell_words(words)], capture_output=True, timeout=10,
                         env={"PATH": "/nonexistent"})
    assert out.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1] == words
    compose = shell_words(words, compose=True)  # (compose turns $$ back into $ before bash runs it)
    assert compose.replace("$$", "$") == shell_words(words)


def test_the_checks_themselves_catch_an_injection(tmp_path, sandbox):
    """The harness sees a smuggled command: a launch.sh that runs one fails it."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "launch.sh").write_text('#!/usr/bin/env bash\ncase "$1" in\n  a) vllm serve "org/m$(touch pwned)" ;;\nesac\n')
    (out / "launch.sh").chmod(0o755)
    (out / "docker-compose.yaml").write_text(yaml.safe_dump({"services": {"a": {"entrypoint": ["vllm", "serve", "x"]}}}))
    with pytest.raises(AssertionError, match="ran a command it should not"):
        _run_everything(out, "vllm", sandbox, tmp_path)


@pytest.mark.parametrize("value, ok", [("meta-llama/Llama-3.1-70B-Instruct", True), ("gpt2", True), ("/models/llama-70b", True),
                                       ("org/m$(x)", False), ("-rf", False), ("org--x/y", False), ("a/b/c", False),
                                       ("org/model.git", False), ("/models/../etc", False), ("", False)])
def test_model_ids(value, ok):
    if ok:
        assert model_id(value, "--model-id") == value
    else:
        with pytest.raises(Exception, match="--model-id"):
            model_id(value, "--model-id")


@pytest.mark.parametrize("value, ok", [("vllm/vllm-openai:v0.31.0", True), ("ghcr.io/llm-d/x:v0.8.0", True),
                                       ("localhost:5000/a/b@sha256:" + "a" * 64, True), ("Upper/x", False),
                                       ("x:tag$(id)", False), ("-x", False), ("x y", False)])
def test_image_references(value, ok):
    if ok:
        assert image_ref(value) == value
    else:
        with pytest.raises(Exception, match="--image"):
            image_ref(value)


def test_slugs_are_rfc1123_labels_and_never_collide():
    texts = ["h100-80gb", "H100_Custom GPU", "h100-custom-gpu", "../../x", "x" * 200, "ünï", "", "-a-"]
    names = [slug(t) for t in texts]
    assert names[0] == "h100-80gb" and len(set(names)) == len(names)
    assert all(RFC1123_LABEL.match(n) for n in names)
