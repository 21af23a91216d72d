"""The balancing rule: free and expired leases taken up to ceil(shards / live servers),
one steal a cycle from the server that holds the most, a fleet that settles without a
shard going round."""

from __future__ import annotations

from mldserver.sources.balance import Plan, plan

SHARDS = [f"s{i}" for i in range(4)]


def test_a_lone_server_takes_every_free_lease():
    assert plan(dict.fromkeys(SHARDS), "a", set()) == Plan(tuple(SHARDS), ())


def test_a_server_takes_free_leases_only_up_to_its_share():
    leases = {"s0": "a", "s1": None, "s2": None, "s3": None}
    # a lives (it holds s0): two servers, a target of two each
    assert plan(leases, "b", set()) == Plan(("s1", "s2"), ())


def test_expired_leases_are_taken_after_free_ones_and_their_dead_owner_does_not_count():
    leases = {"s0": "a", "s1": "a", "s2": "dead", "s3": None}
    assert plan(leases, "a", {"s2"}) == Plan(("s3", "s2"), ())  # a alone is live: all four
    assert plan(leases, "b", {"s2"}) == Plan(("s3", "s2"), ())  # a and b: two each


def test_a_joining_server_steals_one_a_cycle_from_the_most_loaded():
    leases = dict.fromkeys(SHARDS, "a")
    assert plan(leases, "b", set()) == Plan((), ("s3",))
    leases["s3"] = "b"
    assert plan(leases, "b", set()) == Plan((), ("s2",))
    leases["s2"] = "b"
    assert plan(leases, "b", set()) == Plan((), ())
    assert plan(leases, "a", set()) == Plan((), ())
    assert plan(leases, "b", set(), max_steal=2) == Plan((), ())


def test_three_servers_on_four_shards_settle_at_two_one_one_and_stay():
    leases = {"s0": "a", "s1": "a", "s2": "b", "s3": "b"}
    assert plan(leases, "c", set()) == Plan((), ("s1",))  # needs two, a is at the target of two: one
    leases["s1"] = "c"
    for me in "abc":
        assert plan(leases, me, set()) == Plan((), ()), me


def test_a_server_over_its_share_is_stolen_from_only_while_others_are_under_it():
    leases = {"s0": "a", "s1": "a", "s2": "a", "s3": "b"}
    assert plan(leases, "a", set()) == Plan((), ())  # over its share: it takes nothing, gives nothing up itself
    assert plan(leases, "b", set()) == Plan((), ("s2",))


def test_simulated_fleet_converges_each_shard_held_once():
    leases: dict[str, str | None] = dict.fromkeys([f"s{i}" for i in range(10)])
    servers = ["a"]
    for cycle in range(40):
        if cycle == 5:
            servers.append("b")
        if cycle == 15:
            servers.append("c")
        for me in servers:
            p = plan(leases, me, set())
            for shard in (*p.take, *p.steal):
                leases[shard] = me
    counts = sorted(list(leases.values()).count(s) for s in servers)
    assert counts == [3, 3, 4] and None not in leases.values()
