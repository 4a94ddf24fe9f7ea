"""libra.torch: libra inside a PyTorch training loop.

Rank layout (Megatron-style, CP innermost): global rank = dp_rank * cp + cp_rank.
A pool is P consecutive DP replicas; its P * cp ranks form one process group
and rank x of pool k is worker (x // cp % P) * cp + x % cp of the pool's plan
(the planning contract's numbering: worker = slot * cp + cp_rank).

    group, worker = libra.torch.pool_group(pool_size=2, cp=2)
    sampler = libra.torch.PlacementBatchSampler(seqs, gbs=8, dp=2, pool_size=2, dp_rank=rank // 2)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler)
    planner = libra.torch.Planner(sampler, seq_len=L, cp=2, block_size=64, head_shards=2,
                                  heads_q=4, heads_kv=2, head_dim=32, chunks=2)
    for i, batch in enumerate(loader):
        runtime = libra.torch.PlanRuntime(planner.get(i), group)   # once per micro-batch
        ...
        o = libra.torch.attention(q, k, v, runtime)   # q: [L/cp, h_q, d] home tokens, THD

``attention`` replaces a context-parallel core-attention call (forward and
backward). Its transfers are asynchronous all-to-alls on the group's
communicator (``comms``: torch.distributed, or an in-process pool of W workers
on threads), one per pipeline chunk, direction and element class, so that
chunk m+1 travels while chunk m computes. The kernel is the first available
compute backend (``backends``: libra's CPU kernel, flash-attn, torch's varlen
attention, SDPA).

The package's rooms follow the data flow: ``groups`` (process groups),
``comms`` (communicators), ``data`` (the sampler), ``planner`` (background
planning), ``runtime`` (a plan bound to a group), ``exchange`` (the flat
program's exchanges), ``compute`` and ``backends`` (the kernels),
``function`` (the autograd function and ``attention``) and ``trace``. Integrations with model libraries sit beside it
(``libra.hf``, ``libra.megatron``).
"""
from .data import BatchIndex, PlacementBatchSampler, PlacementDataLoader
from .function import attention
from . import ops  # noqa: F401  (registers libra::attention, what attention becomes under torch.compile)
from .groups import DomainGroups, domain_groups, pool_group
from .planner import Planner
from .runtime import PlanRuntime
from .trace import write_trace

__all__ = ["pool_group", "domain_groups", "DomainGroups", "BatchIndex", "PlacementBatchSampler", "PlacementDataLoader", "PlanRuntime", "Planner",
           "attention", "write_trace"]
