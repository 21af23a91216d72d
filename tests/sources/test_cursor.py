"""A shard's lag after a page: the service's word where it has one (Kinesis's
MillisBehindLatest), else the age of the last change read (DynamoDB Streams), 0 after an
empty page."""

from __future__ import annotations

from mldserver.sources.cursor import lag_ms
from mldserver.sources.service import Page

T = 1769767200000


def page(*times, read=None, behind=None) -> Page:
    records = [{"sequenceNumber": str(i + 1), "approximateArrivalTimestamp": t} for i, t in enumerate(times)]
    return Page(records, len(records) if read is None else read, "iterator", behind)


def test_kinesis_lag_is_its_millis_behind_latest():
    assert lag_ms(page(T, behind=5200), True, now_ms=T + 60_000) == 5200
    assert lag_ms(page(behind=0), True) == 0


def test_dynamodb_lag_is_the_age_of_the_last_change_read_and_0_at_the_head():
    assert lag_ms(page(T - 900, T - 250, behind=0), False, now_ms=T) == 250
    assert lag_ms(page(behind=0), False, now_ms=T) == 0  # nothing more to read
    assert lag_ms(page(T + 10), False, now_ms=T) == 0  # a clock behind the service's: never negative


def test_a_page_whose_records_were_all_skipped_still_counts_its_last_one():
    skipped = page(T - 400)._replace(records=[])  # (read 1: the cursor's own filtering comes later)
    assert lag_ms(skipped, False, now_ms=T) is None
