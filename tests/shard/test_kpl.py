"""The KPL decoder against every vector of tests/data/kpl-vectors.json (checked
against the real KCL's AggregatorUtil)."""

import base64
import json

import pytest

from mldserver.shard.kpl import deaggregate

from ..conftest import DATA

VECTORS = json.loads((DATA / "kpl-vectors.json").read_text())["vectors"]


def as_expected(users):
    return [
        {
            "sub_sequence_number": u.sub_sequence_number,
            "aggregated": u.aggregated,
            "partition_key": u.partition_key,
            "explicit_hash_key": u.explicit_hash_key,
            "data_b64": base64.b64encode(u.data).decode(),
        }
        for u in users.records
    ]


def strip(expected):
    keys = ("sub_sequence_number", "aggregated", "partition_key", "explicit_hash_key", "data_b64")
    return [{k: e[k] for k in keys} for e in expected]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vector(vector):
    rec = vector["kinesis_record"]
    data = base64.b64decode(rec["data_b64"])
    users = deaggregate(data, rec["partition_key"], rec["explicit_hash_key"])
    expected = vector.get("expected_user_records_full_range", vector["expected_user_records"])
    assert as_expected(users) == strip(expected)
    assert users.aggregated == vector["is_aggregated"]
    for user, exp in zip(users.records, expected):
        if "effective_hash_key" in exp:
            assert str(user.effective_hash_key) == exp["effective_hash_key"]
    if "shard_hash_key_range" in vector:
        r = vector["shard_hash_key_range"]
        ranged = deaggregate(data, rec["partition_key"], rec["explicit_hash_key"],
                             (int(r["starting_hash_key"]), int(r["ending_hash_key"])))
        assert as_expected(ranged) == strip(vector["expected_user_records"])


def test_bad_table_index_reports_an_error_so_the_original_can_be_kept():
    vector = next(v for v in VECTORS if v["name"] == "agg_bad_partition_key_index")
    users = deaggregate(base64.b64decode(vector["kinesis_record"]["data_b64"]), "only-pk")
    assert users.error and len(users.records) == 1
