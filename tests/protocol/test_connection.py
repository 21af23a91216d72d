import json

import pytest
from hypothesis import given, settings, strategies as st

from mldserver.protocol import (
    NEED_DATA,
    Checkpoint,
    CheckpointReply,
    Connection,
    ConnectionClosed,
    Dialect,
    Initialize,
    MALFORMED_REPLY,
    LocalProtocolError,
    ProcessRecords,
    RemoteProtocolError,
    State,
    Status,
)

INIT = b'{"action":"initialize","shardId":"shardId-1","sequenceNumber":"TRIM_HORIZON","subSequenceNumber":0}\n'
BATCH = b'{"action":"processRecords","records":[{"data":"YQ==","partitionKey":"k","sequenceNumber":"5","subSequenceNumber":0}],"millisBehindLatest":0}\n'


def events(conn: Connection) -> list:
    out = []
    while (ev := conn.next_event()) is not NEED_DATA:
        out.append(ev)
        if isinstance(ev, ConnectionClosed):
            break
    return out


def answer(conn: Connection, ev) -> bytes:
    return conn.send(ev.reply())


def test_full_lifecycle_fed_whole():
    conn = Connection()
    conn.receive_data(INIT)
    [init] = events(conn)
    assert init == Initialize("shardId-1", "TRIM_HORIZON", 0)
    assert conn.state is State.INITIALIZING and conn.owes_status == "initialize"
    assert answer(conn, init) == b'{"action":"status","responseFor":"initialize"}\n'
    conn.receive_data(BATCH)
    [batch] = events(conn)
    assert conn.state is State.PROCESSING
    assert conn.send(Checkpoint("5", 0)) == b'{"action":"checkpoint","sequenceNumber":"5","subSequenceNumber":0}\n'
    assert conn.state is State.CHECKPOINTING
    conn.receive_data(b'{"action":"checkpoint","sequenceNumber":"5","subSequenceNumber":0,"error":null}\n')
    assert events(conn) == [CheckpointReply("5", 0, None)]
    assert conn.state is State.PROCESSING
    answer(conn, batch)
    conn.receive_data(b'{"action":"shardEnded"}\n')
    [ended] = events(conn)
    assert conn.state is State.ENDING
    conn.send(Checkpoint())
    conn.receive_data(b'{"action":"checkpoint","sequenceNumber":null,"subSequenceNumber":null,"error":null}\n')
    events(conn)
    answer(conn, ended)
    assert conn.state is State.FINISHED
    conn.receive_data(b"")
    assert events(conn) == [ConnectionClosed()]
    assert conn.state is State.CLOSED


def test_byte_by_byte_gives_the_same_events():
    conn = Connection()
    got = []
    for b in INIT:
        conn.receive_data(bytes([b]))
        got += events(conn)
    assert [type(e) for e in got] == [Initialize]


def test_trailing_data_stays_buffered_for_the_next_event():
    conn = Connection()
    conn.receive_data(INIT + BATCH[:10])
    [init] = events(conn)
    answer(conn, init)
    assert conn.buffered == 10
    conn.receive_data(BATCH[10:])
    assert isinstance(events(conn)[0], ProcessRecords)


def test_second_status_is_a_local_error_and_changes_nothing():
    conn = Connection()
    conn.receive_data(INIT)
    [init] = events(conn)
    answer(conn, init)
    with pytest.raises(LocalProtocolError):
        answer(conn, init)
    assert conn.state is State.READY


def test_status_for_the_wrong_action_is_refused():
    conn = Connection()
    conn.receive_data(INIT)
    events(conn)
    with pytest.raises(LocalProtocolError):
        conn.send(Status("processRecords"))
    assert conn.state is State.INITIALIZING


@pytest.mark.parametrize("where", ["initialize", "ready", "leaseLost", "checkpointing"])
def test_checkpoint_where_the_daemon_refuses_it_is_a_local_error(where):
    conn = Connection()
    conn.receive_data(INIT)
    [init] = events(conn)
    if where != "initialize":
        answer(conn, init)
    if where == "leaseLost":
        conn.receive_data(b'{"action":"leaseLost"}\n')
        events(conn)
    if where == "checkpointing":
        conn.receive_data(BATCH)
        events(conn)
        conn.send(Checkpoint())
    before = conn.state
    with pytest.raises(LocalProtocolError):
        conn.send(Checkpoint("5", 0))
    assert conn.state is before


def test_no_status_while_a_checkpoint_is_outstanding():
    conn = Connection()
    conn.receive_data(INIT)
    [init] = events(conn)
    answer(conn, init)
    conn.receive_data(BATCH)
    [batch] = events(conn)
    conn.send(Checkpoint())
    with pytest.raises(LocalProtocolError):
        answer(conn, batch)


