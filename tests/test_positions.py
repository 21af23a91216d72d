"""The position type: parsed once from the daemon's strings, ordered as integers,
written to files in one JSON form."""

from __future__ import annotations

import orjson
import pytest

from mldserver.base.positions import Position

LONG = "49590338271490256608559692538361571095921575989136588898"


def test_a_sequence_number_keeps_its_exact_digits_and_compares_as_an_integer():
    p = Position.parse(LONG, 3)
    assert (p.seq, p.sub, p.text) == (int(LONG), 3, LONG)
    padded = Position.parse("000000000000000000028")
    assert padded.seq == 28 and padded.text == "000000000000000000028"
    assert Position.parse("9") < Position.parse("10") < Position.parse("10", 1) < Position.parse(LONG)
    assert max([Position.parse("10", 1), Position.parse("9", 7)]) == Position(10, 1, "10")


def test_a_missing_sub_sequence_number_counts_as_zero():
    assert Position.parse("7") == Position.parse("7", None) == Position(7, 0, "7")


@pytest.mark.parametrize("value", ["TRIM_HORIZON", "LATEST", "AT_TIMESTAMP", "SHARD_END", "", "12x", " 12", "12 ",
                                   "+12", "-12", "1_2", "1 2", "\u0661\u0662", None, 12, 1.5, ["12"]])
def test_what_is_not_digits_is_no_position(value):
    assert Position.parse(value, 0) is None


@pytest.mark.parametrize("sub", [-1, "0", 1.0, True])
def test_a_sub_sequence_number_must_be_a_non_negative_int(sub):
    assert Position.parse("12", sub) is None


def test_the_json_form_round_trips_and_refuses_anything_else():
    p = Position.parse(LONG, 2)
    assert p.to_json() == [LONG, 2]
    assert Position.from_json(orjson.loads(orjson.dumps(p.to_json()))) == p
    assert Position.from_json([LONG, None]) == Position(int(LONG), 0, LONG)
    for bad in [[LONG], ["x", 0], {"seq": LONG}, LONG, None, [int(LONG), 0]]:
        with pytest.raises(ValueError, match="not a position"):
            Position.from_json(bad)


def test_its_repr_shows_the_daemons_form():
    assert repr(Position.parse("42", 1)) == "Position('42', 1)"


def test_a_batch_parses_as_each_value_would_alone():
    texts = ["7", "8", LONG, "000000000000000000028"]
    assert Position.parse_all(texts, [0, None, 0, None]) == [Position.parse(t) for t in texts]
    odd = ["7", "8x", "", 9, "10", "11", "12"]
    subs = [0, 0, 0, 0, 3, False, -1]
    assert Position.parse_all(odd, subs) == [Position.parse(t, s) for t, s in zip(odd, subs)]
    assert Position.parse_all(odd, subs) == [Position(7, 0, "7"), None, None, None, Position(10, 3, "10"), None, None]
    assert Position.parse_all([], []) == []


def test_a_batch_of_usual_values_makes_each_position_when_read_and_answers_as_the_parsed_list():
    import bisect
    import sys

    from mldserver.base.positions import Positions

    texts = ["7", "8", "000000000000000000028", LONG]
    lazy = Position.batch(texts, [0, None, 0, None])
    parsed = Position.parse_all(texts, [0, None, 0, None])
    assert type(lazy) is Positions and len(lazy) == 4
    assert list(lazy) == parsed and lazy[1:3] == parsed[1:3] and lazy[-1] == parsed[-1]
    assert None not in lazy and Position(28, 0, "000000000000000000028") in lazy and Position(28, 0, "28") not in lazy
    assert [bisect.bisect_right(lazy, p) for p in parsed] == [1, 2, 3, 4]
    with pytest.raises(IndexError):
        lazy[4]
    # anything unusual is parsed at once, as parse_all does: a sub-record, a bad value, a huge number
    odd = ["7", "8x", "9"]
    assert Position.batch(odd, [0, 0, 0]) == [Position(7, 0, "7"), None, Position(9, 0, "9")]
    assert Position.batch(["7", "8"], [0, 2]) == [Position(7, 0, "7"), Position(8, 2, "8")]
    assert Position.batch(["7", "8"], [0, False]) == [Position(7, 0, "7"), None]
    huge = "9" * (sys.get_int_max_str_digits() + 1)
    assert Position.batch(["7", huge], [0, 0]) == [Position(7, 0, "7"), None]
    assert Position.batch([], []) == []
    assert Position.batch(["7", "8"], [[1], {}]) == Position.parse_all(["7", "8"], [[1], {}]) == [None, None]


def test_a_batchs_positions_are_one_string_sliced_into_strings_of_their_own():
    import sys

    from mldserver.base.positions import Positions

    same = [str(10**55 + i) for i in range(1000)]  # 56 digits each, as Kinesis writes them
    positions = Position.batch(same, [0] * 1000)
    assert type(positions) is Positions and positions.width == 56 and positions.ends is None
    assert list(positions) == Position.parse_all(same, [0] * 1000)
    assert positions.nbytes() < 60 * 1000 < sum(map(sys.getsizeof, same))  # a string each: 105 bytes
    piece = positions.sliced(10, 20)
    assert list(piece) == list(positions)[10:20] and piece.joined is not positions.joined
    mixed = Position.batch(["7", "80", "900"], [0, 0, 0])
    assert (mixed.width, list(mixed.ends)) == (0, [0, 1, 3, 6])
    assert list(mixed.sliced(1, 3)) == [Position(80, 0, "80"), Position(900, 0, "900")]
    assert list(mixed.sliced(1, 3).ends) == [0, 2, 5]
