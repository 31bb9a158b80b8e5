"""The `callsites` check (remote_scripts/checks/callsites.py), run the way a node runs it: under a
venv's python, against files in that venv's site-packages.

The repo's pytest python has no vLLM, so every check runs in a subprocess under a throwaway venv
whose base.pth points at the lab base venv (real vllm 0.16.0, torch, speculators 0.3.0); speculators
is copied into the throwaway venv so the scratch copies can be edited without touching the base.

The base venv's path is asked from the lab (conftest's `base_python` fixture:
fleetops.lab.ensure_base), so these tests run for any user and any Python; when it cannot be made
they fail, they never skip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK_DIFFS = REPO / "playbooks" / "speculators-0.3.0-vllm-0.16"
GENERATOR = "speculators.data_generation.vllm_hidden_states_generator"
WORKER = "speculators.data_generation.custom_worker"

pytestmark = pytest.mark.base_venv

SPECULATORS_CHECK = {
    "kind": "callsites",
    "name": "speculators-vllm-calls",
    "modules": [GENERATOR, WORKER],
    "packages": ["vllm"],
    "receivers": [
        {
            "expr": "self.executor",
            "scope": "VllmHiddenStatesGenerator",
            "type": "vllm.v1.executor.multiproc_executor.MultiprocExecutor",
        },
        {
            "expr": "self.scheduler",
            "scope": "VllmHiddenStatesGenerator",
            "type": "vllm.v1.core.sched.scheduler.Scheduler",
        },
        {
            "expr": "self",
            "scope": "_patched_forward",
            "type": [
                "vllm.model_executor.models.llama.LlamaModel",
                "vllm.model_executor.models.deepseek_v2.DeepseekV2Model",
            ],
        },
    ],
    "attributes": ["vllm.model_executor.models.llama.LlamaModel.embed_input_ids"],
}

# Runs under the venv's python; the answer goes to a file because vLLM logs to stdout.
RUNNER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    from remote_scripts.checks.callsites import check_callsites
    from remote_scripts.checks.checks import verify
    check = json.loads(sys.stdin.read())
    started = time.monotonic()
    outcome = check_callsites(check)
    outcome["seconds"] = time.monotonic() - started
    outcome["verify"] = verify({"checks": [check]})
    with open(sys.argv[2], "w") as f:
        json.dump(outcome, f)
""")


