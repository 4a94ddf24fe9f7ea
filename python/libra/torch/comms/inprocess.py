"""One process runs all W workers of a pool, each on its own thread.

    from libra.torch.comms import inprocess

    def body(rank, world):                       # what each process would run under torch.distributed
        group, worker = libra.torch.pool_group(pool_size=2, cp=2)
        rt = libra.torch.PlanRuntime(plan, group)
        ...
    results = inprocess.run(body, 4)             # [body(0, 4), ..., body(3, 4)]

Messages are tensors handed between threads: a receiver copies its rows from the senders' buffers
when it waits, so an exchange costs one copy per byte (what the wire would), on any device.
A worker's backward runs on its own thread (autograd's device threads are off for it), so on one
GPU the workers' backward passes, which wait on each other, do not queue behind one device thread.
A worker that raises ends every wait of the others at once; ``run`` then raises its exception.
"""
import itertools
import threading
import time

import numpy as np
import torch

from . import Communicator

_LOCAL = threading.local()  # .ctx: the calling worker's _Worker


class _Pool:
    """The shared state of one ``run``: its groups by creation order, and the first failure."""

    def fail(self, rank):
        """Records ``rank`` as the first failure (unless one is already) and ends every wait: each pending
        collective's gate opens. Call with ``cond`` held."""
        if self.failed is None:
            self.failed = rank
        for state in [self.world, *self.groups]:
            for op in state.ops.values():
                op.open()
        self.cond.notify_all()

    def __init__(self, size):
        self.size = size
        self.cond = threading.Condition()
        self.groups = []  # _GroupState by creation order (new_group is collective)
        self.failed = None  # world rank of the first worker that raised
        self.world = _GroupState(self, list(range(size)))


class _GroupState:
    def __init__(self, pool, ranks):
        self.pool, self.ranks = pool, ranks
        self.ops = {}  # collective seq -> _Op


class _Op:
    def __init__(self, n):
        self.payload = [None] * n
        self.joined = [False] * n
        self.count = 0  # ranks joined
        # Closed until every rank joined (or the pool failed). A waiter passes it on (acquires, then
        # releases it): each wakes once, where a condition's notify_all woke every waiter at once to
        # contend for one lock again.
        self.gate = threading.Lock()
        self.gate.acquire()
        self.opened = False
        self.taken = itertools.count(1)  # next(): how many ranks took their part (atomic under the GIL)
        self.shared = None  # what every rank's part is made from, made once (all_gather_into's stack)

    def open(self):
        """Opens the gate (once). Call with the pool's ``cond`` held."""
        if not self.opened:
            self.opened = True
            self.gate.release()


class Group:
    """One worker's handle on an in-process group (what torch calls a ProcessGroup)."""

    def __init__(self, state, rank):
        self.state, self._rank = state, rank
        self._seq = 0  # collectives this worker posted on the group (the same order on every member)
        self.timeout = None

    def __repr__(self):
        return f"inprocess.Group(rank {self._rank} of world ranks {self.state.ranks})"


class _Work:
    """A posted collective of one worker; ``take(payloads)`` gives it its part once every rank joined."""

    def __init__(self, group, seq, op, take):
        self.group, self.seq, self.op, self.take = group, seq, op, take
        self._done = False

    def wait(self, timeout=None):
        if self._done:
            return True
        if timeout is None:
            timeout = self.group.timeout
        else:
            timeout = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
        state, op = self.group.state, self.op
        pool = state.pool
        n = len(state.ranks)
        ready = op.count == n
        if not ready:
            ready = op.gate.acquire(True, -1 if timeout is None else timeout)
            if ready:
                op.gate.release()  # the next waiter's turn
        if pool.failed is not None and op.count < n:
            raise RuntimeError(f"in-process pool: worker {pool.failed} failed")
        if not ready:
            raise RuntimeError(f"in-process pool: collective {self.seq} not joined by every rank within "
                               f"{timeout:g} s")
        self.take(op.payload)
        if next(op.taken) == n:
            with pool.cond:
                state.ops.pop(self.seq, None)
        self._done = True
        return True


def _ctx():
    ctx = getattr(_LOCAL, "ctx", None)
    if ctx is None:
        raise RuntimeError("libra.torch in-process communicator: this thread is not a worker of inprocess.run")
    return ctx


class _Worker:
    def __init__(self, pool, rank):
        self.pool, self.rank, self.made = pool, rank, 0
        self.world = Group(pool.world, rank)


def _post(group, payload, take):
    state = group.state
    with state.pool.cond:
        seq = group._seq
        group._seq += 1
        op = state.ops.get(seq)
        if op is None:
            op = state.ops[seq] = _Op(len(state.ranks))
            if state.pool.failed is not None:
                op.open()  # a wait on it ends at once, as the failure ended every earlier one
        op.payload[group._rank] = payload
        op.joined[group._rank] = True
        op.count += 1
        if op.count == len(state.ranks):
            op.open()
    return _Work(group, seq, op, take)


