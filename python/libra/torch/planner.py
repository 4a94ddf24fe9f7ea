"""Plans the next micro-batch on a background thread while the current one trains."""
import concurrent.futures

from .. import _integer, _libra, _refuse, make_plan
from .runtime import PlanRuntime


class Planner:
    """Plans batch n+1 on a background CPU thread while batch n trains.

    ``get(n)`` returns the plan of batch n of the sampler's current epoch
    (waiting for it if needed) and starts planning batch n+1. With
    ``worker=`` (the worker index from pool_group) the thread also derives
    that worker's schedule and its index arrays (everything the passes index
    with), which ``runtime(n, group)`` hands to PlanRuntime. make_plan, the
    schedule and the index arrays release the GIL, so planning and training
    run at once. The other keyword arguments are those of libra.make_plan; they
    are checked at construction, which plans batch 0 (kept for ``get(0)``),
    so a bad argument raises here, not at the first ``get``.

    Elastic pools (a sampler in mode vrsp-elastic): batch n's plan is made of
    ``sampler.plan_pool(n)``, the fused domain's k*P sequences when this
    replica's pool is fused (the plan of a pool otherwise). Pass
    ``groups=`` (what domain_groups returned) instead of ``worker=``: the
    thread then derives the schedule of this rank's worker in the batch's
    domain or pool, and ``runtime(n)`` runs it on that group.

    ``relay=True`` derives relayed schedules (PlanRuntime's ``relay``) on
    the thread too, and ``runtime`` passes it on; every rank must agree.
    """

    def __init__(self, sampler, worker=None, groups=None, relay=False, **plan_kwargs):
        if not isinstance(relay, bool):
            _refuse(f"Planner: relay {relay!r}: must be True or False")
        if worker is not None and groups is not None:
            _refuse("Planner: worker and groups: pass one (groups gives the worker of each batch's pool or domain)")
        if groups is not None and not hasattr(groups, "of"):
            _refuse(f"Planner: groups: must be what libra.torch.domain_groups returns, got a {type(groups).__name__}")
        if worker is not None:
            worker = _integer("Planner: worker", worker)
            if worker < 0:
                _refuse(f"Planner: worker {worker}: must be >= 0")
        self._sampler = sampler
        self._worker = worker
        self._groups = groups
        self._relay = relay
        self._kw = plan_kwargs
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="libra-planner")
        self._futures = {}  # batch -> future, of the sampler's epoch self._planned_epoch
        self._done = {}
        self._planned_epoch = self._epoch()
        try:
            if len(sampler) > 0:
                self._result(0)
            else:  # nothing to plan: still check the arguments, on a pool of one-token sequences
                make_plan([[1]] * getattr(sampler, "pool_size", 1), **plan_kwargs)
        except ValueError as e:
            self.close()
            raise type(e)(f"Planner: {e}") from None

    def _epoch(self):
        return getattr(self._sampler, "epoch", 0)

    def _where(self, n):
        """(group, worker) batch n runs on: the fused domain's or the pool's (groups=), else (None, worker)."""
        if self._groups is None:
            return None, self._worker
        d = self._sampler.domain(n) if hasattr(self._sampler, "domain") else None
        if d is None:
            return self._groups.pool, self._groups.pool_worker
        return self._groups.of(d.positions)

    def _work(self, pool, where):
        plan = make_plan(pool, **self._kw)
        worker = where[1]
        sched = None if worker is None else _libra.rank_program(plan, worker, relay=self._relay)
        if sched is not None:
            sched.build_index()  # the runtime's index arrays, built here without the GIL
        return plan, sched, where[0]

    def _submit(self, n):
        if n < len(self._sampler) and n not in self._futures and n not in self._done:
            s = self._sampler
            pool = s.plan_pool(n) if hasattr(s, "plan_pool") else s.pool(n)
            self._futures[n] = self._pool.submit(self._work, pool, self._where(n))

    def _result(self, n):
        if isinstance(n, bool) or not 0 <= n < len(self._sampler):
            raise ValueError(f"Planner: batch {n} must be in [0, {len(self._sampler)})")
        if self._epoch() != self._planned_epoch:
            # After set_epoch batch n is another pool: what was planned for the old epoch goes.
            for f in self._futures.values():
                f.cancel()
            self._futures, self._done, self._planned_epoch = {}, {}, self._epoch()
        if n not in self._done:
            self._submit(n)
            self._done = {n: self._futures.pop(n).result()}
            for old in [k for k in self._futures if k < n]:
                self._futures.pop(old).cancel()
            self._submit(n + 1)
        return self._done[n]

    def get(self, n):
        return self._result(n)[0]

    def fused(self, n):
        """Whether batch n's plan is a fused elastic domain's (more than one pool)."""
        return self._result(n)[0].pool_size > getattr(self._sampler, "pool_size", 0)

    def runtime(self, n, group=None, **kwargs):
        """PlanRuntime of batch n on ``group`` (collective), from the prefetched plan and schedule.
        With ``groups=`` at construction ``group`` defaults to the batch's domain or pool group."""
        plan, sched, where = self._result(n)
        if group is None:
            if where is None:
                _refuse("Planner.runtime(): group: required when the Planner has no groups=")
            group = where
        kwargs.setdefault("relay", self._relay)
        return PlanRuntime(plan, group, schedule=sched, **kwargs)

    def close(self):
        self._pool.shutdown(wait=True, cancel_futures=True)
