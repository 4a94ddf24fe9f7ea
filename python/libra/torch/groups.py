"""Process groups: a pool's P * cp ranks (and an elastic domain's) as one group each,
with this rank's worker index in the planning contract's numbering. The groups are the caller's
communicator's (torch.distributed, or the in-process pool the calling thread works in)."""
import collections
import itertools
import math

from .. import _libra, _pricing_json
from . import comms

_POOLS = {}  # id(group) -> (group, workers by group rank)


def _world():
    comm = comms.current()
    size, rank = comm.world()
    return comm, size, rank


def _slot_groups(comm, slots, cp, replicas, rank):
    """Creates one group per block of `slots` consecutive DP replicas (replicas // slots of them; every
    rank creates every group, in the same order, as new_group requires) and returns this rank's
    (group, worker), or (None, None) for a rank in no block. Worker = slot * cp + cp_rank, slot = the
    replica's place in its block: the planning contract's numbering for a pool of `slots` slots."""
    n = slots * cp
    mine = (None, None)
    for b in range(replicas // slots):
        ranks = list(range(b * n, (b + 1) * n))
        g = comm.new_group(ranks)
        if rank in ranks:
            mine = (g, ranks)
    group, ranks = mine
    if group is None:
        return None, None
    # new_group orders group ranks by global rank.
    workers = [(x // cp % slots) * cp + x % cp for x in sorted(ranks)]
    _POOLS[id(group)] = (group, workers)
    return group, workers[sorted(ranks).index(rank)]


def pool_group(pool_size, cp):
    """Collective over the default group: returns (this rank's pool group, its worker index)."""
    comm, world, rank = _world()
    if pool_size < 1 or cp < 1:
        raise ValueError(f"pool_group: pool_size {pool_size} and cp {cp} must be >= 1")
    if world % (pool_size * cp) != 0:
        raise ValueError(f"pool_group: world size {world} must be divisible by pool_size * cp = {pool_size * cp}")
    return _slot_groups(comm, pool_size, cp, world // cp, rank)


# What domain_groups returns; unpacks as (pool, pool_worker, domain, domain_worker).
_DomainGroupsBase = collections.namedtuple("DomainGroups", ["pool", "pool_worker", "domain", "domain_worker"])

# The lightest rule needs a group per possible fused domain; past this many a job would hold more
# communicators than it is worth (an NCCL communicator costs memory and set-up time per member).
MAX_LIGHTEST_GROUPS = 64


class DomainGroups(_DomainGroupsBase):
    """(pool, pool_worker, domain, domain_worker), plus ``of(positions)``: the group and this rank's
    worker of the fused domain of those pool positions in the GA step (``PlacementBatchSampler.domain``
    gives them). ``domain`` / ``domain_worker`` are the buddy domain's (None for the lightest rule,
    whose domain changes from step to step)."""

    def __new__(cls, pool, pool_worker, domain, domain_worker, by_positions=None, rule="buddy"):
        self = super().__new__(cls, pool, pool_worker, domain, domain_worker)
        self._by_positions = dict(by_positions or {})
        self.rule = rule
        return self

    def of(self, positions):
        """(group, worker) of the fused domain of pool positions ``positions`` (pool index mod DP/P,
        increasing), for a rank in it."""
        key = tuple(int(x) for x in positions)
        if key not in self._by_positions:
            raise ValueError(f"DomainGroups.of(): positions {list(key)}: no {self.rule} domain group of this "
                             f"rank has these pool positions")
        return self._by_positions[key]


def _subset_groups(comm, subsets, pool_size, cp, rank):
    """One group per subset of pool positions (every rank creates every group, same order); returns
    {subset: (group, worker)} for the subsets holding this rank. Domain slot s is slot s % P of pool
    subset[s // P], so worker = (place of the pool in the subset * P + slot) * cp + cp_rank."""
    n = pool_size * cp
    mine = {}
    for sub in subsets:
        ranks = [q * n + j for q in sub for j in range(n)]
        g = comm.new_group(sorted(ranks))
        if rank in ranks:
            workers = [ranks.index(x) for x in sorted(ranks)]  # worker by group rank
            _POOLS[id(g)] = (g, workers)
            mine[tuple(sub)] = (g, ranks.index(rank))
    return mine


def _lightest_subsets(ppg, k):
    """Every set of 2..k of a GA step's ppg pool positions (what the lightest rule can fuse), or the
    one-line refusal when that is more than MAX_LIGHTEST_GROUPS groups."""
    n = sum(math.comb(ppg, j) for j in range(2, k + 1))
    if n > MAX_LIGHTEST_GROUPS:
        raise ValueError(f"domain_groups: rule 'lightest' with DP/P = {ppg} pools and k = {k} needs {n} groups "
                         f"(one per set of 2..k pools of a GA step), more than {MAX_LIGHTEST_GROUPS}: "
                         f"use rule 'buddy' (static groups)")
    return [s for j in range(2, k + 1) for s in itertools.combinations(range(ppg), j)]


def domain_groups(pool_size, cp, k=2, rule="buddy", elastic_pricing=None):
    """Collective over the default group, once per job: this rank's pool group and its vrsp-elastic
    fused-domain groups, with its worker index in each.

    The buddy rule (docs/elastic.md) fuses pools at fixed positions of a GA step: a fused domain is
    (without elastic_pricing) always the k * pool_size consecutive DP replicas [m*k*P, (m+1)*k*P),
    so its k * P * cp ranks form
    one static group, created here with every pool group. The domain worker of a rank is
    slot * cp + cp_rank, slot = its replica's place in the domain (slot s is slot s % P of the
    domain's pool s // P): the worker numbering of make_plan on the domain's k * P sequences.
    k is clamped to the DP / P pools of a GA step, as the placement clamps it; ranks past the last
    whole domain (DP / P not divisible by k) get domain None and domain_worker None: their pools
    never fuse.

    With ``elastic_pricing`` (the dict given to PlacementBatchSampler) the buddy domains sit where
    the priced sampler puts them on that configuration's topology: adjacent pools touching the
    fewest supernodes, then nodes (libra::buddy_domain_starts); some pools may then never fuse.

    The lightest rule fuses whichever pools of a GA step are heaviest and lightest, so it needs a
    group for every set of 2 .. k of the step's DP / P pools: sum_j C(DP/P, j) groups, each rank in
    sum_j C(DP/P - 1, j - 1) of them. They are created here when that is at most
    MAX_LIGHTEST_GROUPS (64: DP/P <= 11 at k = 2, <= 6 at k = 3); past it this refuses (ValueError):
    use the buddy rule, whose groups are static. ``of(positions)`` finds a domain's group either way.
    """
    comm, world, rank = _world()
    if pool_size < 1 or cp < 1 or k < 1:
        raise ValueError(f"domain_groups: pool_size {pool_size}, cp {cp} and k {k} must be >= 1")
    if rule not in ("buddy", "lightest"):
        raise ValueError(f"domain_groups: rule {rule!r}: must be 'buddy' or 'lightest'")
    if world % (pool_size * cp) != 0:
        raise ValueError(f"domain_groups: world size {world} must be divisible by pool_size * cp = {pool_size * cp}")
    replicas = world // cp
    ppg = replicas // pool_size
    k = min(k, ppg)
    subsets = _lightest_subsets(ppg, k) if rule == "lightest" else None
    pool, pool_worker = _slot_groups(comm, pool_size, cp, replicas, rank)
    if rule == "lightest":
        return DomainGroups(pool, pool_worker, None, None, _subset_groups(comm, subsets, pool_size, cp, rank), rule)
    topology = (0, 0, 0)
    if elastic_pricing is not None:
        topology = tuple(_libra.pricing_topology(_pricing_json(elastic_pricing, "domain_groups")[0]))
        if topology[0] != cp:
            raise ValueError(f"domain_groups: cp {cp}: the elastic pricing configuration has cp {topology[0]}")
    starts = _libra.buddy_domain_starts(ppg, pool_size, k, *topology)
    by = _subset_groups(comm, [tuple(range(s, s + k)) for s in starts], pool_size, cp, rank)
    domain, domain_worker = next(iter(by.values())) if by else (None, None)
    return DomainGroups(pool, pool_worker, domain, domain_worker, by, rule)