def _offsets(splits):
    out, total = [], 0
    for s in splits:
        out.append(total)
        total += int(s)
    return out


class InProcess(Communicator):
    name = "inprocess"

    def owns(self, group):
        return isinstance(group, Group)

    def active(self):
        return getattr(_LOCAL, "ctx", None) is not None

    def world(self):
        ctx = _ctx()
        return ctx.pool.size, ctx.rank

    def new_group(self, ranks):
        ctx = _ctx()
        ranks = sorted(int(r) for r in ranks)
        with ctx.pool.cond:
            k = ctx.made
            ctx.made += 1
            if k == len(ctx.pool.groups):
                ctx.pool.groups.append(_GroupState(ctx.pool, ranks))
            state = ctx.pool.groups[k]
        if state.ranks != ranks:
            raise ValueError(f"in-process new_group #{k}: world rank {ctx.rank} asks for ranks {ranks}, another "
                             f"worker for {state.ranks} (every worker must create the same groups in the same order)")
        return Group(state, ranks.index(ctx.rank)) if ctx.rank in ranks else None

    def size(self, group):
        return len(group.state.ranks)

    def rank(self, group):
        return group._rank

    def world_ranks(self, group):
        return list(group.state.ranks)

    def all_to_all(self, out, inp, out_splits, in_splits, group):
        me = group._rank
        recv_at = _offsets(out_splits)
        rows = [int(x) for x in out_splits]

        def take(payloads):
            for j, (src, splits) in enumerate(payloads):
                if rows[j]:
                    at = _offsets(splits)[me]
                    out.narrow(0, recv_at[j], rows[j]).copy_(src.narrow(0, at, rows[j]))

        return _post(group, (inp, [int(x) for x in in_splits]), take)

    def all_gather(self, outs, inp, group):
        def take(payloads):
            for o, src in zip(outs, payloads):
                o.copy_(src)

        return _post(group or _ctx().world, inp, take)

    def all_gather_into(self, out, inp, group):
        box = []  # the op's _Op, known once posted

        def take(payloads):
            # One stack per collective, shared by its ranks (each then copies it: one small op, where a
            # stack per rank reads every rank's tensor again).
            op = box[0]
            stacked = op.shared
            if stacked is None:
                stacked = op.shared = torch.stack(payloads)
            out.copy_(stacked)

        work = _post(group or _ctx().world, inp, take)
        box.append(work.op)
        return work

    def all_gather_array(self, out, inp, group):
        # numpy, no torch op: the agreements' words travel between threads as they are.
        box = []

        def take(payloads):
            op = box[0]
            stacked = op.shared
            if stacked is None:
                stacked = op.shared = np.stack(payloads)
            np.copyto(out, stacked)

        work = _post(group or _ctx().world, inp, take)
        box.append(work.op)
        return work

    def set_timeout(self, group, seconds):
        group.timeout = float(seconds)
        return True

    def silent(self, group, work, seq, timeout):
        with group.state.pool.cond:
            return [r for r, joined in enumerate(work.op.joined) if not joined]

    def barrier(self, group=None):
        _post(group or _ctx().world, None, lambda _p: None).wait()

    def all_reduce(self, tensor, group=None):
        # A copy travels: peers read it after this worker may already have written the sum into `tensor`.
        def take(payloads):
            total = payloads[0].clone()
            for p in payloads[1:]:
                total += p
            tensor.copy_(total)

        _post(group or _ctx().world, tensor.detach().clone(), take).wait()


COMMUNICATOR = InProcess()


def run(fn, world, *args, timeout=None):
    """Runs ``fn(rank, world, *args)`` for every rank of a pool of ``world`` workers on threads of this
    process, with libra.torch's communicator set to this pool for each; returns the results by rank.
    The first worker to raise ends the others' waits; its exception is raised here. ``timeout``
    (seconds) bounds the whole run: past it the run fails naming the workers still running."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"inprocess.run: world {world!r}: must be an integer >= 1")
    pool = _Pool(world)
    results, errors = [None] * world, [None] * world

    def worker(rank):
        _LOCAL.ctx = _Worker(pool, rank)
        try:
            with torch.autograd.set_multithreading_enabled(False):
                results[rank] = fn(rank, world, *args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            errors[rank] = e
            with pool.cond:
                pool.fail(rank)
        finally:
            _LOCAL.ctx = None

    threads = [threading.Thread(target=worker, args=(r,), name=f"libra-inprocess-{r}", daemon=True)
               for r in range(world)]
    for t in threads:
        t.start()
    end = None if timeout is None else time.monotonic() + timeout
    for t in threads:
        t.join(None if end is None else max(0.0, end - time.monotonic()))
    running = [r for r, t in enumerate(threads) if t.is_alive()]
    if running:
        with pool.cond:
            pool.fail(running[0])
        raise TimeoutError(f"inprocess.run: workers {running} still running after {timeout:g} s")
    if pool.failed is not None:
        raise errors[pool.failed]
    return results

