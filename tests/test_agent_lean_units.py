"""The agent's string parsers (requirements, release numbers, upload and cache file names, RECORD
digests) give the very answers of the regular expressions and base64 decoding they replace, on the
same inputs."""

from __future__ import annotations

import base64
import hashlib
import re

from remote_scripts.checks import checks
from remote_scripts.core import statetrust
from remote_scripts.patch.wheelrecord import record_sha256


# ---------------------------------------------------------------- string parsers = the regexes they
# replace
def test_upload_temp_names_and_cache_names_are_judged_as_the_regular_expressions_did():
    upload = re.compile(r"^fleetops-agent-[0-9a-f]+\.pyz\.[0-9a-f]{8}\.tmp$")
    module = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,200}")
    names = [
        "fleetops-agent-0a1b.pyz.0123abcd.tmp",
        "fleetops-agent-.pyz.0123abcd.tmp",
        "fleetops-agent-0a1b.pyz.0123abc.tmp",
        "fleetops-agent-0A1B.pyz.0123abcd.tmp",
        "fleetops-agent-0a1b.pyz.0123abcd.tmpx",
        "fleetops-agent-0a1b.pyz",
        "x.pyz.0123abcd.tmp",
        "fleetops-agent-0a.pyz.1b.pyz.0123abcd.tmp",
        "speculators.data_generation.x",
        "_a",
        "9a",
        "a/b",
        "a" * 201,
        "a" * 202,
        "",
        "é",
        "a-b",
    ]
    for name in names:
        assert statetrust.is_upload_tmp(name) is bool(upload.match(name)), name
        assert checks._fit_for_a_file_name(name) is bool(module.fullmatch(name)), name
    # The one intended difference: the regex's `$` also matched before a final newline. No upload
    # names a file so, and the string test leaves a file of that name alone.
    odd = "fleetops-agent-0a1b.pyz.0123abcd.tmp\n"
    assert upload.match(odd) and not statetrust.is_upload_tmp(odd)


def test_a_record_digest_decodes_as_base64_did(tmp_path):
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    # RECORD's digests are urlsafe and unpadded: a content whose digest has both of urlsafe's own
    # characters
    content = next(
        b"x = %d\n" % i
        for i in range(10000)
        if {"-", "_"}
        <= set(base64.urlsafe_b64encode(hashlib.sha256(b"x = %d\n" % i).digest()).decode())
    )
    (site / "pkg" / "m.py").write_bytes(content)
    digest = hashlib.sha256(content).digest()
    b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    (site / "pkg-1.0.dist-info").mkdir()
    (site / "pkg-1.0.dist-info" / "RECORD").write_text(f"pkg/m.py,sha256={b64},300\n")
    assert record_sha256(str(site), str(site / "pkg" / "m.py"))[0] == digest.hex()
