from hypothesis import given, strategies as st
import pytest

from mldserver.protocol.framing import LineBuffer, LineTooLong


def lines_of(buf: LineBuffer) -> list[bytes]:
    out = []
    while (line := buf.next_line()) is not None:
        out.append(line)
    return out


def test_splits_on_newline_only_and_keeps_unicode_line_separators():
    buf = LineBuffer()
    payload = '{"partitionKey":"a\u2028b\u0085c\x0bd"}'.encode()
    buf.feed(payload + b"\n")
    assert lines_of(buf) == [payload]


def test_strips_exactly_one_trailing_cr_and_skips_blank_lines():
    buf = LineBuffer()
    buf.feed(b"\n\r\n  \none\r\r\ntwo\n")
    assert lines_of(buf) == [b"one\r", b"two"]


def test_partial_line_waits_for_its_end():
    buf = LineBuffer()
    buf.feed(b'{"action":')
    assert buf.next_line() is None
    buf.feed(b'"leaseLost"}\n{"act')
    assert buf.next_line() == b'{"action":"leaseLost"}'
    assert buf.next_line() is None
    assert buf.pending == 5


def test_line_longer_than_the_limit_raises_once_and_is_skipped():
    buf = LineBuffer(max_line_size=10)
    buf.feed(b"0123456789ABCDEF")
    with pytest.raises(LineTooLong) as info:
        buf.next_line()
    assert info.value.prefix.startswith(b"0123456789")
    assert "max_line_size" in str(info.value)
    buf.feed(b"GHIJ\nok\n")
    assert lines_of(buf) == [b"ok"]


def test_lines_far_above_asyncio_64k_limit_are_fine():
    buf = LineBuffer()
    big = b"x" * (20 * 1024 * 1024)
    for i in range(0, len(big), 65536):
        buf.feed(big[i : i + 65536])
        assert buf.next_line() is None
    buf.feed(b"\n")
    assert buf.next_line() == big


@given(st.lists(st.binary(max_size=30).filter(lambda b: b"\n" not in b), max_size=8), st.integers(1, 7))
def test_any_chunking_gives_the_same_lines(parts, step):
    data = b"".join(p + b"\n" for p in parts)
    whole = LineBuffer()
    whole.feed(data)
    chunked = LineBuffer()
    got = []
    for i in range(0, len(data), step):
        chunked.feed(data[i : i + step])
        got += lines_of(chunked)
    assert got == lines_of(whole)


@given(st.lists(st.sampled_from([b"a", b"bc", b"\r", b"\n", b" ", b"\r\n", b"xyz" * 5]), max_size=30), st.integers(1, 9))
def test_any_chunking_of_line_ends_blanks_and_carriage_returns_gives_the_lines_split_at_newline(pieces, step):
    data = b"".join(pieces)
    expected = [line[:-1] if line.endswith(b"\r") else line for line in data.split(b"\n")[:-1]]
    buf = LineBuffer()
    got = []
    for i in range(0, len(data), step):
        buf.feed(data[i : i + step])
        got += lines_of(buf)
    assert got == [line for line in expected if line.strip()]
    assert buf.pending == len(data) - (data.rfind(b"\n") + 1)


def test_a_long_line_fed_in_many_pieces_comes_out_whole_as_bytes():
    buf = LineBuffer()
    line = b"y" * 100_000
    for i in range(0, len(line), 4096):
        buf.feed(line[i : i + 4096])
    buf.feed(b"\r\n")
    got = buf.next_line()
    assert type(got) is bytes and got == line and buf.pending == 0