def test_out_of_order_action_raises_keeps_state_and_lets_its_status_through_once():
    conn = Connection()
    conn.receive_data(BATCH)
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert info.value.action == "processRecords"
    assert conn.state is State.AWAITING_INITIALIZE
    assert conn.owes_status == "processRecords"
    with pytest.raises(LocalProtocolError):
        conn.send(Status("initialize"))
    assert conn.send(Status("processRecords")) == b'{"action":"status","responseFor":"processRecords"}\n'
    with pytest.raises(LocalProtocolError):
        conn.send(Status("processRecords"))
    conn.receive_data(INIT)
    assert isinstance(conn.next_event(), Initialize)


def test_no_batches_after_shutdown_requested():
    conn = Connection()
    conn.receive_data(INIT)
    answer(conn, conn.next_event())
    conn.receive_data(b'{"action":"shutdownRequested"}\n')
    answer(conn, conn.next_event())
    assert conn.state is State.DRAINING
    conn.receive_data(BATCH)
    with pytest.raises(RemoteProtocolError):
        conn.next_event()
    conn.send(Status("processRecords"))
    conn.receive_data(b'{"action":"leaseLost"}\n')
    answer(conn, conn.next_event())
    assert conn.state is State.FINISHED


def test_unexpected_checkpoint_reply_is_remote_error():
    conn = Connection()
    conn.receive_data(INIT)
    answer(conn, conn.next_event())
    conn.receive_data(b'{"action":"checkpoint","sequenceNumber":"1","error":null}\n')
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert info.value.action is None
    assert conn.owes_status is None


def test_malformed_batch_owes_its_status():
    conn = Connection()
    conn.receive_data(INIT)
    answer(conn, conn.next_event())
    conn.receive_data(b'{"action":"processRecords","records":"oops"}\n')
    with pytest.raises(RemoteProtocolError):
        conn.next_event()
    assert conn.owes_status == "processRecords"
    conn.send(Status("processRecords"))
    assert conn.state is State.READY


def test_kcl1_shutdown_terminate_answers_shutdown():
    conn = Connection()
    conn.receive_data(b'{"action":"initialize","shardId":"s"}\n')
    answer(conn, conn.next_event())
    assert conn.dialect is Dialect.V1
    conn.receive_data(b'{"action":"shutdown","reason":"TERMINATE"}\n')
    ev = conn.next_event()
    assert conn.state is State.ENDING
    assert conn.send(Checkpoint("9", 0)) == b'{"action":"checkpoint","checkpoint":"9"}\n'
    conn.receive_data(b'{"action":"checkpoint","checkpoint":"9","error":null}\n')
    conn.next_event()
    assert answer(conn, ev) == b'{"action":"status","responseFor":"shutdown"}\n'


def test_eof_mid_conversation_closes():
    conn = Connection()
    conn.receive_data(INIT + b'{"action":"lea')
    conn.next_event()
    conn.receive_data(b"")
    assert conn.next_event() == ConnectionClosed()
    assert conn.state is State.CLOSED


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=20))
def test_random_bytes_never_crash_the_core(chunks):
    conn = Connection(max_line_size=256)
    for chunk in chunks:
        conn.receive_data(chunk)
        while True:
            try:
                ev = conn.next_event()
            except RemoteProtocolError as exc:
                if exc.action is not None:
                    conn.send(Status(exc.action))
                continue
            if ev is NEED_DATA or isinstance(ev, ConnectionClosed):
                break
            if hasattr(ev, "reply"):
                conn.send(ev.reply())


ACTIONS = [
    b'{"action":"initialize","shardId":"s","sequenceNumber":null}',
    b'{"action":"processRecords","records":[]}',
    b'{"action":"shutdownRequested"}',
    b'{"action":"leaseLost"}',
    b'{"action":"shardEnded"}',
    b'{"action":"shutdown","reason":"ZOMBIE"}',
    b'{"action":"checkpoint","sequenceNumber":null,"error":null}',
    b'{"action":"bogus"}',
    b"junk",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(ACTIONS), max_size=25))
def test_any_sequence_of_daemon_lines_keeps_one_status_per_action(lines):
    conn = Connection()
    for line in lines:
        conn.receive_data(line + b"\n")
        try:
            ev = conn.next_event()
        except RemoteProtocolError as exc:
            reply = Status(exc.action) if exc.action is not None else None
        else:
            reply = ev.reply() if hasattr(ev, "reply") else None
        # A status is owed exactly for an action line, accepted or not; never for junk.
        assert conn.owes_status == (reply.response_for if reply else None)
        if reply is not None:
            conn.send(reply)
            assert conn.owes_status is None
            with pytest.raises(LocalProtocolError):  # one status per action, not two
                conn.send(reply)
        assert conn.owes_status is None


# -- issue 10: the reply settles the checkpoint, whatever it looks like; only actions are owed


def checkpointing() -> Connection:
    conn = Connection()
    conn.receive_data(INIT)
    conn.send(conn.next_event().reply())
    conn.receive_data(BATCH)
    conn.next_event()
    conn.send(Checkpoint("5", 0))
    assert conn.state is State.CHECKPOINTING
    return conn


