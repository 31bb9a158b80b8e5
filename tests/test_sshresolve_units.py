"""plans/sshresolve.py reads `ssh -G` output as OpenSSH meant it. The outputs in
tests/fixtures/ssh_g/ were recorded from OpenSSH 9.2p1 (`ssh -G -F NAME.conf HOST`, the .conf beside
each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetops.plans import sshresolve
from fleetops.plans.sshresolve import Local, Resolved, ResolveError

RECORDED = Path(__file__).parent / "fixtures" / "ssh_g"
LOCAL = Local(user="alice", home="/home/alice", uid=1000, hostname="laptop.corp.example")


def recorded(name: str, word: str) -> Resolved:
    return sshresolve.parse((RECORDED / f"{name}.txt").read_text(), word)


def test_a_proxycommand_read_first_is_the_one_in_force_and_every_field_is_read():
    r = recorded("proxycommand-first", "web1")
    assert (r.hostname, r.user, r.port) == ("web1.example", "ops", 2222)
    assert r.identity_files == ("~/keys/%%h-%p-%n-%L-%r", "/k/second")
    assert r.certificate_files == ("/k/second-cert.pub",) and r.identities_only
    # ProxyJump came later: ignored
    assert r.proxy_command == "ssh -W %h:%p jump" and r.proxy_jump is None
    assert r.known_hosts == ("/kh/one", "/kh/two") and r.connect_timeout == 7


def test_the_tokens_expand_as_ssh_expands_them_when_it_connects():
    got = sshresolve.lookup_dict(recorded("proxycommand-first", "web1"), LOCAL)
    # %% is one literal %, then h; %p the port; %n the word as typed; %L the short local name; %r
    # the user
    assert got["identityfile"] == ["/home/alice/keys/%h-2222-web1-laptop-ops", "/k/second"]
    assert got["proxycommand"] == "ssh -W web1.example:2222 jump"
    assert got["certificatefile"] == ["/k/second-cert.pub"]
    assert (got["hostname"], got["user"], got["port"], got["identitiesonly"]) == (
        "web1.example",
        "ops",
        "2222",
        "yes",
    )
    assert got["userknownhostsfile"] == "/kh/one /kh/two" and got["connecttimeout"] == "7"


def test_ssh_defaults_mean_no_key_named_and_a_jump_list_is_kept_whole():
    r = recorded("defaults-and-jump", "plain")
    assert r.identity_files == () and r.proxy_command is None and r.connect_timeout is None
    got = sshresolve.lookup_dict(r, LOCAL)
    assert (
        "identityfile" not in got
        and got["proxyjump"] == "j1,ops@j2:2200"
        and "proxycommand" not in got
    )
    # ssh's default known_hosts pair, printed from the password database's home: fleetops' own
    # default stands
    assert r.known_hosts == () and "userknownhostsfile" not in got


def test_every_documented_token_and_an_unknown_one():
    r = Resolved(original="Web1", hostname="10.0.0.5", user="ops", port=22, proxy_jump="bastion")
    assert (
        sshresolve.expand("%d|%u|%i|%l|%L|%n|%h|%r|%p|%j|%k|%%", r, LOCAL)
        == "/home/alice|alice|1000|laptop.corp.example|laptop|Web1|10.0.0.5|ops|22|bastion|Web1|%"
    )
    # a sha1: host, port, user and jump in one name
    assert len(sshresolve.expand("%C", r, LOCAL)) == 40
    assert sshresolve.expand("%C", r, LOCAL) != sshresolve.expand(
        "%C", Resolved("Web1", "10.0.0.5", "root", 22, proxy_jump="bastion"), LOCAL
    )
    with pytest.raises(ResolveError, match="unknown token %Q"):
        sshresolve.expand("/k/%Q", r, LOCAL)
    assert sshresolve.expand("~/x", r, LOCAL) == "/home/alice/x"
    assert sshresolve.expand("~/x", r, LOCAL, path=False) == "~/x"


def test_an_answer_that_is_not_a_resolution_is_refused():
    with pytest.raises(ResolveError, match="printed no hostname, port"):
        sshresolve.parse("user ops\n", "h")
    with pytest.raises(ResolveError, match="not a number"):
        sshresolve.parse("user ops\nhostname h\nport x\n", "h")


def test_the_argv_passes_inventory_values_as_options_and_never_a_word_as_an_option():
    assert sshresolve.ssh_g_argv(
        "/usr/bin/ssh", "-oProxyCommand=x", "/c", [("User", "ops"), ("Port", "2")]
    ) == [
        "/usr/bin/ssh",
        "-G",
        "-F",
        "/c",
        "-o",
        "User=ops",
        "-o",
        "Port=2",
        "--",
        "-oProxyCommand=x",
    ]
    assert sshresolve.ssh_g_argv("ssh", "h") == ["ssh", "-G", "--", "h"]


def test_the_fallback_names_each_directive_it_does_not_apply_once():
    text = (
        "# ForwardX11 yes\nHost a\n  HostName b\n  ForwardAgent yes\n  CanonicalizeHostname yes\n"
        "Match exec true\n  ForwardAgent no\n  GSSAPIAuthentication=yes\n  ProxyCommand nc %h %p\n"
    )
    assert sshresolve.not_applied(text) == [
        "ForwardAgent",
        "CanonicalizeHostname",
        "GSSAPIAuthentication",
    ]
