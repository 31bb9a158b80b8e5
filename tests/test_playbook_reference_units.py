"""docs/playbooks.md's field reference is the loader's: each table's fields are exactly the keys the
loader accepts there (a field added to the loader without a row, or a row for a field it refuses,
fails), every check kind has its table, and every row says its type, default and meaning. Then the
loader refuses what the reference says it refuses: a misspelled gpu_gate key or preflight kind."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

from fleetops.plans import jobspec, playbook
from fleetops.plans.yamlsrc import ConfigError

DOC = REPO / "docs" / "playbooks.md"
COMMON_CHECK = {"name", "kind"}


def tables() -> dict[str, list[list[str]]]:
    """Each `### heading` of the reference section → the rows of the table(s) under it (header row
    dropped)."""
    text = DOC.read_text()
    section = text[text.index("## 8. Field reference") :]
    out: dict[str, list[list[str]]] = {}
    heading = ""
    for line in section.splitlines():
        if line.startswith("### "):
            heading = line[4:].strip()
            out[heading] = []
        elif line.startswith("| `") and heading:
            out[heading].append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return out


def fields(rows: list[list[str]]) -> set[str]:
    found = [re.fullmatch(r"`([a-z_]+)`", row[0]) for row in rows]
    return {m.group(1) for m in found}  # type: ignore[union-attr]


def expected() -> dict[str, set[str]]:
    kinds = {f"Check `{kind}`": keys - COMMON_CHECK for kind, keys in playbook.CHECK_KEYS.items()}
    return {
        "Playbook (top level)": set(playbook.TOP_KEYS),
        "`patches:` entries": set(playbook.PATCH_KEYS),
        "Every check": COMMON_CHECK,
        **kinds,
        "`receivers:` entries (check `callsites`)": set(playbook.RECEIVER_KEYS),
        "`jobs:` every job": set(jobspec.COMMON_KEYS),
        "`jobs:` kind `extract`": set(jobspec.EXTRACT_KEYS),
        "`gpu_gate:`": set(jobspec.GATE_KEYS),
    }


def test_every_table_lists_exactly_the_fields_the_loader_accepts():
    found = tables()
    want = expected()
    assert set(found) == set(want), (
        f"tables in the doc: {sorted(found)}; the loader's places: {sorted(want)}"
    )
    for heading, keys in want.items():
        doc_keys = fields(found[heading])
        assert doc_keys == keys, (
            f"{heading}: documented but not accepted: {sorted(doc_keys - keys)}; accepted "
            f"but not documented: {sorted(keys - doc_keys)}"
        )
    for kind in playbook.CHECK_KEYS:
        assert playbook.CHECK_KEYS[kind] >= COMMON_CHECK, kind


def test_every_row_says_type_default_and_meaning():
    for heading, rows in tables().items():
        for row in rows:
            assert len(row) == 4 and all(row), f"{heading}: {row}"


def test_the_table_parser_sees_a_missing_row():
    """The comparison can fail: a table without one of its rows is not the loader's."""
    rows = tables()["`jobs:` every job"]
    assert fields(rows[1:]) != set(jobspec.COMMON_KEYS)


def job(extra: str) -> str:
    return f"name: t\njobs:\n  j:\n    kind: command\n    command: [echo, hi]\n{extra}"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "    gpu_gate: {thresold: 10}\n",
            "unknown key 'thresold' in job 'j' gpu_gate; did you mean 'threshold'?",
        ),
        ("    gpu_gate: {threshold: lots}\n", "gpu_gate threshold must be a whole number of MiB"),
        ("    gpu_gate: {gpus: 'a,b'}\n", "gpu_gate gpus must be GPU indices"),
        ("    gpu_gate: 3\n", "gpu_gate must be false, true or a mapping"),
        (
            "    preflight: [requires, grpe]\n",
            "preflight names unknown check kind 'grpe'; did you mean 'grep'?",
        ),
        ("    preflight: grep\n", "preflight must be a list of check kinds"),
    ],
)
def test_the_loader_refuses_what_the_reference_does_not_list(tmp_path, extra, message):
    path = tmp_path / "book.yaml"
    path.write_text(job(extra))
    with pytest.raises(ConfigError) as caught:
        playbook.load_playbook(path)
    assert message in str(caught.value) and "book.yaml:" in str(caught.value), caught.value


@pytest.mark.parametrize(
    ("extra", "gpus", "threshold"),
    [
        ("    gpu_gate: {gpus: '0,2', threshold: 10}\n", (0, 2), 10),
        ("    gpu_gate: {gpus: [1, 3]}\n", (1, 3), 1024),
        ("    gpu_gate: {gpus: 3}\n", (3,), 1024),
        ("    gpu_gate: true\n", None, 1024),
        ("", None, 1024),
    ],
)
def test_a_gate_the_reference_allows_is_read_as_written(tmp_path, extra, gpus, threshold):
    path = tmp_path / "book.yaml"
    path.write_text(job(extra))
    book = playbook.load_playbook(path)
    spec = jobspec.resolve("j", book.jobs["j"], ())
    assert spec.gate is not None and (spec.gate.select, spec.gate.threshold_mib) == (
        gpus,
        threshold,
    )
