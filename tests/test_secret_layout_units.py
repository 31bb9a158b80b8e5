"""Secrets are masked before any layout, without the lab: a table cell rich cuts, folding with its
`{host}` placeholder, `--odd`, the fleet tables, `history`'s cut message; and a playbook's
`secret_env` values are secrets from the moment the playbook is loaded. The console here is the
product's (a RedactingStream under rich), so what this checks is what the operator sees.
test_secret_layout_lab.py runs the same through real nodes at 80 and 152 columns."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from fleetops import redaction
from fleetops.plans.playbook import load_playbook
from fleetops.redaction import RedactingStream
from fleetops.report import fold, history
from fleetops.report.console import Reporter
from fleetops.report.rows import fleet_sections
from fleetops.results import Item, Result, Severity, Status
from fleetops.results.diagnose import Diagnosis, SummaryRow

TOKEN = "hf_SUPERSECRETTOKENVALUE_abcdefghijklmnop"  # 41 characters
URL = "https://admin:Tr0ub4dor@{}:8443/v1"  # each host's own, naming the host itself
HOSTS = ["node01", "node02", "node03", "node04"]
SECRETS = [TOKEN, *(URL.format(h) for h in HOSTS)]


def leaks(text: str, secrets: list[str] = SECRETS, n: int = 8) -> list[str]:
    """Every substring of n characters of a secret that shows in `text`, and the secrets' folded
    forms."""
    found = {s[i : i + n] for s in secrets for i in range(len(s) - n + 1) if s[i : i + n] in text}
    return sorted(found)


@pytest.fixture
def secrets():
    for s in SECRETS:
        redaction.register(s)
    yield SECRETS
    for s in SECRETS:
        redaction.forget(s)


def product_console(width: int) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(
        file=RedactingStream(out), width=width, highlight=False, soft_wrap=True, emoji=False
    ), out


def job_result(host: str) -> Result:
    url = URL.format(host)
    row = [
        f"extract-{host}",
        "failed",
        "1",
        "3s",
        f"samples=1/10 tok/s=1.0 eta=5s token={TOKEN} url={url}",
        f"/var/lib/fleetops/{host}/jobs/log",
    ]
    return Result(
        host,
        "status",
        Status.FAILED,
        f"job failed; last line: SVC_URL={url}",
        [Item("env", Status.FAILED, f"SVC_URL={url}")],
        code=1,
        data={
            "table": {
                "title": f"{host}: job",
                "columns": ["job", "state", "exit", "runtime", "last progress", "log"],
                "rows": [row],
            }
        },
        payload=Diagnosis(
            Severity.WARN,
            [],
            SummaryRow(
                host,
                Severity.WARN,
                "job",
                f"last log line: token={TOKEN} SVC_URL={url}",
                f"fab -H {host} logs",
            ),
        ),
    )


@pytest.mark.parametrize("width", [80, 152])
def test_a_cut_table_cell_never_shows_part_of_a_secret(secrets, width):
    # The defect: `hf_SUPERSECRETTOKENVALUE_abcdefghijklm…`, 38 of 41 characters, once rich cut the
    # cell and the stream's masking no longer found the whole value.
    console, out = product_console(width)
    rep = Reporter(console=console)
    rep.result(job_result("node01"))
    text = out.getvalue()
    assert "[secret]" in text and not leaks(text), (leaks(text), text)


@pytest.mark.parametrize("width", [80, 152])
def test_folding_and_odd_ones_out_mask_a_secret_that_holds_the_hosts_name(secrets, width):
    # The defect: `node[01-03] (3) | SVC_URL=https://admin:Tr0ub4dor@{host}:8443/v1`: the
    # placeholder went in before masking, and --odd printed the same.
    console, out = product_console(width)
    rep = Reporter(console=console)
    rep.fold, rep.odd = True, True
    rep.who = fold.identities((h, f"10.0.0.{i}", 22) for i, h in enumerate(HOSTS, 1))
    results = [job_result(h) for h in HOSTS[:3]]
    results.append(Result("node04", "status", Status.OK, "running", data={}))
    rep.finish(results, 1, sections=fleet_sections(results, fold=True))
    text = out.getvalue()
    assert "odd ones out" in text and "node[01-03] (3)" in text, text
    assert not leaks(text) and "Tr0ub4dor@{host}" not in text, (leaks(text), text)


def test_the_fleet_summary_masks_before_it_folds(secrets):
    results = [job_result(h) for h in HOSTS]
    for r in results:
        r.task = "diagnose"
    (section,) = fleet_sections(results, fold=True)
    assert not leaks(json.dumps(section)), section
    # still folds: the masked rows are the same
    assert section["rows"][0][0] == "node[01-04] (4)", section


@pytest.mark.parametrize("width", [80, 152])
def test_history_masks_before_it_cuts_the_message(secrets, width):
    record = {
        "time": "2026-11-30T11:05:09+00:00",
        "host": "node01",
        "task": "status",
        "result": "failed",
        "exit_status": 1,
        "msg": "x" * 20 + f" token={TOKEN} then more words to cut",
    }
    console, out = product_console(width)
    console.print(history.table([record], width))
    assert not leaks(out.getvalue()), out.getvalue()


def test_playbook_secret_env_values_are_secrets_once_the_playbook_is_loaded(tmp_path):
    value, group_value = "pb-secret-value-Zq7Xw9Lm", "pb-group-secret-Qe4Rt8Yu"
    book = tmp_path / "book.yaml"
    book.write_text(
        "name: secrets\njobs:\n  j:\n    kind: command\n    command: [/bin/true]\n"
        f"    env: {{PB_SECRET: {value}, PLAIN: shown-as-is}}\n    secret_env: [PB_SECRET]\n"
        f"    overrides:\n      gpu:\n        env: {{PB_SECRET: {group_value}}}\n",
        encoding="utf-8",
    )
    try:
        # not a secret before the playbook loads
        assert redaction.redact(f"a {value} b") == f"a {value} b"
        load_playbook(book)
        assert redaction.redact(f"a {value} b {group_value}") == "a [secret] b [secret]"
        assert redaction.redact("PLAIN=shown-as-is") == "PLAIN=shown-as-is"
        assert "Zq7Xw9Lm" not in redaction.dumps({"log": [f"token {value}"]})
    finally:
        redaction.forget(value)
        redaction.forget(group_value)
