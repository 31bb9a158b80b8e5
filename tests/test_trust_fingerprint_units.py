"""`trust --fingerprint` reads the hash as ssh-keygen prints it, with or without its `SHA256:`
prefix: the bare hash copied from a console names the same key, not a mismatch; anything else stays
as typed (and then matches no key)."""

from __future__ import annotations

import paramiko
import pytest

from fleetops.plans.trustadvice import normalize_fingerprint


@pytest.fixture(scope="module")
def fingerprint() -> str:
    key = paramiko.ECDSAKey.generate()
    assert key.fingerprint.startswith("SHA256:")
    return key.fingerprint


def test_the_bare_hash_and_the_prefixed_one_are_the_same(fingerprint):
    bare = fingerprint.removeprefix("SHA256:")
    for typed in (fingerprint, bare, f" {bare} ", f"sha256:{bare}", f"{bare}=", f"SHA256:{bare}="):
        assert normalize_fingerprint(typed) == fingerprint, typed


@pytest.mark.parametrize(
    "typed", ["SHA256:not-the-right-one", "whatever", "MD5:aa:bb", "SHA256:" + "A" * 42, ""]
)
def test_anything_else_is_kept_as_typed(typed):
    assert normalize_fingerprint(typed) == typed.strip()
    assert normalize_fingerprint(None) is None
