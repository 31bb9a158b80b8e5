"""Hostile values in inventories and playbooks are refused with file:line (never run, never
followed), and the YAML loaders give a result or a clean error for any input (fuzzed with
hypothesis)."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetops.plans import unidiff
from fleetops.plans.inventory import load_inventory
from fleetops.plans.playbook import load_playbook
from fleetops.plans.yamlsrc import ConfigError, load_text

HOSTILE = [
    "x; rm -rf /",
    "$(touch /tmp/pwned)",
    "`id`",
    "a'b",
    'a"b',
    "line1\nline2",
    "../../etc",
    "/a/../../etc",
    "x" * 5000,
    "a b",
    "a\tb",
    "a|b",
    "a&b",
    "a>b",
    "~root",
    "-oProxyCommand=sh",
]
HOST_FIELDS = ["address", "user", "python", "state_dir", "jump", "groups"]


IDS = [repr(v)[:20] for v in HOSTILE]


@pytest.mark.parametrize("field", HOST_FIELDS)
@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
def test_hostile_inventory_values_are_refused_with_file_and_line(tmp_path, field, value):
    doc = {"hosts": {"gpu01": {"address": "10.0.0.1", "python": "/opt/venv/bin/python"}}}
    doc["hosts"]["gpu01"][field] = [value] if field == "groups" else value
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as err:
        load_inventory(tmp_path)
    assert err.value.path == str(path) and err.value.line is not None, str(err.value)


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
def test_hostile_module_and_job_values_are_refused(tmp_path, value):
    (tmp_path / "fabfile.py").write_text("")
    book = tmp_path / "pb.yaml"
    book.write_text(yaml.safe_dump({"name": "x", "verify": [{"kind": "compile", "module": value}]}))
    with pytest.raises(ConfigError) as err:
        load_playbook(book)
    assert err.value.line is not None and "module" in err.value.message
    book.write_text(
        yaml.safe_dump(
            {
                "name": "x",
                "jobs": {
                    "j": {
                        "backend": "vllm",
                        "model": value,
                        "dataset": "/d",
                        "output": "/o",
                        "layer_ids": [1],
                    }
                },
            }
        )
    )
    if value in ("~root", "-oProxyCommand=sh"):
        return  # plain (odd) path names: passed as argv/env values, never interpreted
    with pytest.raises(ConfigError):
        load_playbook(book)


def test_patch_and_probe_files_outside_the_project_are_refused(tmp_path):
    project = tmp_path / "project"
    (project / "playbooks").mkdir(parents=True)
    (project / "fabfile.py").write_text("")
    secret = tmp_path / "secret.diff"
    secret.write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    book = project / "playbooks" / "pb.yaml"
    book.write_text("name: x\npatches:\n  - module: a.b\n    diff: ../../secret.diff\n")
    with pytest.raises(ConfigError, match=r"pb.yaml:4:5: diff '../../secret.diff' points outside"):
        load_playbook(book)
    book.write_text("name: x\nverify:\n  - kind: probe\n    script: /etc/passwd\n")
    with pytest.raises(ConfigError, match="points outside"):
        load_playbook(book)


def test_env_values_with_newlines_are_refused(tmp_path):
    (tmp_path / "h.yaml").write_text(
        'hosts:\n  g:\n    address: 10.0.0.1\n    env:\n      A: "x\\ny"\n'
    )
    with pytest.raises(ConfigError, match="must be one line"):
        load_inventory(tmp_path)


# ---------------------------------------------------------------- fuzzing the loaders
yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)


def _loads_cleanly(tmp_path: Path, text: str) -> None:
    inv_dir = tmp_path / "inv"
    inv_dir.mkdir(exist_ok=True)
    (inv_dir / "fuzz.yaml").write_text(text, encoding="utf-8")
    for load in (
        lambda: load_inventory(inv_dir),
        lambda: load_playbook(inv_dir / "fuzz.yaml"),
        lambda: load_text(text, "fuzz.yaml"),
    ):
        try:
            load()
        except ConfigError:
            pass


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=string.printable + "äé€\u2028", max_size=300))
def test_fuzz_raw_text_gives_a_result_or_a_clean_error(tmp_path, text):
    _loads_cleanly(tmp_path, text)


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.dictionaries(
        st.sampled_from(
            ["hosts", "defaults", "example", "name", "patches", "verify", "requires", "jobs", "x"]
        ),
        yaml_values,
        max_size=5,
    )
)
def test_fuzz_structured_documents_give_a_result_or_a_clean_error(tmp_path, doc):
    _loads_cleanly(tmp_path, yaml.safe_dump(doc, allow_unicode=True))


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "address",
                "port",
                "user",
                "python",
                "state_dir",
                "groups",
                "gpus",
                "env",
                "jump",
                "identity_passphrase",
                "lab",
            ]
        ),
        yaml_values,
        max_size=6,
    )
)
def test_fuzz_host_entries(tmp_path, host):
    _loads_cleanly(tmp_path, yaml.safe_dump({"hosts": {"gpu01": host}}, allow_unicode=True))


@settings(deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "--- a/x",
                "+++ b/x",
                "@@ -1,2 +1,2 @@",
                "@@ -1 +1 @@",
                " ctx",
                "-old",
                "+new",
                "\\ No newline at end of file",
                "garbage",
                "@@ bad @@",
                "",
            ]
        ),
        max_size=12,
    )
)
def test_fuzz_unified_diffs(lines):
    try:
        unidiff.parse("\n".join(lines) + "\n", "fuzz.diff")
    except ConfigError:
        pass
