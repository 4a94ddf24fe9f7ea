"""Process groups: a pool's P * cp ranks (and an elastic domain's) as one group each,
with this rank's worker index in the planning contract's numbering."""
import collections

import torch.distributed as dist


_POOLS = {}  # id(group) -> (group, workers by group rank)


def _world():
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("libra.torch: torch.distributed is not initialised (call init_process_group first)")
    return dist.get_world_size(), dist.get_rank()


def _slot_groups(slots, cp, replicas, rank):
    """Creates one group per block of `slots` consecutive DP replicas (replicas // slots of them; every
    rank creates every group, in the same order, as new_group requires) and returns this rank's
    (group, worker), or (None, None) for a rank in no block. Worker = slot * cp + cp_rank, slot = the
    replica's place in its block: the planning contract's numbering for a pool of `slots` slots."""
    n = slots * cp
    mine = (None, None)
    for b in range(replicas // slots):
        ranks = list(range(b * n, (b + 1) * n))
        g = dist.new_group(ranks)
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
    world, rank = _world()
    if pool_size < 1 or cp < 1:
        raise ValueError(f"pool_group: pool_size {pool_size} and cp {cp} must be >= 1")
    if world % (pool_size * cp) != 0:
        raise ValueError(f"pool_group: world size {world} must be divisible by pool_size * cp = {pool_size * cp}")
    return _slot_groups(pool_size, cp, world // cp, rank)


# What domain_groups returns; unpacks as (pool, pool_worker, domain, domain_worker).
DomainGroups = collections.namedtuple("DomainGroups", ["pool", "pool_worker", "domain", "domain_worker"])


def domain_groups(pool_size, cp, k=2):
    """Collective over the default group, once per job: this rank's pool group and its vrsp-elastic
    fused-domain group, with its worker index in each.

    The buddy rule (docs/elastic.md) fuses pools at fixed positions of a GA step: a fused domain is
    always the k * pool_size consecutive DP replicas [m*k*P, (m+1)*k*P), so its k * P * cp ranks form
    one static group, created here with every pool group. The domain worker of a rank is
    slot * cp + cp_rank, slot = its replica's place in the domain (slot s is slot s % P of the
    domain's pool s // P): the worker numbering of make_plan on the domain's k * P sequences.
    k is clamped to the DP / P pools of a GA step, as the placement clamps it; ranks past the last
    whole domain (DP / P not divisible by k) get domain None and domain_worker None: their pools
    never fuse.
    """
    world, rank = _world()
    if pool_size < 1 or cp < 1 or k < 1:
        raise ValueError(f"domain_groups: pool_size {pool_size}, cp {cp} and k {k} must be >= 1")
    if world % (pool_size * cp) != 0:
        raise ValueError(f"domain_groups: world size {world} must be divisible by pool_size * cp = {pool_size * cp}")
    replicas = world // cp
    k = min(k, replicas // pool_size)
    pool, pool_worker = _slot_groups(pool_size, cp, replicas, rank)
    domain, domain_worker = _slot_groups(k * pool_size, cp, replicas, rank)
    return DomainGroups(pool, pool_worker, domain, domain_worker)
