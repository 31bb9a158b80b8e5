"""The agent's steady-state path imports neither `json` nor `re` (nor the enum, functools and
collections they pull in: ~17 ms of node CPU per host). What replaces them must give the very same answers, so
each replacement is checked here against the stdlib code it replaces, on the same inputs: wirejson against
json, textpattern against re.search, and the string parsers against the regular expressions they were."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops.plans.playbook import load_playbook
from remote_scripts.checks import checks
from remote_scripts.core import nodeio, wirejson
from remote_scripts.core.textpattern import TextPattern, compile_pattern, text_pattern
from remote_scripts.patch.wheelrecord import record_sha256

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- wirejson = json
VALUES = [
    {"ok": True, "items": [{"line": 172, "text": "enable_prefix_caching=False,", "seconds": 0.0}], "error": None},
    {"b": [1, 2.5, {"x": None, "a": True}], "a": "é\n\"\\\t\u2028\x00", "c": {}, "d": [], "e": {"z": [[]]}},
    [], {}, "text", "", 0, -1, 10**30, 1e-300, -0.0, 3.141592653589793, True, None, [1, [2, [3, []]]],
    {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}, "\ud800 lone surrogate", ("a", 1),
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
@pytest.mark.parametrize("sort_keys", [False, True])
@pytest.mark.parametrize("indent", [None, 1, 2])
def test_wirejson_writes_what_json_writes(value, sort_keys, indent):
    assert wirejson.dumps(value, sort_keys=sort_keys, indent=indent) == \
        json.dumps(value, sort_keys=sort_keys, indent=indent)


def test_wirejson_default_and_its_errors_are_jsons():
    class Odd:
        def __str__(self) -> str:
            return "odd!"

    assert wirejson.dumps({"p": Path("/x"), "o": Odd()}, default=str) == json.dumps({"p": Path("/x"), "o": Odd()},
                                                                                 default=str)
    with pytest.raises(TypeError, match="not JSON serializable"):
        wirejson.dumps({"o": Odd()})
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        wirejson.dumps(loop)
    # keys that json turns into strings, indented
    assert wirejson.dumps({"o": {1: {"a": 1}, None: 2}}, indent=1) == json.dumps({"o": {1: {"a": 1}, None: 2}},
                                                                                indent=1)
    # indented: default= (and what it returns) as json treats them, and loops refused the same way
    nested = {"a": [Odd(), {"b": Odd()}]}
    assert wirejson.dumps(nested, default=lambda o: {"x": [1]}, indent=1) == \
        json.dumps(nested, default=lambda o: {"x": [1]}, indent=1)
    assert wirejson.dumps({1: Odd()}, default=str, indent=1) == json.dumps({1: Odd()}, default=str, indent=1)
    for value in ({"a": loop}, [loop], loop):
        with pytest.raises(ValueError, match="Circular reference detected"):
            wirejson.dumps(value, indent=1)
    shared = [1]
    assert wirejson.dumps({"a": shared, "b": [shared]}, indent=1) == json.dumps({"a": shared, "b": [shared]},
                                                                               indent=1)  # shared is no loop


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_wirejson_reads_what_json_reads(value):
    text = json.dumps(value)
    for doc in (text, f"  {text}\n", text.encode(), bytearray(f"\t{text} ".encode())):
        got, want = wirejson.loads(doc), json.loads(doc)
        assert json.dumps(got) == json.dumps(want) and type(got) is type(want)


@pytest.mark.parametrize("bad", ["", "   ", "{", '{"a": 1} x', "[1,]", "nul", '"\x01"', "{'a': 1}", "01", "\n"])
def test_wirejson_refuses_what_json_refuses_with_a_value_error(bad):
    with pytest.raises(ValueError) as mine:
        wirejson.loads(bad)
    with pytest.raises(ValueError) as theirs:
        json.loads(bad)
    assert type(mine.value) is type(theirs.value)


def test_the_agents_replacements_import_neither_json_nor_re():
    code = ("import sys\n"
            "from remote_scripts.core import protocol, textpattern, wirejson\n"
            "wirejson.loads(wirejson.dumps({'a': [1, 2.5, None, 'x']}, default=str))\n"
            "wirejson.dumps({'a': {'b': [1]}}, indent=1, sort_keys=True)\n"
            "assert textpattern.compile_pattern(r'^\\s*block_size=self\\.x,').search('  block_size=self.x,')\n"
            "print(sorted({'json', 're', 'enum', 'functools', 'typing'} & set(sys.modules)))\n")
    # -S: this checkout's own modules (from cwd), without the dev venv's site start-up (its editable-install
    # finder imports pathlib, and so re)
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_wirejson_refuses_bad_json_where_json_was_never_imported():
    # as on the node: nothing has imported json (the C scanner's own error path needs it loaded)
    code = ("import sys; from remote_scripts.core import wirejson; assert 'json' not in sys.modules\n"
            "for bad in ['{not json', '[1,', '\"\\x01\"', '{} x', '']:\n"
            "    try:\n        wirejson.loads(bad)\n    except ValueError as exc:\n"
            "        print(type(exc).__name__, exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "JSONDecodeError Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        "JSONDecodeError Expecting value: line 1 column 4 (char 3)",
        "JSONDecodeError Invalid control character at: line 1 column 2 (char 1)",
        "JSONDecodeError Extra data: line 1 column 4 (char 3)",
        "JSONDecodeError Expecting value: line 1 column 1 (char 0)"], proc.stdout


def test_wirejson_raw_decode_is_jsons():
    text = '  {"a": [1, 2]} {"b": 2}'
    assert wirejson.raw_decode(text) == (json.JSONDecoder().raw_decode(text.lstrip())[0], text.index("}") + 1)
    assert math.isnan(wirejson.loads("NaN"))


# ---------------------------------------------------------------- textpattern = re.search
def _shipped_grep_patterns() -> list[str]:
    patterns = []
    for path in sorted((REPO / "playbooks").glob("*.yaml")):
        patterns += [c["pattern"] for c in load_playbook(path).checks if c["kind"] == "grep"]
    return patterns


def test_every_grep_of_the_shipped_playbooks_is_matched_without_re():
    patterns = _shipped_grep_patterns()
    assert len(patterns) >= 10
    assert all(isinstance(compile_pattern(p), TextPattern) for p in patterns), \
        [p for p in patterns if not isinstance(compile_pattern(p), TextPattern)]


def test_the_shipped_greps_find_the_same_lines_as_re_in_the_real_file(base_python):
    # the speculators file the playbook checks, as installed from PyPI in the lab base venv
    site = next(base_python.parent.parent.glob("lib/python3*/site-packages"))
    source = (site / "speculators/data_generation/vllm_hidden_states_generator.py").read_text()
    lines = source.splitlines() + checks.code_lines(source)[0]
    for pattern in _shipped_grep_patterns():
        rx, mine = re.compile(pattern), compile_pattern(pattern)
        assert [i for i, x in enumerate(lines) if rx.search(x)] == [i for i, x in enumerate(lines) if mine.search(x)]


@pytest.mark.parametrize("pattern", [
    r"a.b", r"\d+", r"(x)", r"a|b", r"x*", r"[ab]", r"\s", r"\s{2}", r"\s*?x", r"\s+x", r"x$", r"\bx",
    r"(?i)x", r"x\s* y", r"\1", "", "^", r"\s*", r"a{2}", r"\w", r"\s*+x", r"\s++x", r"x\s*\ y", r"\t", "x\\",
])
def test_anything_else_of_re_is_left_to_re(pattern):
    assert text_pattern(pattern) is None
    try:
        want = re.compile(pattern)
    except re.error:
        return
    assert compile_pattern(pattern) == want


def test_textpattern_matches_exactly_what_re_search_matches():
    # random patterns of the kinds textpattern takes, on lines of the characters that matter (Unicode
    # whitespace included: re's \s is str.isspace); every pattern textpattern takes must agree with re
    rnd = random.Random(16)
    atoms = ["a", "b", " ", r"\s*", r"\s+", r"\.", r"\(", "=", ",", "\u00a0", "^", r"\_", r"\ ", "\t", r"\é", "é",
             "\n", "\x0b"]
    chars = ["a", "b", " ", ".", "(", "=", ",", "\u00a0", "\t", "\u2003", "\x1c", "_", "é", "\x85", "\n", "\r",
             "\x0b", "\x0c"]
    taken = compared = 0
    for _ in range(6000):
        pattern = "".join(rnd.choice(atoms) for _ in range(rnd.randint(1, 6)))
        try:
            rx = re.compile(pattern)
        except re.error:
            continue
        mine = text_pattern(pattern)
        if mine is None:
            continue
        taken += 1
        for _ in range(15):
            line = "".join(rnd.choice(chars) for _ in range(rnd.randint(0, 12)))
            assert bool(rx.search(line)) == mine.search(line), (pattern, line)
            compared += 1
    assert taken > 3000 and compared > 45000


# ---------------------------------------------------------------- string parsers = the regexes they replace
def test_upload_temp_names_and_cache_names_are_judged_as_the_regular_expressions_did():
    upload = re.compile(r"^fleetops-agent-[0-9a-f]+\.pyz\.[0-9a-f]{8}\.tmp$")
    module = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,200}")
    names = ["fleetops-agent-0a1b.pyz.0123abcd.tmp", "fleetops-agent-.pyz.0123abcd.tmp",
             "fleetops-agent-0a1b.pyz.0123abc.tmp", "fleetops-agent-0A1B.pyz.0123abcd.tmp",
             "fleetops-agent-0a1b.pyz.0123abcd.tmpx", "fleetops-agent-0a1b.pyz", "x.pyz.0123abcd.tmp",
             "fleetops-agent-0a.pyz.1b.pyz.0123abcd.tmp", "speculators.data_generation.x", "_a", "9a", "a/b",
             "a" * 201, "a" * 202, "", "é", "a-b"]
    for name in names:
        assert nodeio.is_upload_tmp(name) is bool(upload.match(name)), name
        assert checks._fit_for_a_file_name(name) is bool(module.fullmatch(name)), name
    # The one intended difference: the regex's `$` also matched before a final newline. No upload names a
    # file so, and the string test leaves a file of that name alone.
    odd = "fleetops-agent-0a1b.pyz.0123abcd.tmp\n"
    assert upload.match(odd) and not nodeio.is_upload_tmp(odd)


def test_a_record_digest_decodes_as_base64_did(tmp_path):
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    # RECORD's digests are urlsafe and unpadded: a content whose digest has both of urlsafe's own characters
    content = next(b"x = %d\n" % i for i in range(10000)
                   if {"-", "_"} <= set(base64.urlsafe_b64encode(hashlib.sha256(b"x = %d\n" % i).digest()).decode()))
    (site / "pkg" / "m.py").write_bytes(content)
    digest = hashlib.sha256(content).digest()
    b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    (site / "pkg-1.0.dist-info").mkdir()
    (site / "pkg-1.0.dist-info" / "RECORD").write_text(f"pkg/m.py,sha256={b64},300\n")
    assert record_sha256(str(site), str(site / "pkg" / "m.py"))[0] == digest.hex()