@pytest.mark.parametrize("reply", [
    b'{"action":"checkpoint","sequenceNumber":{"not":"a string"},"subSequenceNumber":0,"error":null}',
    b'{"action":"checkpoint","sequenceNumber":"5","subSequenceNumber":"x","error":null}',
    b"{not json",
    b"[1,2]",
], ids=["sequence_number_object", "sub_sequence_text", "not_json", "not_an_object"])
def test_a_malformed_reply_settles_the_checkpoint_as_failed_and_owes_nothing(reply):
    conn = checkpointing()
    conn.receive_data(reply + b"\n")
    event = conn.next_event()
    assert isinstance(event, CheckpointReply) and event.error == MALFORMED_REPLY and event.malformed
    assert conn.state is State.PROCESSING and conn.owes_status == "processRecords"
    assert conn.send(Status("processRecords")) == b'{"action":"status","responseFor":"processRecords"}\n'
    with pytest.raises(LocalProtocolError):
        conn.send(Status("checkpoint"))


def test_an_over_long_reply_settles_the_checkpoint_as_failed():
    conn = Connection(max_line_size=160)
    conn.receive_data(INIT)
    conn.send(conn.next_event().reply())
    conn.receive_data(BATCH)
    conn.next_event()
    conn.send(Checkpoint("5", 0))
    conn.receive_data(b'{"action":"checkpoint","sequenceNumber":"' + b"9" * 200 + b'","error":null}\n')
    event = conn.next_event()
    assert isinstance(event, CheckpointReply) and event.error == MALFORMED_REPLY
    assert conn.state is State.PROCESSING


def test_a_malformed_checkpoint_line_outside_a_checkpoint_is_never_owed_a_status():
    conn = Connection()
    conn.receive_data(INIT)
    conn.send(conn.next_event().reply())
    conn.receive_data(b'{"action":"checkpoint","sequenceNumber":{},"error":null}\n')
    with pytest.raises(RemoteProtocolError) as caught:
        conn.next_event()
    assert caught.value.action is None and conn.owes_status is None and conn.state is State.READY


def test_an_over_long_action_owes_its_status_and_is_handed_out_whole():
    conn = Connection(max_line_size=160)
    conn.receive_data(INIT)
    conn.send(conn.next_event().reply())
    line = b'{"action":"processRecords","records":[{"data":"' + b"A" * 400 + b'"}],"millisBehindLatest":0}'
    conn.receive_data(line[:100])
    assert conn.next_event() is NEED_DATA
    conn.receive_data(line[100:300])
    with pytest.raises(RemoteProtocolError) as caught:
        conn.next_event()
    assert caught.value.too_long and caught.value.action == "processRecords"
    assert conn.owes_status == "processRecords"
    kept = []
    chunk, done = conn.overflow()
    kept.append(chunk)
    assert not done
    conn.receive_data(line[300:] + b"\r\n" + BATCH)
    chunk, done = conn.overflow()
    kept.append(chunk)
    assert done and b"".join(kept) == line
    assert conn.send(Status("processRecords"))
    assert isinstance(conn.next_event(), ProcessRecords)  # the next line still frames


def test_an_over_long_line_naming_no_action_owes_nothing():
    conn = Connection(max_line_size=160)
    conn.receive_data(INIT)
    conn.send(conn.next_event().reply())
    conn.receive_data(b'{"padding":"' + b"x" * 400 + b'"}\n')
    with pytest.raises(RemoteProtocolError) as caught:
        conn.next_event()
    assert caught.value.action is None and conn.owes_status is None


# -- issue 52: a line that does not parse is answered when it names its action, flagged when it names none


@pytest.mark.parametrize("line, owed", [
    (b'{"action":"processRecords","records":[{"data":"eA=="} cut short', "processRecords"),
    (b'{"action": "leaseLost"', "leaseLost"),
    (b'{"action":"checkpoint","sequenceNumber":"5"', None),  # a reply is never owed a status
    (b'{"records":[{"data":"eA==","action":"record"}]', None),  # a record's "action" is not the line's
    (b"this is not json", None),
    (b"[1,2]", None),
    (b'{"action":5}', None),
], ids=["batch_cut_short", "lease_lost_cut_short", "reply_cut_short", "record_action", "junk", "array", "number"])
def test_a_line_that_does_not_parse_owes_the_status_of_the_action_it_names(line, owed):
    conn = Connection()
    conn.receive_data(INIT)
    conn.send(conn.next_event().reply())
    conn.receive_data(line + b"\n")
    with pytest.raises(RemoteProtocolError) as caught:
        conn.next_event()
    assert caught.value.action == owed and conn.owes_status == owed and conn.state is State.READY
    assert caught.value.names_no_action == (owed is None and b'"checkpoint"' not in line)
    if owed is not None:
        assert conn.send(Status(owed)) == b'{"action":"status","responseFor":"%s"}\n' % owed.encode()
        assert conn.owes_status is None


def test_the_modules_example_runs():
    import doctest

    from mldserver.protocol import connection

    failures, tried = doctest.testmod(connection, optionflags=doctest.ELLIPSIS)
    assert tried and not failures
