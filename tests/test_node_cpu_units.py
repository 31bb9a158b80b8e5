"""What the agent does less of per host, without changing any answer. No lab: remote_scripts' checks
keep a file's code lines and a successful compile in the state dir, keyed by the file's bytes (so a
changed file is never judged by a stale entry, and an untrusted entry is refused like any state
file); installed versions are read with one sys.path scan per request."""

from __future__ import annotations

import os
import re
import sys

import pytest

import remote_scripts.checks.checks as checks
import remote_scripts.core.dists as dists
import remote_scripts.core.nodeio as nodeio
import remote_scripts.core.sitemodules as sitemodules

GOOD = "def f(x):\n    # uses_old_api(x)\n    return new_api(x)\n"


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A module file and a state dir; module_file_in_site answers that file (it needs a real site
    dir)."""
    module = tmp_path / "site" / "mod.py"
    module.parent.mkdir()
    module.write_text(GOOD)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setattr(checks, "module_file_in_site", lambda name: str(module))
    checks.forget_code_lines()
    yield module, state
    checks.forget_code_lines()


def _verify(state, expect="absent", pattern=r"uses_old_api\(") -> dict:
    checks.forget_code_lines()  # a new agent: only the state dir carries over
    req = {
        "state_dir": str(state),
        "checks": [
            {
                "kind": "grep",
                "name": "g",
                "module": "pkg.mod",
                "pattern": pattern,
                "expect": expect,
            },
            {"kind": "compile", "name": "c", "module": "pkg.mod"},
        ],
    }
    answer = checks.verify(req)
    for item in answer["items"]:
        item.pop("seconds", None)
    return answer


def test_a_second_verify_uses_the_kept_lines_and_compile_and_answers_the_same(node, monkeypatch):
    module, state = node
    first = _verify(state)
    assert first["ok"], first
    kept = sorted(p.name for p in (state / "cache").iterdir())
    assert kept == ["code-lines.pkg.mod.json", "compiles.pkg.mod.json"]
    assert (state / "cache").stat().st_mode & 0o077 == 0

    def no(*a, **k):
        raise AssertionError("recomputed although nothing changed")

    monkeypatch.setattr(checks, "_code_lines", no)
    monkeypatch.setattr(checks, "compile", no, raising=False)
    assert _verify(state) == first


def test_a_changed_file_is_judged_afresh_never_by_a_stale_entry(node):
    module, state = node
    assert _verify(state)["ok"]
    module.write_text(GOOD.replace("# uses_old_api(x)", "uses_old_api(x)"))
    answer = _verify(state)
    assert [i["ok"] for i in answer["items"]] == [False, True]
    # same module, bytes that do not compile: never a kept success
    module.write_text(GOOD + "def broken(:\n")
    answer = _verify(state)
    assert answer["items"][1]["ok"] is False and "SyntaxError" in answer["items"][1]["msg"]


def test_an_entry_for_other_bytes_or_a_forged_one_is_not_believed(node):
    module, state = node
    _verify(state)
    entry = state / "cache" / "code-lines.pkg.mod.json"
    forged = entry.read_text().replace("return new_api", "return uses_old_api(")
    entry.write_text(forged.replace('"key": "', '"key": "0'))  # forged lines, wrong key: ignored
    assert _verify(state)["ok"]
    # corrupt: quarantined, recomputed
    (state / "cache" / "compiles.pkg.mod.json").write_text("not json")
    module.write_text(GOOD + "def broken(:\n")
    assert _verify(state)["items"][1]["ok"] is False


def test_an_untrusted_cache_entry_is_refused_like_any_state_file(node, tmp_path):
    module, state = node
    _verify(state)
    entry = state / "cache" / "code-lines.pkg.mod.json"
    target = tmp_path / "elsewhere.json"
    target.write_text(entry.read_text())
    entry.unlink()
    entry.symlink_to(target)
    answer = _verify(state)
    grep = answer["items"][0]
    assert not grep["ok"] and "symlink" in grep["msg"]


def test_without_a_state_dir_nothing_is_kept(node):
    module, state = node
    checks.forget_code_lines()
    answer = checks.verify(
        {
            "checks": [
                {
                    "kind": "grep",
                    "name": "g",
                    "module": "pkg.mod",
                    "pattern": "new_api",
                    "expect": "match",
                }
            ]
        }
    )
    assert answer["ok"] and not (state / "cache").exists()


def test_installed_version_scans_once_per_request_and_first_on_sys_path_wins(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
    (a / "Foo_Bar-1.0.dist-info").mkdir()
    (b / "foo.bar-2.0.dist-info").mkdir()
    (b / "other-3.1.dist-info").mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(a), str(b)])
    nodeio.forget_resolved()
    assert dists.installed_version("foo-bar") == "1.0"
    assert dists.installed_version("OTHER") == "3.1"
    assert dists.installed_version("absent") is None
    (b / "absent-9.dist-info").mkdir()
    assert dists.installed_version("absent") is None  # within one request: the scan it made
    nodeio.forget_resolved()  # the next request scans again
    assert dists.installed_version("absent") == "9"
    nodeio.forget_resolved()


def test_site_roots_are_found_once_per_request(tmp_path, monkeypatch):
    a, b = os.path.realpath(tmp_path / "a"), os.path.realpath(tmp_path / "b")
    monkeypatch.setattr(sitemodules.site, "getsitepackages", lambda: [a])
    monkeypatch.setattr(sitemodules.site, "getusersitepackages", lambda: b)
    nodeio.forget_resolved()
    assert sitemodules.site_roots() == [a, b]
    monkeypatch.setattr(sitemodules.site, "getsitepackages", lambda: [b])
    assert sitemodules.site_roots() == [a, b]  # within one request: what it found
    nodeio.forget_resolved()  # the next request asks again
    assert sitemodules.site_roots() == [b, b]
    nodeio.forget_resolved()


@pytest.mark.parametrize(
    "name", ["Foo_Bar", "foo..bar", "a-_.-b", "x__y", "A.B-C_d", "-lead", "trail.", "zz"]
)
def test_normalize_is_pep_503(name):
    assert dists.normalize_dist_name(name) == re.sub(r"[-_.]+", "_", name).lower()
