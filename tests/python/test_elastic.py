"""vrsp-elastic from a training loop (docs/elastic.md, "Training loop"): PlacementBatchSampler hands
each replica its sequence and its fused domain, Planner plans the domain, domain_groups serves both
fusing rules, and attention through a fused domain matches float64 plain attention."""
import pytest

torch = pytest.importorskip("torch")

import libra  # noqa: E402
import libra.torch as lt  # noqa: E402
from libra.torch import groups as lt_groups  # noqa: E402
from dist_util import reference_attention, spawn  # noqa: E402

L = 64
P, CP, DP, GBS = 2, 2, 4, 8
# Window 0 (GBS 8): the 64-token outlier leaves VRSP's pool 0 far above the mean, so pools 0 and 1
# (GA index 0) fuse under both rules; window 1 is uniform and never fuses.
SEQS = [[64], [8] * 8, [4] * 16, [2] * 32, [32] * 2, [16] * 4, [32] * 2, [16] * 4] + [[32] * 2] * 8
TOL = 2e-5


def data(index):
    g = torch.Generator().manual_seed(7000 + index)
    return [torch.randn(L, h, 16, generator=g, dtype=torch.float64) for h in (4, 2, 2, 4)]


def rel_err(got, want):
    return float((got.detach().to(torch.float64) - want).abs().max() / want.abs().max().clamp_min(1e-30))


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


def test_training_through_a_fused_domain_matches_plain_attention():
    results = spawn(body_train, CP * DP)
    for r in results:
        for rule in ("buddy", "lightest"):
            x = r[rule]
            # Batch 0 of replicas 0-3 is the fused domain of pools 0 and 1; the rest run as pools.
            assert x["fused"] == [True, False, False, False], x
            assert x["shared"] == [True], x
            assert x["err"] < TOL, x
