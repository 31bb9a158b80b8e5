"""A broken or mistyped fabric.yaml: one line naming the file, the line and what to write, exit 2,
from Fabric's own `fab` (which reads the file itself, while it loads the fabfile) and from `fleet`
alike; never a traceback.

The fuzz compares the check (plans/projectfile.py) with the real readers it guards: whatever it lets
through, Invoke's own Config.load_project merges without error and fleetops finds its settings of
the right types."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from fabric import Config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetops.plans.marks import ConfigError
from fleetops.plans.projectfile import SETTINGS, check_project_file

BIN = Path(sys.executable).parent
EXECUTOR = "tasks: {executor_class: fleetops.fab.executor.FleetExecutor}\n"

# The four shapes met in use, each with the line the error must name and a word of the fix it must
# give.
SHAPES = {
    "unclosed list": ("fleetops: {playbook: [oops\n", 2, "invalid YAML"),
    "section is a list (JSON)": ('{"fleetops": [1,2]}\n', 1, "must be a mapping"),
    "section is a list": (EXECUTOR + "fleetops: [1, 2]\n", 2, "must be a mapping"),
    "inventory is a number": (EXECUTOR + "fleetops: {inventory: 5}\n", 2, "must be text"),
    "tasks is a number": ("tasks: 3\n", 1, "must be a mapping"),
    "inventory is a YAML 1.1 boolean": (EXECUTOR + "fleetops:\n  inventory: no\n", 3, "quote it"),
    "misspelt setting": (
        EXECUTOR + "fleetops:\n  playbook: playbooks\n  inventroy: hosts\n",
        4,
        "'inventory'",
    ),
}


def project(tmp_path: Path, text: str) -> Path:
    (tmp_path / "fabfile.py").write_text("from fleetops.fab.tasks import ns  # noqa: F401\n")
    (tmp_path / "fabric.yaml").write_text(text)
    (tmp_path / "hosts").mkdir(exist_ok=True)
    return tmp_path


def run(program: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run(
        [str(BIN / program), *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=60
    )


@pytest.mark.parametrize("program", ["fab", "fleet"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_broken_fabric_yaml_is_one_line_naming_file_and_line(tmp_path, program, shape):
    text, line, fix = SHAPES[shape]
    where = project(tmp_path, text)
    proc = run(program, where, "-H", "lab01", "ping")
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both, both
    assert proc.returncode == 2, both
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, both
    assert lines[0].startswith(f"{program}: {where / 'fabric.yaml'}:{line}:") or lines[
        0
    ].startswith(f"{program}: {where / 'fabric.yaml'}:{line} "), lines[0]
    assert fix in lines[0], lines[0]


def test_the_listing_is_refused_the_same_way(tmp_path):
    """`fab --list` reads the project too: the same line, before any task is named."""
    proc = run("fab", project(tmp_path, "tasks: 3\n"), "--list")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "fabric.yaml:1:" in proc.stderr, proc.stderr


def test_a_sound_fabric_yaml_passes(tmp_path):
    check_project_file(REPO, Config.global_defaults())  # the checkout's own
    proc = run("fab", project(tmp_path, (REPO / "fabric.yaml").read_text()), "--list")
    assert proc.returncode == 0, proc.stderr


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70000),
    st.sampled_from(
        [
            "hosts",
            "playbooks/",
            "yes",
            "no",
            "on",
            "2026-01-01",
            "0x10",
            "1:30",
            "~",
            "[x",
            "{a: 1}",
            "- x",
        ]
    ),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(
                [
                    "playbook",
                    "inventory",
                    "forks",
                    "executor_class",
                    "echo",
                    "warn",
                    "inline_ssh_env",
                    "x",
                ]
            ),
            inner,
            max_size=3,
        ),
    ),
    max_leaves=6,
)
TOP = st.dictionaries(
    st.sampled_from(
        [
            "fleetops",
            "tasks",
            "run",
            "sudo",
            "connect_kwargs",
            "timeouts",
            "ssh_config_path",
            "load_ssh_configs",
            "extra",
        ]
    ),
    VALUES,
    max_size=4,
)


def _as_fleetops_reads(folder: Path) -> None:
    """Invoke's real merge of the project file, then fleetops' settings as the executor takes
    them."""
    config = Config(project_location=str(folder))
    config.load_project()
    section = dict(config.get("fleetops", {}) or {})
    for key, value in section.items():
        want = SETTINGS[key][0]
        assert value is None or (isinstance(value, want) and not isinstance(value, bool)), (
            key,
            value,
        )
    executor = config.tasks.executor_class
    assert executor is None or isinstance(executor, str), executor


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(doc=TOP, raw=st.booleans())
def test_fuzz_what_the_check_passes_invoke_and_fleetops_read(tmp_path, doc, raw):
    text = yaml.safe_dump(doc, default_flow_style=bool(raw))
    # flow style written by hand: quotes dropped, so YAML 1.1 and 1.2 read the scalars differently
    if raw:
        text = text.replace("'", "")
    folder = project(tmp_path, text)
    try:
        check_project_file(folder, Config.global_defaults())
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith(str(folder / "fabric.yaml")) and "\n" not in message, message
        return
    _as_fleetops_reads(folder)


@pytest.mark.parametrize(
    "text",
    [
        "fleetops: {forks: yes}\n",
        "tasks: {executor_class: 5}\n",
        "fleetops:\n- a\n",
        "tasks: {executor_class: yes}\n",
        "tasks:\n  executor_class: 2026-01-01\n",
        "run: {echo: {x: 1}}\n",
        "fleetops: {playbook: 2026-13-45}\n",
        "\t- x\n",
    ],
)
def test_more_shapes_never_a_traceback(tmp_path, text):
    proc = run("fleet", project(tmp_path, text), "-H", "lab01", "ping")
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.returncode == 2 and "fabric.yaml" in proc.stderr, proc.stderr
