"""vrsp-elastic from a training loop (docs/elastic.md, "Training loop"): PlacementBatchSampler hands
each replica its sequence and its fused domain, Planner plans the domain, domain_groups serves both
fusing rules, and attention through a fused domain matches float64 plain attention."""
import pytest

torch = pytest.importorskip("torch")

import libra  # noqa: E402
import libra.torch as lt  # noqa: E402
from libra.torch import groups as lt_groups  # noqa: E402
from dist_util import COMMUNICATORS, reference_attention, rel_err, run  # noqa: E402

L = 64
P, CP, DP, GBS = 2, 2, 4, 8
# Window 0 (GBS 8): the 64-token outlier leaves VRSP's pool 0 far above the mean, so pools 0 and 1
# (GA index 0) fuse under both rules; window 1 is uniform and never fuses.
SEQS = [[64], [8] * 8, [4] * 16, [2] * 32, [32] * 2, [16] * 4, [32] * 2, [16] * 4] + [[32] * 2] * 8
TOL = 2e-5


def data(index):
    g = torch.Generator().manual_seed(7000 + index)
    return [torch.randn(L, h, 16, generator=g, dtype=torch.float64) for h in (4, 2, 2, 4)]


def test_sampler_domain_is_the_placements():
    for rule in ("buddy", "lightest"):
        at = libra.PlacementSampler(SEQS, GBS, DP, P, mode="vrsp-elastic", elastic_rule=rule).at(0)
        assert at["domains"][0] == [0, 1], at["domains"]
        for r in range(DP):
            s = lt.PlacementBatchSampler(SEQS, GBS, DP, P, r, mode="vrsp-elastic", elastic_rule=rule)
            d = s.domain(0)
            # The domain is its pools' sequences in slot order; this replica's sequence at its slot.
            mates = [lt.PlacementBatchSampler(SEQS, GBS, DP, P, q, mode="vrsp-elastic", elastic_rule=rule)
                     for q in (0, 2)]
            assert d.pools == [0, 1] and d.positions == [0, 1] and d.index == 0
            assert d.indices == mates[0].pool_indices(0) + mates[1].pool_indices(0)
            assert d.indices[d.slot] == s.index(0) and d.slot == r
            assert s.plan_indices(0) == d.indices and s.plan_pool(0) == [SEQS[i] for i in d.indices]
            for n in range(1, len(s)):  # GA index 1 and the uniform window: single pools
                assert s.domain(n) is None and s.plan_indices(n) == s.pool_indices(n)
        # Another epoch's order: a domain is still its pools' sequences in slot order.
        reps = [lt.PlacementBatchSampler(SEQS, GBS, DP, P, q, mode="vrsp-elastic", elastic_rule=rule)
                for q in range(DP)]
        for x in reps:
            x.set_epoch(1)
        for n in range(len(reps[0])):
            for x in reps:
                d = x.domain(n)
                if d is not None:
                    assert d.indices == sum((reps[p * P].pool_indices(n) for p in d.positions), [])
                    assert d.indices[d.slot] == x.index(n)
    s = lt.PlacementBatchSampler(SEQS, GBS, DP, P, 0)  # plain vrsp: never a domain
    assert all(s.domain(n) is None for n in range(len(s)))


# Priced fusing (libra.priced_placement_sampler): the outlier-heavy corpus at L = 64K with the real
# model shape, where some windows win by fusing (a domain of 2 pools x 2 replicas x cp 2 on one node)
# and some lose. The simulator's CLI reads and packs the corpus itself: an independent path.
PRICED = dict(source="builtin:paper-256k-v1", seq_len=65536, gbs=8, dp=4, pool_size=2, windows=6)
PRICING = {"seq_len": 65536, "cp": 2, "chunks": 2, "head_shards": [2], "block_sizes": [4096]}


