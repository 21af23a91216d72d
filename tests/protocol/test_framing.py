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


def write_in_place(buf: LineBuffer, data: bytes, step: int) -> list[bytearray]:
    """``data`` written as a BufferedProtocol's reads write it: into what ``get_buffer``
    lends, ``step`` bytes a read at most; the buffers written into, in order."""
    owners, at = [], 0
    while at < len(data):
        with buf.get_buffer(-1) as view:
            n = min(len(view), step, len(data) - at)
            view[:n] = data[at : at + n]
            owners.append(view.obj)
        buf.buffer_updated(n)
        at += n
    return owners


def test_a_long_line_fed_in_many_pieces_comes_out_whole():
    buf = LineBuffer()
    line = b"y" * 100_000
    for i in range(0, len(line), 4096):
        buf.feed(line[i : i + 4096])
    buf.feed(b"\r\n")
    got = buf.next_line()
    assert got == line and buf.pending == 0


def test_a_long_line_written_in_place_leaves_as_the_buffer_it_was_written_into():
    buf = LineBuffer()
    line = bytes(range(14, 256)) * 850  # 205,700 bytes with no line end: past the first buffer
    owners = write_in_place(buf, line + b"\r\n{\"act", 65536)
    got = buf.next_line()
    assert got == line and got is owners[-1]  # the last buffer written into, cut to the line
    assert buf.pending == 5 and buf.peek(10) == b'{"act'
    # the next line of that size starts in a small buffer and moves once, to one it fits
    owners = write_in_place(buf, b'ion":1}' + line + b"\n", 65536)
    assert len({id(o) for o in owners}) == 2
    assert buf.next_line() == b'{"action":1}' + line


def test_an_over_long_line_taken_in_pieces_as_it_is_written_in_place_keeps_the_buffer_small():
    """``overflow()`` hands out what arrived; the buffer it leaves behind is reused at
    its size, however long the line goes on (not doubled each time it fills)."""
    buf = LineBuffer(max_line_size=1000)
    piece = b"z" * 40_000 + b"\r"  # each piece ends in a \r: maybe the line's end, kept back
    taken, sizes, raised = 0, set(), 0
    for _ in range(100):  # 4 MB
        sizes.update(len(o) for o in write_in_place(buf, piece, 65536))
        if not buf.overflowing:
            with pytest.raises(LineTooLong):
                buf.next_line()
            raised += 1
        chunk, done = buf.overflow()
        assert not done
        taken += len(chunk)
    write_in_place(buf, b"\nok\n", 65536)
    chunk, done = buf.overflow()
    assert done and taken + len(chunk) == 100 * len(piece) - 1 and raised == 1
    assert buf.next_line() == b"ok"
    assert max(sizes) <= 2 * 65536


def test_short_lines_leave_as_bytes_and_the_buffer_is_reused():
    buf = LineBuffer()
    owners = write_in_place(buf, b'{"action":"status"}\n', 7)
    owners += write_in_place(buf, b'{"action":"leaseLost"}\n', 7)
    assert lines_of(buf) == [b'{"action":"status"}', b'{"action":"leaseLost"}']
    assert all(type(line) is bytes for line in [buf.peek(1)])
    assert len({id(o) for o in owners}) == 1


@given(
    st.lists(st.tuples(st.integers(0, 150_000), st.sampled_from([b"\n", b"\r\n", b"\n\n", b" \n"])), max_size=4),
    st.integers(1000, 90_000),
    st.booleans(),
)
def test_any_reads_of_long_lines_in_place_or_fed_give_the_lines_split_at_newline(lines, step, in_place):
    data = b"".join(bytes([65 + i]) * size + end for i, (size, end) in enumerate(lines))
    buf = LineBuffer()
    if in_place:
        write_in_place(buf, data, step)
    else:
        for i in range(0, len(data), step):
            buf.feed(data[i : i + step])
    expected = [line[:-1] if line.endswith(b"\r") else line for line in data.split(b"\n")[:-1]]
    assert lines_of(buf) == [line for line in expected if line.strip()]
    assert buf.pending == 0
