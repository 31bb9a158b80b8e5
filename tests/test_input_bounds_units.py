"""Without the lab: bounded YAML input (aliases, size, depth), inventory paths that
can never become an option on the node's command line, and secrets masked in values before they are
serialized (JSON text, the audit log, `history --json`), whatever characters they hold.

Each test names the issue's quote it answers. The billion-laughs tests run the loader in a child
process with a 1 GiB address-space limit and a 60 s timeout, so an unbounded loader fails the test
instead of eating the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import REPO

from fleetops import audit, redaction
from fleetops.plans.host import MissingSecret
from fleetops.plans.inventory import load_inventory
from fleetops.plans.playbook import load_playbook
from fleetops.plans.yamlsrc import MAX_ALIAS_NODES, MAX_FILE_BYTES, ConfigError, load_text
from fleetops.report import history
from fleetops.results import Result, Status

SECRET = 'Tök"en\\pass'  # the issue's quote: T ö k " e n \ p a s s


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- item 7: billion laughs
LAUGHS = textwrap.dedent("""\
    a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
    b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
    c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
    d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
    e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
    f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
    g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
    h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
    i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
    """)


def laughs_playbook(tmp_path: Path) -> Path:
    """The issue's attack: a ~600-byte playbook whose probe args expand to 9**9 strings (2.9 GB
    before)."""
    (tmp_path / "fabfile.py").write_text("")
    write(tmp_path / "probe.py", "print('ok')\n")
    body = textwrap.indent(LAUGHS, "      ")
    return write(
        tmp_path / "laughs.yaml",
        f"name: lol\nverify:\n  - kind: probe\n    script: probe.py\n    args:\n{body}",
    )


def laughs_inventory(tmp_path: Path) -> Path:
    body = textwrap.indent(LAUGHS, "      ")
    return write(
        tmp_path / "hosts" / "laughs.yaml",
        f"hosts:\n  gpu01:\n    address: 10.0.0.1\n    groups:\n{body}",
    )


def load_in_child(code: str) -> tuple[subprocess.CompletedProcess, float]:
    """Runs `code` in a child limited to 1 GiB of address space and 60 s; returns it and its wall
    time."""
    prelude = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from fleetops.plans.yamlsrc import ConfigError\n"
    )
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", prelude + code],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the loader was still expanding after 60 s (billion laughs not bounded)")
    return proc, time.monotonic() - started


@pytest.mark.parametrize("kind", ["playbook", "inventory"])
def test_billion_laughs_is_refused_fast_with_file_and_line(tmp_path, kind):
    # Quote: "A 660-byte playbook with YAML anchors (billion laughs) grew to 2.9 GB and died with
    # MemoryError after 30 s."
    if kind == "playbook":
        path = laughs_playbook(tmp_path)
        call = f"from fleetops.plans.playbook import load_playbook; load_playbook({str(path)!r})"
    else:
        path = laughs_inventory(tmp_path)
        call = (
            "from fleetops.plans.inventory import load_inventory; "
            f"load_inventory({str(path.parent)!r})"
        )
    assert path.stat().st_size < 1000
    proc, took = load_in_child(
        f"try:\n    {call}\nexcept ConfigError as e:\n    print('REFUSED', e)\n"
    )
    assert proc.returncode == 0 and "MemoryError" not in proc.stderr, proc.stderr[-2000:]
    out = proc.stdout.strip()
    assert out.startswith(f"REFUSED {path}:"), out
    line = int(out.split(":")[1])
    # the line of an alias inside the file
    assert 1 < line <= len(path.read_text().splitlines()), out
    assert "alias" in out and str(MAX_ALIAS_NODES) in out, out
    assert took < 20, f"took {took:.1f}s"


def test_alias_use_within_the_limit_still_loads(tmp_path):
    # Anchors for shared defaults are ordinary YAML; only an expansion past the limit is refused.
    write(
        tmp_path / "fleet.yaml",
        "defaults: &d\n  user: ops\n  python: /opt/venv/bin/python\n"
        "hosts:\n  gpu01:\n    address: 10.0.0.1\n    <<: *d\n"
        "  gpu02:\n    address: 10.0.0.2\n    groups: &g [gpus, a100]\n"
        "  gpu03:\n    address: 10.0.0.3\n    groups: *g\n",
    )
    inv = load_inventory(tmp_path, ssh_aliases=frozenset())
    assert inv.hosts["gpu01"].user == "ops" and inv.hosts["gpu03"].groups == ("gpus", "a100")


def test_recursive_alias_is_refused_with_its_line():
    # A self-referencing node would make every walker over the document recurse forever.
    with pytest.raises(ConfigError, match=r"x.yaml:2:\d+: .*recursive") as err:
        load_text("a: 1\nb: &loop [1, *loop]\n", "x.yaml")
    assert err.value.line == 2


def test_deep_nesting_is_refused_with_file_and_line():
    text = "a: " + "[" * 5000 + "]" * 5000 + "\n"
    with pytest.raises(ConfigError) as err:
        load_text(text, "deep.yaml")
    assert err.value.path == "deep.yaml" and err.value.line == 1 and "nest" in err.value.message


# ---------------------------------------------------------------- item 7: size cap
@pytest.mark.parametrize("kind", ["playbook", "inventory"])
def test_oversized_file_is_refused_with_file_and_line(tmp_path, kind):
    filler = "# " + "x" * 98 + "\n"
    count = MAX_FILE_BYTES // len(filler) + 10
    if kind == "playbook":
        (tmp_path / "fabfile.py").write_text("")
        path = write(tmp_path / "big.yaml", "name: big\n" + filler * count)
        load = lambda: load_playbook(path)  # noqa: E731
    else:
        path = write(
            tmp_path / "hosts" / "big.yaml",
            "hosts:\n  gpu01:\n    address: 10.0.0.1\n" + filler * count,
        )
        load = lambda: load_inventory(path.parent, ssh_aliases=frozenset())  # noqa: E731
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        load()
    assert time.monotonic() - started < 5
    assert err.value.path == str(path) and err.value.line is not None and err.value.line > 1000, (
        str(err.value)
    )
    assert "larger than" in err.value.message and str(MAX_FILE_BYTES) in err.value.message, str(
        err.value
    )


def test_oversized_diff_named_by_a_playbook_is_refused(tmp_path):
    (tmp_path / "fabfile.py").write_text("")
    diff = write(
        tmp_path / "huge.diff",
        "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n" + "#" * (MAX_FILE_BYTES + 10),
    )
    book = write(tmp_path / "pb.yaml", "name: x\npatches:\n  - module: a.b\n    diff: huge.diff\n")
    with pytest.raises(ConfigError) as err:
        load_playbook(book)
    assert err.value.path == str(diff) and "larger than" in err.value.message


def test_text_passed_directly_is_capped_too():
    with pytest.raises(ConfigError, match=r"big.yaml:\d+: .*larger than"):
        load_text("a: 1\n" + "#" * (MAX_FILE_BYTES + 1), "big.yaml")


# ---------------------------------------------------------------- item 7: paths in the inventory
@pytest.mark.parametrize(
    "key,value",
    [
        # the quote: state_dir: "-c" made the agent command `python -c/bin/...`
        ("state_dir", '"-c"'),
        ("state_dir", "-oProxyCommand"),
        ("state_dir", "relative/dir"),
        ("state_dir", ".fleetops"),
        ("python", '"-c"'),
        ("python", "-m"),
        ("identity_file", '"-oProxyCommand=x"'),
        ("identity_file", "keys/id_ed25519"),
        ("known_hosts", '"-known"'),
        ("known_hosts", "known_hosts"),
    ],
)
def test_inventory_paths_must_be_absolute_and_never_an_option(tmp_path, key, value):
    path = write(
        tmp_path / "bad.yaml", f"hosts:\n  gpu01:\n    address: 10.0.0.1\n    {key}: {value}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_inventory(tmp_path, ssh_aliases=frozenset())
    assert err.value.path == str(path) and err.value.line == 4, str(err.value)
    assert "absolute" in err.value.message and key in err.value.message, str(err.value)


def test_dash_paths_in_defaults_are_refused_at_the_defaults_line(tmp_path):
    path = write(
        tmp_path / "bad.yaml",
        'defaults:\n  state_dir: "-c"\nhosts:\n  gpu01:\n    address: 10.0.0.1\n',
    )
    with pytest.raises(ConfigError) as err:
        load_inventory(tmp_path, ssh_aliases=frozenset())
    assert (err.value.path, err.value.line) == (str(path), 2), str(err.value)


def test_good_absolute_paths_and_the_default_state_dir_load(tmp_path):
    write(
        tmp_path / "ok.yaml",
        "hosts:\n  gpu01:\n    address: 10.0.0.1\n    state_dir: /var/lib/fleetops/\n"
        "    python: /opt/venv/bin/python\n    identity_file: ~/.ssh/id_ed25519\n"
        "    known_hosts: /etc/ssh/ssh_known_hosts\n  gpu02:\n    address: 10.0.0.2\n",
    )
    inv = load_inventory(tmp_path, ssh_aliases=frozenset())
    one, two = inv.hosts["gpu01"], inv.hosts["gpu02"]
    assert (one.state_dir, one.python) == ("/var/lib/fleetops", "/opt/venv/bin/python")
    assert one.identity_file == str(Path("~/.ssh/id_ed25519").expanduser())
    # the built-in defaults, never a '-'
    assert two.state_dir == ".fleetops" and two.python == "python3"


def test_job_cwd_may_not_start_with_a_dash(tmp_path):
    (tmp_path / "fabfile.py").write_text("")
    book = write(
        tmp_path / "pb.yaml",
        "name: x\njobs:\n  j:\n    kind: command\n    command: [echo, hi]\n    cwd: -rf\n",
    )
    with pytest.raises(ConfigError, match=r"pb.yaml:6:\d+: .*cwd"):
        load_playbook(book)


# ---------------------------------------------------------------- secrets masked before
# serialization
@pytest.fixture
def secret():
    redaction.register(SECRET)
    yield SECRET
    redaction.forget(SECRET)


@pytest.mark.parametrize(
    "value", [SECRET, "pässwörd€", 'a"b"c\\d', "line one\nline two", "tab\there", "\u2028sep"]
)
def test_dumps_masks_values_whatever_their_characters(value):
    redaction.register(value)
    try:
        doc = {"msg": f"token={value} end", "nested": [{"k": value}], value: 1, "n": 1}
        for kwargs in ({}, {"indent": 1}, {"ensure_ascii": False}, {"sort_keys": True}):
            text = redaction.dumps(doc, **kwargs)
            back = json.loads(text)
            assert back["msg"] == "token=[secret] end" and back["nested"] == [{"k": "[secret]"}]
            assert "[secret]" in back and value not in text and value not in json.dumps(back)
            for escaped in (json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]):
                assert escaped not in text
    finally:
        redaction.forget(value)


def test_old_way_would_leak_the_quoted_secret(secret):
    # Quote: "a secret with non-ASCII or quote characters (Tök"en\pass) is not masked ... (masking
    # runs after JSON escaping)". Text masking of the JSON text alone misses it; dumps() does not.
    text = json.dumps({"msg": f"x {secret}"})
    # escaped: text masking can't see it
    assert secret not in text and json.loads(text)["msg"] == f"x {secret}"
    assert json.loads(redaction.dumps({"msg": f"x {secret}"}))["msg"] == "x [secret]"


def test_human_text_masks_escaped_forms_too(secret):
    # A value shown with repr() or as JSON inside a message is masked as well as the raw value.
    for shown in (secret, repr(secret), json.dumps(secret), json.dumps(secret, ensure_ascii=False)):
        assert "Tök" not in redaction.redact(
            f"value: {shown}"
        ) and "T\\u00f6k" not in redaction.redact(shown)


def test_multi_line_secret_is_masked_line_by_line():
    value = "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END KEY-----"
    redaction.register(value)
    try:
        assert redaction.redact(f"x {value} y") == "x [secret] y"
        # A job's log arrives one line at a time: each line of the secret is masked on its own.
        for line in value.splitlines():
            assert redaction.redact(f"log: {line}") == "log: [secret]"
    finally:
        redaction.forget(value)


def test_audit_log_and_history_json_mask_the_quoted_secret(secret, tmp_path, monkeypatch, capsys):
    log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(log))
    result = Result("gpu01", "run", Status.OK, f'ran: echo "{secret}"')
    audit.append(audit.entry(result, None, None))
    text = log.read_text(encoding="utf-8")
    record = json.loads(text)
    assert record["msg"] == 'ran: echo "[secret]"', text
    assert secret not in json.dumps(record) and "T\\u00f6k" not in text and "Tök" not in text
    # history --json: an entry written before the secret was known (an older log) is masked on the
    # way out.
    with log.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"host": "gpu01", "task": "run", "msg": f"old {secret}"}) + "\n")
    history.show_history(None, None, True, tmp_path)
    out = capsys.readouterr().out
    records = json.loads(out)
    assert [r["msg"] for r in records] == ['ran: echo "[secret]"', "old [secret]"]
    assert "Tök" not in out and "T\\u00f6k" not in out


def test_audit_message_is_masked_before_it_is_cut(secret, tmp_path, monkeypatch):
    # The log keeps 300 characters of a message: a secret straddling the cut must not leave its
    # first half.
    log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("FLEETOPS_AUDIT_LOG", str(log))
    msg = "x" * 295 + secret + " and more"
    audit.append(audit.entry(Result("gpu01", "run", Status.OK, msg), None, None))
    record = json.loads(log.read_text(encoding="utf-8"))
    assert record["msg"] == ("x" * 295 + "[secret] and more")[:300] and "Tök" not in log.read_text(
        encoding="utf-8"
    )


def test_console_json_document_masks_the_quoted_secret(secret, capsys):
    from fleetops.report.console import Reporter

    r = Result(
        "gpu01",
        "logs",
        Status.OK,
        "3 lines",
        data={"lines": [f"token is {secret}", "done"], "env": {"HF_TOKEN": secret}},
    )
    Reporter(json_mode=True).finish([r], 0)
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert doc["results"][0]["data"]["lines"] == ["token is [secret]", "done"]
    assert doc["results"][0]["data"]["env"] == {"HF_TOKEN": "[secret]"}
    assert "Tök" not in out and "T\\u00f6k" not in out


def test_short_values_are_not_registered():
    # Shorter than 4 characters would mask ordinary words everywhere (documented rule, unchanged).
    redaction.register("ab")
    assert redaction.redact("abc") == "abc"


# ---------------------------------------------------------------- secret_from_env per host
def test_unset_secret_from_env_fails_only_its_host(tmp_path, monkeypatch):
    # Quote: "one host's unset secret_from_env fails every host".
    monkeypatch.delenv("FLEETOPS_TEST_UNSET_TOKEN", raising=False)
    monkeypatch.setenv("FLEETOPS_TEST_SET_TOKEN", "set-token-value-1234")
    path = write(
        tmp_path / "fleet.yaml",
        "hosts:\n  good:\n    address: 10.0.0.1\n    env:\n"
        "      HF_TOKEN: {secret_from_env: FLEETOPS_TEST_SET_TOKEN}\n"
        "  bad:\n    address: 10.0.0.2\n    env:\n      A: plain\n"
        "      HF_TOKEN: {secret_from_env: FLEETOPS_TEST_UNSET_TOKEN}\n"
        "  plain:\n    address: 10.0.0.3\n",
    )
    # loads: the problem belongs to one host
    inv = load_inventory(tmp_path, ssh_aliases=frozenset())
    good, bad, plain = inv.hosts["good"], inv.hosts["bad"], inv.hosts["plain"]
    assert dict(good.env) == {"HF_TOKEN": "set-token-value-1234"} and good.secret_problems() == []
    assert plain.secret_problems() == [] and plain.env == ()
    problems = bad.secret_problems()
    assert len(problems) == 1 and "FLEETOPS_TEST_UNSET_TOKEN" in problems[0], problems
    assert problems[0].startswith(f"{path}:10:"), problems  # the HF_TOKEN line
    assert bad.secret_problems(need_env=False) == []  # a task that starts no job does not need it
    assert bad.identity_passphrase is None  # connecting (ping, patch, ...) is unaffected
    with pytest.raises(MissingSecret, match="bad: .*FLEETOPS_TEST_UNSET_TOKEN"):
        # - a job's environment is never built without its token (never empty, never guessed)
        bad.env  # noqa: B018
    assert "HF_TOKEN" in bad.secret_env


def test_unset_passphrase_env_is_a_problem_for_every_task_of_that_host(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETOPS_TEST_UNSET_PASS", raising=False)
    path = write(
        tmp_path / "fleet.yaml",
        "hosts:\n  locked:\n    address: 10.0.0.1\n"
        "    identity_passphrase: {secret_from_env: FLEETOPS_TEST_UNSET_PASS}\n"
        "  open:\n    address: 10.0.0.2\n",
    )
    inv = load_inventory(tmp_path, ssh_aliases=frozenset())
    problems = inv.hosts["locked"].secret_problems(need_env=False)
    assert (
        len(problems) == 1
        and problems[0].startswith(f"{path}:4:")
        and "FLEETOPS_TEST_UNSET_PASS" in problems[0]
    )
    with pytest.raises(MissingSecret):
        inv.hosts["locked"].identity_passphrase  # noqa: B018
    assert (
        inv.hosts["open"].secret_problems() == [] and inv.hosts["open"].identity_passphrase is None
    )