def purelib(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def make_venv(base_py: Path, root: Path, with_speculators: bool = True) -> tuple[Path, Path]:
    """A venv layered on the base one: base.pth makes vllm & co. importable, speculators is a local
    copy."""
    subprocess.run([str(base_py), "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    py = root / "venv" / "bin" / "python"
    site = purelib(py)
    base_site = purelib(base_py)
    (site / "base.pth").write_text(f"{base_site}\n")
    if with_speculators:
        shutil.copytree(
            base_site / "speculators",
            site / "speculators",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        shutil.copytree(
            base_site / "speculators-0.3.0.dist-info", site / "speculators-0.3.0.dist-info"
        )
    return py, site


def run_check(py: Path, check: dict, tmp: Path) -> dict:
    answer = tmp / f"answer-{os.getpid()}-{id(check)}.json"
    proc = subprocess.run(
        [str(py), "-c", RUNNER, str(REPO), str(answer)],
        input=json.dumps(check),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(tmp),
    )
    assert proc.returncode == 0, (
        f"checker exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return json.loads(answer.read_text())


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} should occur once in {path}"
    path.write_text(text.replace(old, new))


def summary(outcome: dict) -> set[tuple[str, str, str]]:
    return {
        (Path(f["file"]).name if f["file"] else "", f["callee"], f["error"])
        for f in outcome["failures"]
    }


# ---------------------------------------------------------------- the real files
@pytest.fixture(scope="module")
def pristine(tmp_path_factory, base_python) -> dict:
    tmp = tmp_path_factory.mktemp("pristine")
    py, _site = make_venv(base_python, tmp)
    return run_check(py, SPECULATORS_CHECK, tmp)


def test_pristine_speculators_reports_every_known_vllm_016_break(pristine):
    got = summary(pristine)
    gen, worker = "vllm_hidden_states_generator.py", "custom_worker.py"
    expected = {
        (gen, "vllm.config.SchedulerConfig", "missing a required argument: 'is_encoder_decoder'"),
        (
            gen,
            "vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups",
            "got an unexpected keyword argument 'kv_cache_specs'",
        ),
        (
            gen,
            "vllm.v1.core.sched.scheduler.Scheduler",
            "missing a required argument: 'block_size'",
        ),
        (
            worker,
            "vllm.model_executor.models.llama.LlamaModel.get_input_embeddings",
            "LlamaModel has no attribute 'get_input_embeddings'",
        ),
        (
            worker,
            "vllm.model_executor.models.deepseek_v2.DeepseekV2Model.get_input_embeddings",
            "DeepseekV2Model has no attribute 'get_input_embeddings'",
        ),
    }
    assert expected <= got, pristine["failures"]
    # and nothing else: the other calls in these files do bind in vLLM 0.16
    assert got == expected, pristine["failures"]
    lines = {
        (Path(f["file"]).name, f["callee"].rsplit(".", 1)[-1]): f["line"]
        for f in pristine["failures"]
    }
    assert lines[(gen, "SchedulerConfig")] == 194
    assert lines[(gen, "get_kv_cache_config_from_groups")] == 136
    assert lines[(gen, "Scheduler")] == 148
    assert lines[(worker, "get_input_embeddings")] == 30
    assert pristine["calls_checked"] >= 25  # 15 imported callables + 10 receiver method calls
    assert pristine["attributes_checked"] >= 1
    # self.norm(...) is an nn.Module submodule: found in LlamaModel's source, not bindable from the
    # class
    assert any(p["callee"].endswith("LlamaModel.norm") for p in pristine["partial"])
    # the same failures come out of the verify runner the agent uses
    item = pristine["verify"]["items"][0]
    assert item["ok"] is False and item["kind"] == "callsites"
    assert item["msg"] == "5 call sites do not match the installed packages"


def test_hand_fixed_speculators_binds_cleanly(tmp_path, base_python):
    py, site = make_venv(base_python, tmp_path)
    gen = site / "speculators" / "data_generation" / "vllm_hidden_states_generator.py"
    worker = site / "speculators" / "data_generation" / "custom_worker.py"
    edit(
        gen,
        "                max_num_batched_tokens=max_num_batched_tokens,\n            ),",
        "                max_num_batched_tokens=max_num_batched_tokens,\n"
        "                is_encoder_decoder=False,\n            ),",
    )
    edit(gen, "            kv_cache_specs=kv_cache_spec,\n", "")
    edit(
        gen,
        "            structured_output_manager=structured_output_manager,\n        )",
        "            structured_output_manager=structured_output_manager,\n"
        "            block_size=VLLM_BLOCK_SIZE,\n        )",
    )
    edit(worker, "self.get_input_embeddings(input_ids)", "self.embed_input_ids(input_ids)")
    outcome = run_check(py, SPECULATORS_CHECK, tmp_path)
    assert outcome["failures"] == []
    assert outcome["calls_checked"] >= 25
    item = outcome["verify"]["items"][0]
    assert item["ok"] is True, item
    assert item["msg"].endswith("attributes exist")


def test_official_playbook_diffs_fix_every_known_break(tmp_path, pristine, base_python):
    # The shipped diffs applied by GNU patch (not by fleetops' own hunk code) must leave no call
    # site broken: a regression in a diff is a failure here, never a skip.
    diffs = sorted(PLAYBOOK_DIFFS.glob("*.diff"))
    assert len(diffs) == 2, (
        f"expected the generator and worker diffs in {PLAYBOOK_DIFFS}, found {diffs}"
    )
    if not shutil.which("patch"):
        pytest.fail(
            "GNU patch(1) is missing: a set-up error "
            "(bash scripts/setup installs Debian's `patch`)",
            pytrace=False,
        )
    py, site = make_venv(base_python, tmp_path)
    for diff in diffs:
        proc = subprocess.run(
            ["patch", "-p1", "--batch", "--forward", "-d", str(site), "-i", str(diff)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, (
            f"{diff.name} does not apply to pristine speculators 0.3.0:\n{proc.stdout}"
        )
        assert "offset" not in proc.stdout and "fuzz" not in proc.stdout, (
            f"{diff.name} applies only loosely:\n{proc.stdout}"
        )
    outcome = run_check(py, SPECULATORS_CHECK, tmp_path)
    remaining = summary(outcome)
    assert remaining <= summary(pristine), (
        f"the diffs introduced new failures: {outcome['failures']}"
    )
    assert remaining == set(), f"the shipped diffs leave call sites broken: {sorted(remaining)}"
    assert outcome["calls_checked"] >= 25  # the checker really read the patched files
    item = outcome["verify"]["items"][0]
    assert item["ok"] is True, item


# ---------------------------------------------------------------- synthetic modules
API = """
import dataclasses

def f(a, b, *, c, d=1):
    return a

def g(x, y=2):
    return x

class Thing:
    label = "thing"

    def __init__(self, size, *, name=None):
        self.inner = None
        self.count, self.total = 0, 0
        setattr(self, "via_setattr", 1)

    def run(self, n, fast=False):
        return n

    @staticmethod
    def smeth(a):
        return a

    @classmethod
    def cmeth(cls, a, b=0):
        return a

    @property
    def prop(self):
        return 1

class Other:
    def run(self, n, fast=False):
        return n

class Partial:
    def run(self, n):
        return n

    def other(self):
        return 0

@dataclasses.dataclass
class Cfg:
    required: int
    opt: int = 0
"""

CALLER = """
raise SystemExit("the checker must never execute this module")

import os
import mypkg
import mypkg.api as api
from mypkg.api import Cfg, Thing, f
from mypkg.api import g as gg
from mypkg.gone import vanished  # BAD:import-missing-module
from mypkg.api import nosuch  # BAD:import-missing-name
from otherpkg import whatever

try:
    from mypkg.api import maybe_missing  # PARTIAL:guarded
except ImportError:
    maybe_missing = None

G = api.g

def calls(args, kw):
    f(1, 2, c=3)  # OK
    f(1)  # BAD:f-missing-b
    f(1, 2, 3, c=1)  # BAD:f-too-many
    f(1, 2, c=1, e=2)  # BAD:f-unexpected-e
    f(1, 2, b=3, c=3)  # BAD:f-multiple-b
    gg()  # BAD:gg-missing-x
    api.g(1, 2, 3)  # BAD:api-g-too-many
    mypkg.api.g(1)  # OK
    G(1, z=1)  # BAD:alias-G-unexpected-z
    Thing()  # BAD:thing-missing-size
    Thing(1, name="n")  # OK
    Cfg()  # BAD:cfg-missing-required
    Cfg(required=1)  # OK
    f(*args)  # BAD:star-missing-kwonly-c
    f(*args, c=1)  # PARTIAL:star
    f(**kw)  # PARTIAL:dstar
    f(1, 2, 3, *args, c=1)  # BAD:star-too-many
    f(*args, c=1, e=1)  # BAD:star-unexpected-e
    vanished(1)  # BAD:call-missing-module
    maybe_missing(1)  # PARTIAL:guarded-call
    whatever(1, 2, 3)
    os.path.join("a", "b")
    len([])

def shadowed(g, f=None):
    g()  # OK: the parameter, not mypkg.api.g
    f()  # OK

class Caller:
    def __init__(self):
        self.thing = Thing(1)

    def go(self):
        self.thing.run(1)  # OK
        self.thing.run(1, fast=True)  # OK
        self.thing.run()  # BAD:run-missing-n
        self.thing.run(1, 2, 3)  # BAD:run-too-many
        self.thing.smeth(1)  # OK
        self.thing.smeth(1, 2)  # BAD:smeth-too-many
        self.thing.cmeth(1)  # OK
        self.thing.cmeth()  # BAD:cmeth-missing-a
        self.thing.nothere()  # BAD:nothere
        print(self.thing.inner, self.thing.count, self.thing.total, self.thing.label)  # OK
        print(self.thing.via_setattr)  # OK
        print(self.thing.missing_attr)  # BAD:missing-attr
        self.thing.brand_new = 5  # OK: assignment
        print(self.thing.brand_new)  # OK: assigned in this module
        if hasattr(self.thing, "maybe"):
            self.thing.maybe()  # OK: guarded by hasattr
        self.thing.prop  # OK
        if hasattr(self.thing, "run"):
            self.thing.run(1)  # OK
        else:
            self.thing.old_run(1)  # OK: never reached, Thing has run
        if hasattr(self.thing, "new_api"):
            self.thing.new_api()  # OK: never reached, nothing gives Thing new_api
        elif not hasattr(self.thing, "smeth"):
            self.thing.gone()  # OK: never reached
        else:
            self.thing.run()  # BAD:compat-else-still-checked
        print(self.thing.run(1) if hasattr(self.thing, "run") else self.thing.legacy())  # OK
        if hasattr(self.thing, "run") and self.thing.count:
            self.thing.run(1, 2, 3)  # BAD:compat-and-body-checked
        self.ghost.anything()  # BAD:ghost-type
        self.ghost.anything()  # OK: a missing receiver type is reported once

class Elsewhere:
    def go(self):
        self.thing.nothere()  # OK: out of the receiver's scope

def patched(self):
    self.run(1)  # OK: both types have run
    self.other()  # BAD:two-types
"""

INNER = """
from .api import g

def h():
    g(1, 2, 3)  # BAD:relative
"""

SYNTH_CHECK = {
    "kind": "callsites",
    "name": "synthetic",
    "modules": ["mycaller", "mypkg.inner"],
    "packages": ["mypkg"],
    "receivers": [
        {"expr": "self.thing", "scope": "Caller", "type": "mypkg.api.Thing"},
        {"expr": "self.ghost", "scope": "Caller.go", "type": "mypkg.api.Ghost"},
        {"expr": "self", "scope": "patched", "type": ["mypkg.api.Partial", "mypkg.api.Other"]},
    ],
    "attributes": ["mypkg.api.Thing.run", "mypkg.api.Thing.nope", "mypkg.nomod.X", "mypkg.api"],
}


def marker_lines(text: str, kind: str) -> dict[str, int]:
    out = {}
    for i, line in enumerate(text.splitlines(), 1):
        if f"# {kind}:" in line:
            out[line.split(f"# {kind}:", 1)[1].split()[0]] = i
    return out


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory, base_python) -> tuple[dict, dict]:
    tmp = tmp_path_factory.mktemp("synthetic")
    py, site = make_venv(base_python, tmp, with_speculators=False)
    (site / "mypkg").mkdir()
    # does not import api: resolving must import submodules
    (site / "mypkg" / "__init__.py").write_text("")
    (site / "mypkg" / "api.py").write_text(API)
    (site / "mypkg" / "inner.py").write_text(INNER)
    (site / "mycaller.py").write_text(CALLER)
    outcome = run_check(py, SYNTH_CHECK, tmp)
    by_line: dict = {}
    for f in outcome["failures"]:
        by_line.setdefault((Path(f["file"]).name if f["file"] else None, f["line"]), []).append(f)
    return outcome, by_line


def failure_at(by_line: dict, tag: str, source: str = CALLER, file: str = "mycaller.py") -> dict:
    line = marker_lines(source, "BAD")[tag]
    found = by_line.get((file, line))
    assert found, f"no failure at {file}:{line} ({tag}); failures at {sorted(by_line)}"
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize(
    "tag, callee, error",
    [
        ("f-missing-b", "mypkg.api.f", "missing a required argument: 'b'"),
        ("f-too-many", "mypkg.api.f", "too many positional arguments"),
        ("f-unexpected-e", "mypkg.api.f", "got an unexpected keyword argument 'e'"),
        ("f-multiple-b", "mypkg.api.f", "multiple values for argument 'b'"),
        ("gg-missing-x", "mypkg.api.g", "missing a required argument: 'x'"),
        ("api-g-too-many", "mypkg.api.g", "too many positional arguments"),
        ("alias-G-unexpected-z", "mypkg.api.g", "got an unexpected keyword argument 'z'"),
        ("thing-missing-size", "mypkg.api.Thing", "missing a required argument: 'size'"),
        ("cfg-missing-required", "mypkg.api.Cfg", "missing a required argument: 'required'"),
        ("star-missing-kwonly-c", "mypkg.api.f", "missing a required argument: 'c'"),
        ("star-too-many", "mypkg.api.f", "too many positional arguments"),
        ("star-unexpected-e", "mypkg.api.f", "got an unexpected keyword argument 'e'"),
        (
            "call-missing-module",
            "mypkg.gone.vanished",
            "ModuleNotFoundError: No module named 'mypkg.gone'",
        ),
        (
            "import-missing-module",
            "mypkg.gone.vanished",
            "ModuleNotFoundError: No module named 'mypkg.gone'",
        ),
        (
            "import-missing-name",
            "mypkg.api.nosuch",
            "AttributeError: module 'mypkg.api' has no attribute 'nosuch'",
        ),
        ("run-missing-n", "mypkg.api.Thing.run", "missing a required argument: 'n'"),
        ("run-too-many", "mypkg.api.Thing.run", "too many positional arguments"),
        ("smeth-too-many", "mypkg.api.Thing.smeth", "too many positional arguments"),
        ("cmeth-missing-a", "mypkg.api.Thing.cmeth", "missing a required argument: 'a'"),
        ("nothere", "mypkg.api.Thing.nothere", "Thing has no attribute 'nothere'"),
        ("missing-attr", "mypkg.api.Thing.missing_attr", "Thing has no attribute 'missing_attr'"),
        ("two-types", "mypkg.api.Other.other", "Other has no attribute 'other'"),
        ("compat-else-still-checked", "mypkg.api.Thing.run", "missing a required argument: 'n'"),
        ("compat-and-body-checked", "mypkg.api.Thing.run", "too many positional arguments"),
        (
            "ghost-type",
            "mypkg.api.Ghost",
            (
                "type of receiver self.ghost: AttributeError: "
                "module 'mypkg.api' has no attribute 'Ghost'"
            ),
        ),
    ],
)
def test_synthetic_failure(synthetic, tag, callee, error):
    _outcome, by_line = synthetic
    failure = failure_at(by_line, tag)
    assert failure["callee"] == callee
    assert failure["error"] == error
    assert failure["file"].endswith("/mycaller.py")


def test_synthetic_flags_nothing_else(synthetic):
    outcome, by_line = synthetic
    bad = set(marker_lines(CALLER, "BAD").values())
    stray = [
        f
        for f in outcome["failures"]
        if f["file"] and f["file"].endswith("mycaller.py") and f["line"] not in bad
    ]
    assert stray == []
    # the files really are in site-packages and were read, not run (mycaller raises SystemExit at
    # import)
    assert outcome["verify"]["items"][0]["ok"] is False


def test_synthetic_version_compat_branches_are_not_flagged(synthetic):
    outcome, _ = synthetic
    dead = {
        p["callee"].rsplit(".", 1)[-1]: p["reason"]
        for p in outcome["partial"]
        if p["reason"].startswith("not reached")
    }
    assert dead == {
        "old_run": "not reached with the installed Thing: hasattr(self.thing, 'run') is True",
        "new_api": "not reached with the installed Thing: hasattr(self.thing, 'new_api') is False",
        "gone": "not reached with the installed Thing: hasattr(self.thing, 'smeth') is True",
        "legacy": "not reached with the installed Thing: hasattr(self.thing, 'run') is True",
        "maybe": "not reached with the installed Thing: hasattr(self.thing, 'maybe') is False",
    }


def test_synthetic_relative_import(synthetic):
    _outcome, by_line = synthetic
    failure = failure_at(by_line, "relative", INNER, "inner.py")
    assert failure["callee"] == "mypkg.api.g"
    assert failure["error"] == "too many positional arguments"


def test_synthetic_partial_call_sites(synthetic):
    outcome, _ = synthetic
    partial = {
        p["line"]: p for p in outcome["partial"] if p["file"] and p["file"].endswith("mycaller.py")
    }
    marks = marker_lines(CALLER, "PARTIAL")
    assert partial[marks["star"]]["reason"] == (
        "partially checked: the call site uses *args, so missing arguments are not checked"
    )
    assert "**kwargs" in partial[marks["dstar"]]["reason"]
    assert "guarded import" in partial[marks["guarded"]]["reason"]
    assert "guarded import" in partial[marks["guarded-call"]]["reason"]


def test_synthetic_listed_attributes(synthetic):
    outcome, by_line = synthetic
    listed = {f["callee"]: f["error"] for f in outcome["failures"] if f["file"] is None}
    assert listed == {
        "mypkg.api.Thing.nope": "AttributeError: type object 'Thing' has no attribute 'nope'",
        "mypkg.nomod.X": "AttributeError: module 'mypkg' has no attribute 'nomod'",
    }
    assert all(f["line"] is None for f in outcome["failures"] if f["file"] is None)


def test_synthetic_counts(synthetic):
    outcome, _ = synthetic
    # bound calls: the imported-callable calls that resolved plus the receiver method calls
    assert outcome["calls_checked"] >= 25
    # 4 listed attributes + receiver attribute reads that were found
    assert outcome["attributes_checked"] >= 4 + 5
    assert set(outcome) >= {"failures", "calls_checked", "attributes_checked", "partial"}


def test_missing_module_is_a_failure_not_a_crash(tmp_path, base_python):
    py, _site = make_venv(base_python, tmp_path, with_speculators=False)
    check = {
        "kind": "callsites",
        "name": "missing",
        "modules": ["no_such_module_anywhere"],
        "packages": ["json"],
        "receivers": [],
        "attributes": ["json.dumps", "json.nope"],
    }
    outcome = run_check(py, check, tmp_path)
    by_callee = {f["callee"]: f for f in outcome["failures"]}
    assert set(by_callee) == {"no_such_module_anywhere", "json.nope"}
    assert (
        "module 'no_such_module_anywhere' not found"
        in by_callee["no_such_module_anywhere"]["error"]
    )
    assert by_callee["json.nope"] == {
        "file": None,
        "line": None,
        "callee": "json.nope",
        "error": "AttributeError: module 'json' has no attribute 'nope'",
    }
    assert outcome["attributes_checked"] == 2