def cli_report(libra_cli, extra=()):
    import json
    import subprocess
    c = PRICED
    out = subprocess.run([libra_cli, "simulate", c["source"], "--elastic", "--seq-len", str(c["seq_len"]),
                          "--gbs", str(c["gbs"]), "--dp", str(c["dp"]), "--cp", "2", "--chunks", "2",
                          "--windows", str(c["windows"]), "--pool-size", str(c["pool_size"]), "--head-shards", "2",
                          "--block-size", "4096", "--json", *extra], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["per_window"]


def sampler_fused(pricing):
    """Per window: whether any replica's batch of it runs a fused domain."""
    c = PRICED
    seqs = libra.load_packed_sequences(c["source"], c["seq_len"])[:c["windows"] * c["gbs"]]
    ga = c["gbs"] // c["dp"]
    fused = [False] * c["windows"]
    for r in range(c["dp"]):
        kw = {} if pricing is None else {"elastic_pricing": pricing}
        s = lt.PlacementBatchSampler(seqs, c["gbs"], c["dp"], c["pool_size"], r, mode="vrsp-elastic", **kw)
        for n in range(len(s)):
            fused[n // ga] |= s.domain(n) is not None
    return fused


@pytest.mark.parametrize("network", [{}, {"congestion_per_node": 0, "inter_supernode_gbps": 45},
                                     {"plan_mode": "tap-topo"}])
def test_priced_sampler_fuses_what_the_simulator_reports(libra_cli, network):
    flag = {"plan_mode": "elastic-plan-mode"}
    extra = [x for k, v in network.items() for x in (f"--{flag.get(k, k.replace('_', '-'))}", str(v))]
    report = cli_report(libra_cli, extra)
    fused = sampler_fused({**PRICING, **network})
    assert fused == [w["fused"] for w in report], (fused, report)
    for f, w in zip(fused, report):
        if w["candidate"] and w["gain"] <= 1:  # predicted slower: never fused
            assert not f
    # The case must tell the rules apart: the unpriced sampler fuses a window pricing declines.
    assert any(w["candidate"] and not w["fused"] for w in report)
    assert any(w["fused"] for w in report)
    assert sampler_fused(None) == [w["candidate"] for w in report]


def test_priced_sampler_bad_input():
    for pricing, match in (({}, r"seq_len: required"), ({"seq_len": 65536, "gbs": 8}, r"gbs: set by the sampler"),
                           ({"seq_len": 65536, "head_shards": [2, 4]}, r"head_shards: one value"),
                           ({"seq_len": 65536, "chunks": [2, 4]}, r"chunks: one value"),
                           ({"seq_len": 65536, "bogus": 1}, r"bogus"), ([1], r"must be a dict"),
                           ({"seq_len": 65536, "plan_mode": "ulysses"}, r"plan_mode 'ulysses': must be")):
        with pytest.raises(ValueError, match=match):
            lt.PlacementBatchSampler(SEQS, GBS, DP, P, 0, mode="vrsp-elastic", elastic_pricing=pricing)
    with pytest.raises(ValueError, match=r"elastic_pricing: only with mode 'vrsp-elastic'"):
        lt.PlacementBatchSampler(SEQS, GBS, DP, P, 0, elastic_pricing=PRICING)


def test_buddy_starts_follow_the_topology():
    # Worked by hand in src/placement/elastic_test.cpp: pools of one node, 3 nodes per supernode.
    assert libra._libra.buddy_domain_starts(6, 1, 2) == [0, 2, 4]
    assert libra._libra.buddy_domain_starts(6, 1, 2, 8, 8, 3) == [0, 3]
    assert tuple(libra._libra.pricing_topology('{"seq_len": 8, "cp": 8, "nodes_per_supernode": 3}')) == (8, 8, 3)


def test_lightest_groups_are_bounded():
    assert lt_groups._lightest_subsets(4, 2) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert len(lt_groups._lightest_subsets(11, 2)) == 55
    with pytest.raises(ValueError, match=r"^domain_groups: rule 'lightest' with DP/P = 12 pools and k = 2 "
                                         r"needs 66 groups .*use rule 'buddy'"):
        lt_groups._lightest_subsets(12, 2)


def body_train(rank, world):
    replica, cpr = rank // CP, rank % CP
    kw = dict(seq_len=L, cp=CP, block_size=8, head_shards=2, heads_q=4, heads_kv=2, head_dim=16, chunks=2,
              dtype="fp32")
    out = {}
    # With a pricing configuration the buddy groups sit on its topology: pools of 2 replicas x cp 2
    # on an 8-GPU node pair into one node, positions (0, 1), the same group as without.
    gp = lt.domain_groups(P, CP, k=2, elastic_pricing={"seq_len": L, "cp": CP})
    out["priced_groups"] = (sorted(gp._by_positions), gp.of((0, 1))[1])
    for rule in ("buddy", "lightest"):
        g = lt.domain_groups(P, CP, k=2, rule=rule)
        sampler = lt.PlacementBatchSampler(SEQS, GBS, DP, P, replica, mode="vrsp-elastic", elastic_rule=rule)
        planner = lt.Planner(sampler, groups=g, **kw)
        errs, fused, shared = [], [], []
        for n, batch in enumerate(sampler):
            (i,) = batch
            d = sampler.domain(n)
            plan = planner.get(n)
            fused.append(planner.fused(n))
            assert plan.pool_size == (len(d.pools) * P if d is not None else P)
            if d is not None:
                tiles = plan.tiles
                # Some of the outlier's tiles run on the other pool's workers: the domain shares work.
                shared.append(bool(((tiles["slot"] == d.indices.index(0)) &
                                    (tiles["worker"] // CP // P != d.indices.index(0) // P)).any()))
            Q, K, V, G = data(i)
            home = slice(cpr * (L // CP), (cpr + 1) * (L // CP))
            q, k, v = (x[home].to(torch.float32).requires_grad_() for x in (Q, K, V))
            o = lt.attention(q, k, v, planner.runtime(n))
            (o.to(torch.float64) * G[home]).sum().backward()
            Qr, Kr, Vr = (x.clone().requires_grad_() for x in (Q, K, V))
            ref = reference_attention(Qr, Kr, Vr, SEQS[i])
            (ref * G).sum().backward()
            errs.append(max(rel_err(o, ref[home]), rel_err(q.grad, Qr.grad[home]),
                            rel_err(k.grad, Kr.grad[home]), rel_err(v.grad, Vr.grad[home])))
        planner.close()
        out[rule] = {"err": max(errs), "fused": fused, "shared": shared}
    return out


@pytest.mark.parametrize("comm", COMMUNICATORS)
def test_training_through_a_fused_domain_matches_plain_attention(comm):
    results = run(comm, body_train, CP * DP)
    for rank, r in enumerate(results):
        assert r["priced_groups"] == [[[0, 1]], rank], r["priced_groups"]
        for rule in ("buddy", "lightest"):
            x = r[rule]
            # Batch 0 of replicas 0-3 is the fused domain of pools 0 and 1; the rest run as pools.
            assert x["fused"] == [True, False, False, False], x
            assert x["shared"] == [True], x
            assert x["err"] < TOL, x
