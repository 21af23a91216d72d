"""The arguments of timers.create and cancel: each mistake is a TimerError that names
the timer, what was wrong and what to do, and is counted; a callback is stored by a
name it can be found again by."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

import mldserver
from mldserver.timers import api
from mldserver.timers.api import TimerError, callback_name, due_ms, encode_context, prepare, resolve
from mldserver.timers.store import Timer

from .. import timer_handlers


async def local_callback(context):
    pass


def not_async(context):
    pass


class Holder:
    async def method(self, context):
        pass


def test_a_callback_is_stored_by_its_module_and_name():
    assert callback_name(timer_handlers.fired) == "tests.timer_handlers:fired"
    assert callback_name("tests.timer_handlers:fired") == "tests.timer_handlers:fired"
    assert resolve("tests.timer_handlers:fired") is timer_handlers.fired


def test_callbacks_that_cannot_be_found_again_are_refused():
    async def nested(context):
        pass

    with pytest.raises(TimerError, match="top level of its module"):
        callback_name(nested)
    with pytest.raises(TimerError, match="top level of its module"):
        callback_name(Holder().method)
    with pytest.raises(TimerError, match="must be an async function"):
        callback_name(not_async)
    with pytest.raises(TimerError, match="must be an async function"):
        callback_name(lambda context: None)
    with pytest.raises(TimerError, match='Could not import module "tests.nowhere"'):
        callback_name("tests.nowhere:fired")
    with pytest.raises(TimerError, match="must be an async function"):
        callback_name("tests.timers.test_api:not_async")


def test_a_callback_whose_name_now_names_another_object_is_refused(monkeypatch):
    async def impostor(context):
        pass

    impostor.__module__, impostor.__qualname__ = __name__, "local_callback"
    with pytest.raises(TimerError, match="names another object"):
        callback_name(impostor)


def test_at_is_an_aware_datetime_or_epoch_seconds_rounded_up():
    at = datetime(2025, 11, 21, 10, 0, 0, 123456, tzinfo=timezone.utc)
    assert due_ms(at) == 1_763_719_200_124  # .123456 s: fires at or after, never before
    assert due_ms(at.astimezone(timezone(timedelta(hours=2)))) == 1_763_719_200_124
    assert due_ms(1_763_719_200) == 1_763_719_200_000
    assert due_ms(1_763_719_200.0001) == 1_763_719_200_001
    assert due_ms(0) == 0


@pytest.mark.parametrize(("at", "message"), [
    (datetime(2026, 11, 21, 10, 0), "naive datetime: say which time zone"),
    ("2026-11-21T10:00:00Z", "must be a datetime or epoch seconds"),
    (True, "must be a datetime or epoch seconds"),
    (None, "must be a datetime or epoch seconds"),
    (math.nan, "out of range"),
    (math.inf, "out of range"),
    (-1, "out of range"),
    (10**12, "out of range"),
])
def test_a_bad_at_is_refused(at, message):
    with pytest.raises(TimerError, match=message):
        due_ms(at, "order-7")


def test_context_is_json_within_the_cap():
    assert encode_context({"order": 7}, 1024) == b'{"order":7}'
    assert encode_context(None, 1024) == b"null"
    with pytest.raises(TimerError, match=r"timer 'order-7': context is 1035 bytes of JSON, over timer_context_size "
                                         r"\(1024 bytes\): keep a key in it"):
        encode_context({"blob": "x" * 1024}, 1024, "order-7")
    with pytest.raises(TimerError, match="context is not JSON"):
        encode_context({"set": {1, 2}}, 1024, "order-7")


@pytest.mark.parametrize("reference", ["", None, 7, "x" * 1025])
def test_a_bad_reference_is_refused(reference):
    with pytest.raises(TimerError, match="reference"):
        prepare(timer_handlers.fired, 0, reference, None, 1024)


class Counting(api.Timers):
    def __init__(self):
        super().__init__(64)
        self.stored, self.refusals = [], []

    async def write(self, ops):
        self.stored.extend(op for op in ops if isinstance(op, Timer))
        return [True for op in ops if not isinstance(op, Timer)]

    async def _refused(self, error):
        self.refusals.append(error)


async def test_a_refused_create_is_counted_and_stores_nothing():
    timers = Counting()
    with pytest.raises(TimerError, match="over timer_context_size"):
        await timers.create(timer_handlers.fired, 0, "r", {"x": "y" * 100})
    await timers.create(timer_handlers.fired, 1.5, "r", {"x": 1})
    assert len(timers.refusals) == 1
    assert [(t.callback, t.reference, t.due_ms, t.context) for t in timers.stored] == [
        ("tests.timer_handlers:fired", "r", 1500, b'{"x":1}')]


async def test_the_module_functions_need_a_server_or_handler_process():
    with pytest.raises(TimerError, match="in handlers and timer callbacks"):
        await mldserver.timers.create(timer_handlers.fired, 0, "r")
    timers = Counting()
    token = api.current.set(timers)
    try:
        await mldserver.timers.create(timer_handlers.fired, 0, "r")
        assert await mldserver.timers.cancel(timer_handlers.fired, "r") is True
    finally:
        api.current.reset(token)
    assert len(timers.stored) == 1


def test_handler_timers_is_the_contexts():
    class Plain(mldserver.Handler):
        pass

    class Context:
        timers = Counting()

    assert Plain(Context()).timers is Context.timers

    class Changes(mldserver.ChangeHandler):  # change handlers get them too
        async def on_update(self, doc, meta):
            pass

    assert Changes(Context()).timers is Context.timers
    with pytest.raises(mldserver.ConfigError, match="super\\(\\).__init__\\(context\\)"):
        Plain(object()).timers
