"""Every private name of paramiko and Invoke that fleetops uses sits behind fleetops.compat: its
check notices the name gone or changed (and says which), FLEETOPS_PUBLIC_ONLY switches any of them
off, and the public path taken then answers as the fast path does. The paths that need an sshd are
proven in test_public_fallbacks_lab.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from fabric import Config
from invoke.config import Config as InvokeConfig
from invoke.program import Program
from paramiko.auth_handler import AuthHandler

from fleetops import compat
from fleetops.wire import fabconfig, hostkeys

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def hide() -> Iterator[pytest.MonkeyPatch]:
    """A monkeypatch whose changes compat is asked to check again; undone, and checked again, after
    the test."""
    patch = pytest.MonkeyPatch()
    yield patch
    patch.undo()
    compat.recheck()


def _switched(patch: pytest.MonkeyPatch, value: str) -> None:
    patch.setenv(compat.SWITCH, value)
    compat.recheck()


# ---------------------------------------------------------------- each check notices its name gone
# or changed (fast path, class, the private name it calls)
CALLED = [
    ("pipelined_auth", AuthHandler, "_request_auth"),
    ("pipelined_auth", AuthHandler, "_parse_service_accept"),
    ("session_ahead", paramiko.Transport, "_next_channel"),
    ("session_ahead", paramiko.Transport, "_send_message"),
    ("session_ahead", paramiko.Channel, "_set_transport"),
    ("session_ahead", paramiko.Channel, "_set_window"),
    ("session_ahead", paramiko.transport.ChannelMap, "delete"),
    ("shared_config", InvokeConfig, "_modify"),
    ("shared_config", InvokeConfig, "_remove"),
    ("task_parser", Program, "_make_parser"),
    ("quiet_prefetch", paramiko.SFTPFile, "_prefetch_thread"),
]


def test_every_fast_path_is_on_with_the_installed_versions():
    assert compat.report() == dict.fromkeys(compat.FAST_PATHS, "on"), compat.report()


@pytest.mark.parametrize(("fast", "cls", "name"), CALLED, ids=lambda v: getattr(v, "__name__", v))
def test_a_missing_private_name_turns_its_fast_path_off(hide, fast, cls, name):
    hide.delattr(cls, name)
    compat.recheck()
    assert not compat.enabled(fast)
    assert name in compat.report()[fast], compat.report()
    assert [n for n in compat.FAST_PATHS if not compat.enabled(n)] == [fast]  # the others stay on


# (the read-ahead's name is only looked for in a traceback: its arguments are not checked)
TAKING = [
    c for c in CALLED if c[0] != "quiet_prefetch" and c[1] is not paramiko.transport.ChannelMap
]


@pytest.mark.parametrize(("fast", "cls", "name"), TAKING, ids=lambda v: getattr(v, "__name__", v))
def test_a_private_method_taking_other_arguments_turns_its_fast_path_off(hide, fast, cls, name):
    hide.setattr(cls, name, lambda self, a, b, c, d: None)
    compat.recheck()
    assert not compat.enabled(fast) and "takes 4 arguments" in compat.report()[fast], (
        compat.report()
    )


def test_host_keys_kept_elsewhere_turn_the_known_hosts_fast_paths_off(hide):
    # no SubDict with _hostkeys
    hide.setattr(paramiko.HostKeys, "lookup", lambda self, hostname: None)
    # not _host_keys
    hide.setattr(paramiko.SSHClient, "get_host_keys", lambda self: paramiko.HostKeys())
    compat.recheck()
    assert (
        not compat.enabled("indexed_host_keys")
        and "_hostkeys" in compat.report()["indexed_host_keys"]
    )
    assert (
        not compat.enabled("shared_host_keys")
        and "_host_keys" in compat.report()["shared_host_keys"]
    )


def test_the_switch_turns_off_all_or_the_named_ones(hide):
    _switched(hide, "1")
    assert not any(compat.enabled(n) for n in compat.FAST_PATHS)
    assert set(compat.report().values()) == {"off (switched off)"}
    _switched(hide, "session_ahead, task_parser")
    assert [n for n in compat.FAST_PATHS if not compat.enabled(n)] == [
        "session_ahead",
        "task_parser",
    ]
    _switched(hide, "0")
    assert all(compat.enabled(n) for n in compat.FAST_PATHS)


def test_the_switch_is_read_when_the_program_starts():
    code = (
        "from fleetops import compat; print(sorted(n for "
        "n in compat.FAST_PATHS if not compat.enabled(n)))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), compat.SWITCH: "all"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(sorted(compat.FAST_PATHS))


# ---------------------------------------------------------------- the public path answers alike
def _ed25519(tmp_path: Path, i: int) -> paramiko.PKey:
    path = tmp_path / f"id{i}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return paramiko.Ed25519Key.from_private_key_file(str(path))


def _known_hosts(tmp_path: Path, name: str, hosts: int, keys: list[paramiko.PKey]) -> Path:
    lines = [
        f"[127.0.0.1]:{40000 + i} {keys[i % 3].get_name()} {keys[i % 3].get_base64()}"
        for i in range(hosts)
    ]
    hashed = paramiko.HostKeys.hash_host("[127.0.0.1]:40007")
    # hashed, before the plain one
    lines.insert(3, f"{hashed} {keys[2].get_name()} {keys[2].get_base64()}")
    # one entry, two names
    lines.append(f"gpu01,10.0.0.1 {keys[1].get_name()} {keys[1].get_base64()}")
    # a second key, same type
    lines.append(f"[127.0.0.1]:40001 {keys[0].get_name()} {keys[2].get_base64()}")
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


NAMES = [
    "[127.0.0.1]:40000",
    "[127.0.0.1]:40001",
    "[127.0.0.1]:40007",
    "[127.0.0.1]:40049",
    "gpu01",
    "10.0.0.1",
    "nobody",
    "[127.0.0.1]:49999",
]


def _answers(keys: paramiko.HostKeys) -> list:
    """What paramiko's SSHClient.connect reads: per name, the key types in order and the key of
    each."""
    out = []
    for name in NAMES:
        found = keys.lookup(name)
        out.append(None if found is None else [(t, found[t].get_base64()) for t in found])
    return out


@pytest.fixture
def fresh_caches() -> Iterator[None]:
    """hostkeys' per-process caches emptied, so each mode builds its own (a run has one mode from
    its start)."""
    for cache in (hostkeys._HOST_KEYS, hostkeys._MERGED_KEYS):
        cache.clear()
    yield
    for cache in (hostkeys._HOST_KEYS, hostkeys._MERGED_KEYS):
        cache.clear()


def test_known_hosts_looked_up_without_the_index_answer_alike(hide, tmp_path):
    keys = [_ed25519(tmp_path, i) for i in range(3)]
    path = str(_known_hosts(tmp_path, "known_hosts", 50, keys))
    fast = compat.host_keys(path)
    assert isinstance(fast, compat.IndexedHostKeys)
    _switched(hide, "indexed_host_keys")
    public = compat.host_keys(path)
    assert type(public) is paramiko.HostKeys
    assert _answers(public) == _answers(fast) and _answers(fast)[0] is not None


@pytest.mark.parametrize("files", [1, 2])
def test_a_client_given_its_own_copy_of_known_hosts_answers_as_the_shared_one(
    hide, tmp_path, fresh_caches, files
):
    keys = [_ed25519(tmp_path, i) for i in range(3)]
    paths = [
        str(_known_hosts(tmp_path, f"known_hosts{i}", 30 + 10 * i, keys[i:] + keys[:i]))
        for i in range(files)
    ]
    paths.append(str(tmp_path / "missing"))  # named in ssh_config, not there: skipped either way
    shared = hostkeys.strict_client(paths)
    # one object, every client
    assert shared.get_host_keys() is hostkeys.strict_client(paths).get_host_keys()
    _switched(hide, "1")
    for cache in (hostkeys._HOST_KEYS, hostkeys._MERGED_KEYS):
        cache.clear()
    own, other = hostkeys.strict_client(paths), hostkeys.strict_client(paths)
    assert own.get_host_keys() is not other.get_host_keys()
    assert _answers(own.get_host_keys()) == _answers(shared.get_host_keys())
    assert isinstance(own, hostkeys.StrictClient)


def test_the_shared_config_refuses_writes_and_without_the_guard_still_reads_alike(hide):
    config = fabconfig._shared_config()
    with pytest.raises(RuntimeError, match="shares one Fabric config"):
        config.connect_kwargs["key_filename"] = "x"
    with pytest.raises(RuntimeError, match="shares one Fabric config"):
        del config.connect_kwargs["key_filename"]
    guarded = (config.user, config.port, config.timeouts.connect, dict(config.connect_kwargs))
    _switched(hide, "shared_config")
    unguarded = fabconfig._shared_config()
    assert (
        unguarded.user,
        unguarded.port,
        unguarded.timeouts.connect,
        dict(unguarded.connect_kwargs),
    ) == guarded
    unguarded.connect_kwargs["key_filename"] = "x"  # Invoke's own write, as with any Config
    assert unguarded.connect_kwargs["key_filename"] == "x"


def test_the_task_parser_off_parses_every_command_line_alike(hide, monkeypatch, capsys):
    from test_client_startup_units import PARSED_ALIKE, _parse

    monkeypatch.chdir(REPO)
    for argv in PARSED_ALIKE:
        monkeypatch.setattr(sys, "argv", argv)
        compat.recheck()
        fast = _parse(argv, capsys)
        _switched(hide, "task_parser")
        assert _parse(argv, capsys) == fast, argv
        hide.delenv(compat.SWITCH)


def test_the_program_name_in_usage_hints_comes_from_invokes_public_binary():
    from invoke.exceptions import ParseError

    from fleetops.cli import Fleet
    from fleetops.fab.executor import FleetExecutor
    from fleetops.fab.usage import usage_exit

    named = Fleet(
        name="fleetops", executor_class=FleetExecutor, config_class=Config, binary="fleet"
    )
    assert "see `fleet --list`" in usage_exit(named, ParseError("No idea what 'x' is!")).message
    unnamed = Program()
    unnamed.argv = ["/usr/lib/python3/site-packages/fabric/__main__.py"]  # python -m fabric
    assert "see `fab --list`" in usage_exit(unnamed, ParseError("No idea what 'x' is!")).message
    # no argv yet
    assert "see `fab --list`" in usage_exit(Program(), ParseError("No idea what 'x' is!")).message


def test_without_quiet_prefetch_a_download_reads_no_ahead_and_the_process_hook_is_left_alone(
    hide, monkeypatch
):
    import threading

    monkeypatch.setenv(compat.SWITCH, "quiet_prefetch")
    compat.recheck()
    before = threading.excepthook
    assert compat.quiet_prefetch_thread() is False
    assert threading.excepthook is before
