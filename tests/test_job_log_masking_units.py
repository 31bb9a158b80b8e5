"""The node masks a job's secret values in what tail and logs send before it cuts a long line (its
first and last 4 KiB): a value across the cut is masked whole, never shown in part; the node's own
code, run in-process."""

from __future__ import annotations

import io

import pytest

from remote_scripts.jobs import tail

SECRET = "SECRETpart1-SECRETpart2-SECRETpart3"


def pieces(text: str, secret: str = SECRET, size: int = 6) -> list[str]:
    """Every run of `size` characters of the secret that shows in `text`."""
    return sorted(
        {
            secret[i : i + size]
            for i in range(len(secret) - size + 1)
            if secret[i : i + size] in text
        }
    )


def log(*lines: bytes) -> io.BytesIO:
    return io.BytesIO(b"".join(lines))


@pytest.mark.parametrize(
    "before", [tail.LINE_KEEP - 30, tail.LINE_KEEP - 1, tail.LINE_KEEP - len(SECRET)]
)
def test_a_secret_across_the_head_cut_is_masked_whole(before):
    # Quote: "a secret across the cut shows 30 of 35 characters".
    f = log(
        b"A" * before + SECRET.encode() + b"B" * 20000 + b"\n", f"short line: {SECRET}\n".encode()
    )
    size = len(f.getvalue())
    data, end = tail._tail_read(f, 0, size, True, tail.Masker([SECRET]))
    text = data.decode()
    assert end == size and pieces(text) == [], text[4000:4200]
    assert "bytes of this" in text and "short line: [secret]" in text


def test_a_secret_across_the_end_cut_and_in_a_line_longer_than_a_chunk_is_masked_whole():
    line = b"A" * (tail.TAIL_CHUNK + 10) + SECRET.encode() + b"B" * (tail.LINE_KEEP - 20) + b"\n"
    f = log(line)
    data, _ = tail._tail_read(f, 0, len(line), True, tail.Masker([SECRET]))
    assert (
        pieces(data.decode()) == []
        and b"[secret]"[:3] in data
        and data.endswith(b"B" * 100 + b"\n")
    )
    head = SECRET.encode() + b"B" * 20000  # and at the very start of a line
    data, _ = tail._tail_read(
        log(b"x" * (tail.LINE_KEEP - 3) + head + b"\n"),
        0,
        tail.LINE_KEEP + len(head) - 2,
        True,
        tail.Masker([SECRET]),
    )
    assert pieces(data.decode()) == []


@pytest.mark.parametrize("written", [6, 20, len(SECRET) - 1])
def test_a_long_line_still_being_written_shows_no_part_of_a_secret_at_either_answer(written):
    # the job has written part of it yet
    growing = b"A" * (tail.TAIL_CHUNK + 100) + SECRET[:written].encode()
    mask = tail.Masker([SECRET])
    first, offset = tail._tail_read(log(growing), 0, len(growing), False, mask)
    assert pieces(first.decode()) == [] and offset == len(growing) - written, first[-200:]
    for more in (b"", b"B" * 100, b"B" * 30000):  # then the rest: at once, a little, a lot
        rest = growing + SECRET[written:].encode() + more + b"\n"
        second, _ = tail._tail_read(log(rest), offset, len(rest), True, mask)
        assert pieces(second.decode()) == [] and (
            b"[secret]" in second or len(more) > tail.LINE_KEEP
        ), second[:200]


def test_the_mask_list_is_bounded_and_short_values_are_not_masked():
    masker = tail.Masker(
        ["abc", "x" * (tail.MASK_VALUE_MAX + 1), 7, *[f"value{i:04d}" for i in range(1000)]]
    )
    assert len(masker.values) == tail.MASK_VALUES - 3 and masker.reach == len("value0000") - 1
    assert tail.Masker(None)(b"abc") == b"abc"
