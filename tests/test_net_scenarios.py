"""Real GRPO nodes in the network lab (tooling/netlab.py): peers behind NAT, a bootstrap that dies.

Each test builds its own namespaces (as root; skipped with the harness's reason otherwise), runs real
`swarm-node bootstrap` and `swarm-node run` processes in them (tooling/net_scenarios.py) and
removes everything at the end. The figures the scenarios return are benchmarks/network.py's.
"""

from __future__ import annotations

import pytest

from tooling import net_scenarios, netlab

REASON = netlab.unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400),
              pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def test_peer_behind_nat_joins_receives_and_serves(presets_dir, tmp_path):
    """Two NAT'ed peers (use_auto_relay) and a public one: every pair trains on the other's groups, the
    two behind different NATs included (through a circuit relay on the public bootstraps)."""
    out = net_scenarios.nat(tmp_path, timeout_s=150)
    assert out["all_pairs_shared"], out
    assert out["groups_from"]["ha"]["hb"] > 0 and out["groups_from"]["hb"]["ha"] > 0, out
    assert netlab.our_namespaces(out["lab"]) == []  # torn down


def test_peers_behind_two_nats_without_a_relay_are_told_what_to_set(presets_dir, tmp_path):
    """Without use_auto_relay the two NAT'ed peers never reach each other (both still trade with the public
    peer), and each NAT'ed peer, its pushes to the other failing, says so in one line naming the setting;
    the public peer, reached by everyone, does not. (Before the merged member reads, a NAT'ed peer that
    held a replica of the member key read only its own copy, never listed the other and said nothing:
    neither did in CI and in 1 of 3 runs beside two busy loops here, 2026-12-02.)"""
    # the line comes 30 s after a first failure; the run stops once both NAT'ed peers have said it
    out = net_scenarios.nat(tmp_path, timeout_s=180, auto_relay=False)
    assert not out["groups_from"]["ha"].get("hb") and not out["groups_from"]["hb"].get("ha"), out["groups_from"]
    assert out["groups_from"]["ha"].get("pub") and out["groups_from"]["hb"].get("pub"), out["groups_from"]
    assert out["told_unreachable"]["ha"] >= 1 and out["told_unreachable"]["hb"] >= 1, out
    assert out["told_unreachable"]["pub"] == 0, out


def test_new_peer_joins_through_the_surviving_bootstrap(presets_dir, tmp_path):
    """Two bootstraps, one SIGKILLed while two peers exchange: they keep exchanging, and a newcomer that
    lists the dead bootstrap first joins through the other and trains on both peers' groups (and they on its)."""
    out = net_scenarios.bootstrap_dies(tmp_path, timeout_s=120)
    assert out["exchanging_before_kill"], out
    assert out["all_exchange_after_kill"], out
    assert netlab.our_namespaces(out["lab"]) == []


def test_peer_rejoins_after_its_link_is_cut(presets_dir, tmp_path):
    """A peer's link is down for 60 s (as in the benchmark): it keeps doing rounds (none stuck), and once the
    link is back it pings the peers it knows and it and the others train on each other's groups again.
    (A 20 s cut does not always empty the routing tables: the exchange came back without the ping in one
    run of two here, 2026-12-04, so the ping could not be asserted.)"""
    out = net_scenarios.link_cut(tmp_path, down_s=60, timeout_s=120)
    assert out["exchanging_before_cut"], out
    assert out["rounds_during_cut"] > 5 and out["longest_round_gap_s"] < 10, out
    assert out["exchange_after_restore"], out
    assert out["rejoined_by_ping"], out  # without it the cut node waited ~30 s for hivemind to find its peers
    assert netlab.our_namespaces(out["lab"]) == []


def test_thin_uplink_slows_only_the_thin_peer(tmp_path):
    """8 network-only peers, one on 1 Mbit/s: nobody's pace drops; the thin peer takes fewer batches (its
    download is capped too) but still serves some; the others still fill most of K from the fast peers."""
    out = net_scenarios.thin_uplink(tmp_path, warmup_s=15, measure_s=20)
    peers = out["peers"]
    # 1 s rounds over a 20 s window (each sleep overshoots a little: 1.00-1.04 s gaps measured idle)
    assert all(p.get("rounds", 0) >= 17 for p in peers.values()), out
    others = [p for name, p in peers.items() if name != "thin"]
    assert peers["thin"]["batches_per_round"] < 3.0, out
    assert sum(p["from_thin_per_round"] for p in others) > 0, out
    assert min(p["batches_per_round"] for p in others) >= 3.0, out
    assert netlab.our_namespaces(out["lab"]) == []
