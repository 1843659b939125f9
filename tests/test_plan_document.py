"""plan.json, the one plan document (issue 26): what optimize writes reads back, every field is
checked whole (integers, layouts, unique pools, one kind of plan, bounds, schema version, inputs),
and a plan carries its specs: it simulates and exports without the catalog it was made with, and a
catalog entry that changed since is reported."""

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from splitplan.base.defaults import SCHEMA_VERSION
from splitplan.cli import app
from splitplan.io.plan_document import PlanDocument, digest

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
QUICK = ["--rate", "3", "--duration", "20", "--tp", "8"]


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> dict:
    """A real plan.json: made from a user catalog's machine (examples/catalog), split only."""
    out = tmp_path_factory.mktemp("plan")
    result = run("--catalog", ROOT / "examples" / "catalog", "optimize", "--hardware", "h100-80gb-2026", *QUICK,
                 "--split-only", "--output-dir", out)
    assert result.exit_code == 0, result.stderr
    return json.loads((out / "plan.json").read_text())


def _write(tmp_path: Path, doc: dict, name="plan.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _error(result) -> str:
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (result.exit_code, result.stderr)
    return lines[0]


def test_what_optimize_writes_reads_back_and_carries_its_specs(plan):
    assert plan["schema_version"] == SCHEMA_VERSION == 3
    doc = PlanDocument.model_validate(plan)
    assert set(doc.specs.hardware) == {"h100-80gb-2026"} and set(doc.specs.model) == {"llama2-70b"}
    assert set(doc.specs.engine) == {"vllm"} and set(doc.specs.slo) == {"chat"}
    for copies in plan["specs"].values():
        assert all(c["sha256"] == digest(c["spec"]) for c in copies.values())


def test_a_plan_made_with_a_catalog_simulates_and_exports_without_it(tmp_path, plan):
    path = _write(tmp_path, plan)
    assert "unknown hardware" in run("perf", "--hardware", "h100-80gb-2026").stderr  # not in the shipped catalog
    simulated = run("simulate", "--plan", path, "--rate", "2", "--duration", "10", "--format", "json")
    assert simulated.exit_code == 0, simulated.stderr
    assert {p["hardware"] for p in json.loads(simulated.stdout)["summary"]["pools"]} == {"h100-80gb-2026"}
    exported = run("export", path, "--to", "dynamo", "--backend", "vllm")
    assert exported.exit_code == 0, exported.stderr
    swept = run("sweep", "--plan", path, "--rates", "2", "--duration", "10")
    assert swept.exit_code == 0, swept.stderr


def test_a_catalog_entry_changed_since_is_reported_and_the_plans_copy_used(tmp_path, plan):
    catalog = tmp_path / "cat" / "hardware_specs"
    catalog.mkdir(parents=True)
    spec = yaml.safe_load((ROOT / "examples" / "catalog" / "hardware_specs" / "h100-80gb-2026.yaml").read_text())
    (catalog / "h100-80gb-2026.yaml").write_text(yaml.safe_dump({**spec, "gpus_per_machine": 4}))
    result = run("--catalog", tmp_path / "cat", "export", _write(tmp_path, plan), "--to", "dynamo", "--backend", "vllm")
    assert result.exit_code == 0, result.stderr
    assert "note: hardware h100-80gb-2026 differs in the catalog" in result.stderr
    gpus = {c["podTemplate"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
            for c in yaml.safe_load(result.stdout)["spec"]["components"][1:]}
    assert gpus == {"8"}  # the plan's 8-GPU machine, not the catalog's 4


def test_an_edited_spec_copy_is_refused(tmp_path, plan):
    doc = json.loads(json.dumps(plan))
    doc["specs"]["hardware"]["h100-80gb-2026"]["spec"]["price_usd_per_hour"] = 1.0
    assert "specs.hardware.h100-80gb-2026" in _error(run("simulate", "--plan", _write(tmp_path, doc)))


def _edited(plan: dict, edit) -> dict:
    doc = json.loads(json.dumps(plan))
    edit(doc)
    return doc


def _pool(doc, role="prompt"):
    return doc["plan"][f"{role}_pools"][0]


CASES = [
    ("machines 2.7", lambda d: _pool(d).update(machines=2.7), "machines"),
    ("machines true", lambda d: _pool(d).update(machines=True), "machines"),
    ("tp 8.5", lambda d: _pool(d).update(tp=8.5), "tp"),
    ("tp text", lambda d: _pool(d).update(tp="8"), "tp"),
    ("layout disagrees", lambda d: _pool(d).update(layout="dp16ep16"), "disagrees with tp 8"),
    ("pool twice", lambda d: d["plan"]["prompt_pools"].append(dict(_pool(d))), "listed twice"),
    ("prompt, token and mixed", lambda d: d["plan"].update(mixed_pools=[dict(_pool(d))]), "not both"),
    ("prompt only", lambda d: d["plan"].pop("token_pools"), "token_pools is empty"),
    ("no pools", lambda d: [d["plan"].pop(k) for k in ("prompt_pools", "token_pools")], "no pools"),
    ("max_batch_tokens text", lambda d: d["inputs"].update(max_batch_tokens="abc"), "max_batch_tokens"),
    ("max_batch_tokens -5", lambda d: d["inputs"].update(max_batch_tokens=-5), "max_batch_tokens"),
    ("max_batch_tokens 1e400", lambda d: d["inputs"].update(max_batch_tokens=float("inf")), "max_batch_tokens"),
    ("no inputs", lambda d: d.pop("inputs"), "inputs"),
    ("no model", lambda d: d["inputs"].pop("model"), "inputs.model"),
    ("schema 1", lambda d: d.update(schema_version=1), "schema_version 1"),
    ("schema '3'", lambda d: d.update(schema_version="3"), "schema_version 3"),
    ("no specs", lambda d: d.pop("specs"), "carries its specs"),
    ("unknown key", lambda d: d["plan"].update(prompt_pool=[]), "prompt_pool"),
    ("too many machines", lambda d: d["plan"].update(
        prompt_pools=[{"hardware": f"h{k}", "tp": 8, "machines": 100_000} for k in range(200)]), "a plan has at most"),
    ("pool of 1e8", lambda d: _pool(d).update(machines=100_000_000), "machines"),
    ("machines miscounted", lambda d: d["plan"].update(machines=99), "machines is 99"),
    ("gpus miscounted", lambda d: d["plan"].update(gpus=99), "gpus is 99"),
    ("utilization above 1", lambda d: _pool(d).update(utilization=1.5), "utilization"),
    ("a pool's machine without a copy", lambda d: _pool(d).update(hardware="h100-80gb"), "specs.hardware has no copy of h100-80gb"),
    ("a copy named otherwise", lambda d: d["specs"]["hardware"]["h100-80gb-2026"]["spec"].update(name="h100-80gb"),
     "names itself h100-80gb"),
]


@pytest.mark.parametrize("name, edit, needle", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("command", ["simulate", "export"])
def test_a_plan_is_checked_whole(tmp_path, plan, name, edit, needle, command):
    path = _write(tmp_path, _edited(plan, edit))
    args = ["simulate", "--plan", path] if command == "simulate" else ["export", path, "--to", "dynamo", "--backend", "vllm"]
    line = _error(run(*args))
    assert needle in line and len(line) < 400, line


def test_a_window_plan_reads_back(tmp_path):
    out = tmp_path / "w"
    result = run("optimize", "--hardware", "h100-80gb", "--tp", "8", "--rate", "2", "--duration", "120",
                 "--window", "60", "--max-num-seqs", "64", "--output-dir", out)
    assert result.exit_code == 0, result.stderr
    doc = PlanDocument.model_validate(json.loads((out / "plan.json").read_text()))
    assert doc.inputs.max_batch_tokens == 8192 and doc.inputs.max_num_seqs == 64 and doc.specs is not None  # (vllm's budget)
    assert run("export", out / "plan.json", "--to", "vllm").exit_code == 0


def test_a_plan_of_schema_2_still_reads(tmp_path):
    shutil.copy(ROOT / "tests" / "data" / "plan-schema-2.json", tmp_path / "p.json")  # (the example plan as stop 24 wrote it)
    assert json.loads((tmp_path / "p.json").read_text())["schema_version"] == 2
    assert run("export", tmp_path / "p.json", "--to", "sglang").exit_code == 0


def test_800000_workers_are_refused_at_once_by_launch_and_counted_by_dynamo(tmp_path, plan):
    def huge(d):
        _pool(d).update(tp=1, layout="tp1", machines=99_999)
        d["plan"]["machines"] = 100_000
    path = _write(tmp_path, _edited(plan, huge))
    assert "export to dynamo or llm-d" in _error(run("export", path, "--to", "vllm"))
    result = run("export", path, "--to", "dynamo", "--backend", "vllm")
    assert result.exit_code == 0 and "replicas: 799992" in result.stdout


def test_exporting_a_plan_leaves_the_catalog_as_it_was(tmp_path, plan):
    """The specs a plan carries are used while it is exported, not after: a later load of the same
    name in the process reads the catalog again (the library keeps no pins of a plan it read)."""
    import warnings

    import splitplan
    from splitplan.specs.model import load_model

    doc = json.loads(json.dumps(plan))
    copy = doc["specs"]["model"]["llama2-70b"]
    copy["spec"]["max_position_embeddings"] = 2048  # (the plan's copy: a shorter context than the catalog's)
    copy["sha256"] = digest(copy["spec"])
    catalog_context = load_model("llama2-70b").max_position_embeddings
    assert catalog_context != 2048
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the note that the catalog's entry differs)
        splitplan.export(_write(tmp_path, doc), "dynamo", backend="vllm")
    assert load_model("llama2-70b").max_position_embeddings == catalog_context
