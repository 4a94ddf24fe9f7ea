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
backward). Its transfers are ``all_to_all_single`` calls, one per pipeline
chunk and direction, issued asynchronously so that chunk m+1 travels while
chunk m computes. On CPU tensors it runs libra's kernel on the tensors'
memory through the binding; on CUDA tensors ``flash_attn_varlen_func``.
"""
import collections
import concurrent.futures
import contextlib
import json
import threading
import time

import os

import numpy as np
import torch
import torch.distributed as dist

from . import _libra, make_plan

__all__ = ["pool_group", "domain_groups", "DomainGroups", "PlacementBatchSampler", "PlanRuntime", "Planner", "attention", "write_trace"]

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


class PlacementBatchSampler(torch.utils.data.Sampler):
    """A batch sampler that yields ``[index]``: this DP replica's packed sequence for every GA step, VRSP order.

    Batch n is GA index ``n % (gbs/dp)`` of optimizer step ``n // (gbs/dp)``;
    ``pool(n)`` gives the P packed sequences of that batch's pool in slot
    order (what the plan is made from). The order is a pure function of
    (sequences, gbs, dp, pool_size, mode, seed): ``state_dict()`` holds only
    the position, and ``load_state_dict`` resumes from it.
    """

    def __init__(self, sequences, gbs, dp, pool_size, dp_rank, mode="vrsp", seed=0):
        self._core = _libra.PlacementSampler(sequences, gbs, dp, pool_size, mode, seed)
        if not 0 <= dp_rank < dp:
            raise ValueError(f"PlacementBatchSampler: dp_rank {dp_rank} must be in [0, {dp})")
        self.gbs, self.dp, self.pool_size, self.dp_rank = gbs, dp, pool_size, dp_rank
        self.ga_steps = gbs // dp
        self._position = 0
        self._step_cache = (None, None)
        self._lock = threading.Lock()

    def __len__(self):
        return self._core.num_steps * self.ga_steps

    @property
    def num_steps(self):
        return self._core.num_steps

    def _order(self, step):
        with self._lock:
            if self._step_cache[0] != step:
                self._step_cache = (step, self._core.at(step)["order"])
            return self._step_cache[1]

    def _check(self, n):
        if not 0 <= n < len(self):
            raise ValueError(f"PlacementBatchSampler: batch {n} must be in [0, {len(self)})")

    def index(self, n):
        """Index of the packed sequence this replica trains on in batch n."""
        self._check(n)
        step, ga = divmod(n, self.ga_steps)
        return int(self._order(step)[ga * self.dp + self.dp_rank])

    def pool_indices(self, n):
        """Indices of the P sequences of batch n's pool, in slot order (slot = dp_rank % P)."""
        self._check(n)
        step, ga = divmod(n, self.ga_steps)
        order = self._order(step)
        first = ga * self.dp + (self.dp_rank // self.pool_size) * self.pool_size
        return [int(i) for i in order[first:first + self.pool_size]]

    def pool(self, n):
        """The packed sequences (lists of sample lengths) of batch n's pool, in slot order."""
        return [self._core.sequence(i) for i in self.pool_indices(n)]

    def sequence(self, i):
        return self._core.sequence(i)

    def __iter__(self):
        while self._position < len(self):
            n = self._position
            self._position += 1
            yield [self.index(n)]

    def state_dict(self):
        return {"position": self._position}

    def load_state_dict(self, state):
        pos = state.get("position") if isinstance(state, dict) else None
        if not isinstance(pos, int) or not 0 <= pos <= len(self):
            raise ValueError(f"PlacementBatchSampler state: position must be an integer in [0, {len(self)}]")
        self._position = pos


class Planner:
    """Plans batch n+1 on a background CPU thread while batch n trains.

    ``get(n)`` returns the plan of batch n (waiting for it if needed) and
    starts planning batch n+1. With ``worker=`` (the worker index from
    pool_group) the thread also derives that worker's schedule, which
    ``runtime(n, group)`` hands to PlanRuntime. make_plan and the schedule
    release the GIL, so planning and training run at once. The other keyword
    arguments are those of libra.make_plan.
    """

    def __init__(self, sampler, worker=None, **plan_kwargs):
        self._sampler = sampler
        self._worker = worker
        self._kw = plan_kwargs
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="libra-planner")
        self._futures = {}
        self._done = {}

    def _work(self, pool):
        plan = make_plan(pool, **self._kw)
        sched = None if self._worker is None else _libra.rank_programs(plan, self._worker)
        return plan, sched

    def _submit(self, n):
        if n < len(self._sampler) and n not in self._futures and n not in self._done:
            self._futures[n] = self._pool.submit(self._work, self._sampler.pool(n))

    def _result(self, n):
        if not 0 <= n < len(self._sampler):
            raise ValueError(f"Planner: batch {n} must be in [0, {len(self._sampler)})")
        if n not in self._done:
            self._submit(n)
            self._done = {n: self._futures.pop(n).result()}
            for old in [k for k in self._futures if k < n]:
                self._futures.pop(old).cancel()
            self._submit(n + 1)
        return self._done[n]

    def get(self, n):
        return self._result(n)[0]

    def runtime(self, n, group, **kwargs):
        """PlanRuntime of batch n on ``group`` (collective), from the prefetched plan and schedule."""
        plan, sched = self._result(n)
        return PlanRuntime(plan, group, schedule=sched, **kwargs)

    def close(self):
        self._pool.shutdown(wait=True, cancel_futures=True)


def _fingerprint_words(fp):
    return [int(fp >> 32), int(fp & 0xFFFFFFFF)]


class PlanRuntime:
    """One micro-batch's plan on one pool group, shared by every layer and by backward.

    Construction is collective over ``group``: the ranks exchange their plan
    fingerprints and worker indices, and every rank raises the same one-line
    ValueError when they disagree. The worker's schedule is then precomputed
    as index tensors.
    """

    def __init__(self, plan, group, worker=None, threads=1, trace=False, check_calls=True, schedule=None,
                 exchange="auto"):
        entry = _POOLS.get(id(group))
        if entry is None and worker is None:
            raise ValueError("PlanRuntime: group was not made by libra.torch.pool_group or domain_groups; pass worker=")
        size = dist.get_world_size(group)
        me = entry[1][dist.get_rank(group)] if worker is None else int(worker)
        # Every check below runs on what all ranks gathered, so they all raise the same line.
        mine = torch.tensor(_fingerprint_words(plan.fingerprint) + [me, plan.num_workers], dtype=torch.int64)
        everyone = [torch.zeros(4, dtype=torch.int64) for _ in range(size)]
        dist.all_gather(everyone, mine, group=group)
        fps = [(int(t[0]) << 32) | int(t[1]) for t in everyone]
        peers = [int(t[2]) for t in everyone]
        if len(set(fps)) == 1 and int(everyone[0][3]) != size:
            raise ValueError(f"PlanRuntime: the group has {size} ranks but the plan has {int(everyone[0][3])} workers")
        if len(set(fps)) != 1:
            counts = {}
            for i, f in enumerate(fps):
                counts.setdefault(f, []).append(i)
            parts = "; ".join(f"group ranks {r} hold {f:016x}" for f, r in sorted(counts.items()))
            raise ValueError(f"plan fingerprint mismatch across the pool group: {parts}")
        if sorted(peers) != list(range(size)):
            raise ValueError(f"PlanRuntime: the group's worker indices {peers} are not a permutation of 0..{size - 1}")
        self.plan = plan
        self.group = group
        self.worker = me
        self.threads = threads
        self.check_calls = check_calls
        if exchange not in ("auto", "programs", "index"):
            raise ValueError(f"PlanRuntime: exchange {exchange!r} must be auto, programs or index")
        # How messages are packed: "programs" copies the schedule's runs in C++ (CPU tensors),
        # "index" uses index tensors and torch ops (any device; what CUDA tensors use).
        self.exchange = exchange
        # Chrome trace events of every attention call under this runtime (trace=True): per chunk, the
        # kernel calls (tid 0) and each all-to-all from issue to completion (tid 1).
        self.trace = [] if trace else None
        self._t0 = time.perf_counter()
        self.window = plan.config["window"]
        # libra's per-rank schedule (libra/schedule.hpp), its exchanges expanded to index arrays with
        # the peers in group-rank order (what all_to_all_single's splits follow).
        progs = schedule
        if progs is not None:
            info = progs.info
            if info["order"] != peers or info["worker"] != me or info["fingerprint"] != plan.fingerprint:
                progs = None
        if progs is None:
            progs = _libra.rank_programs(plan, me, peers)
            info = progs.info
        self.programs, self.schedule = progs, info
        self.home_rows, self.heads_q, self.heads_kv = info["home_rows"], info["heads_q"], info["heads_kv"]
        self.head_dim, self.num_chunks = info["head_dim"], info["chunks"]
        self.splits = {(p, m, c): progs.splits(p, m, c)
                       for p, classes in _PHASE_CLASSES.items() for m in range(self.num_chunks) for c in classes}
        self._peers = peers
        self._on = {}
        self._cuda_meta = {}  # _cuda_call_meta's, by (pass, chunk, device)

    def on(self, device):
        """The schedule as index tensors on ``device`` (built once per device; the CUDA path's
        exchanges; CPU tensors use the C++ programs instead)."""
        device = torch.device(device)
        if torch.device("cpu") not in self._on:
            sd = _libra.rank_schedule(self.plan, self.worker, self._peers)
            self._on[torch.device("cpu")] = _index_tensors(sd)
        self.index = self._on[torch.device("cpu")]
        if device not in self._on:
            def move(x):
                if isinstance(x, torch.Tensor):
                    return x.to(device)
                if isinstance(x, dict):
                    return {k: move(v) for k, v in x.items()}
                if isinstance(x, (list, tuple)):
                    return type(x)(move(v) for v in x)
                return x
            self._on[device] = move(self.index)
        return self._on[device]

    @property
    def fingerprint(self):
        return self.plan.fingerprint


# ---------------------------------------------------------------- tracing

def _event(rt, name, tid, start, end):
    rt.trace.append({"name": name, "ph": "X", "pid": rt.worker, "tid": tid,
                     "ts": round((start - rt._t0) * 1e6, 1), "dur": round((end - start) * 1e6, 1)})


@contextlib.contextmanager
def _compute(rt, name):
    if rt.trace is None:
        yield
        return
    start = time.perf_counter()
    yield
    _event(rt, name, 0, start, time.perf_counter())


def _watch(rt, work, name):
    """Records an async collective from its issue to its completion (its future's callback)."""
    if rt.trace is not None:
        start = time.perf_counter()
        work.get_future().then(lambda _f: _event(rt, name, 1, start, time.perf_counter()))
    return work


def write_trace(path, events):
    """Writes Chrome trace-event JSON (chrome://tracing, Perfetto) of events gathered from the ranks."""
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    os.replace(tmp, path)


# ---------------------------------------------------------------- transfers

def _wire(x):
    """gloo has no bf16: send 16-bit floats as their bytes."""
    return x.view(torch.uint8) if x.dtype in (torch.bfloat16, torch.float16) else x


def _a2a(out, inp, out_splits, in_splits, group):
    """Async all_to_all_single of row buffers (splits count rows); returns the work."""
    return dist.all_to_all_single(_wire(out), _wire(inp), list(out_splits), list(in_splits), group=group,
                                  async_op=True)


# ---------------------------------------------------------------- exchanges

_FWD_IN, _FWD_OUT, _BWD_IN, _BWD_OUT = range(4)
# Element classes of the binding's sub-messages (one all_to_all_single each): the data type,
# LSE (fp32, 1 wide) and gradients (fp32); which a phase carries is fixed, so every rank posts the
# same collectives even when its own part is empty.
_PHASE_CLASSES = {_FWD_IN: (0,), _FWD_OUT: (0, 1), _BWD_IN: (0, 1), _BWD_OUT: (2,)}
_PHASE_NAMES = {_FWD_IN: "fwd in", _FWD_OUT: "fwd out", _BWD_IN: "bwd in", _BWD_OUT: "bwd out"}


def _index_tensors(sd):
    """The binding's schedule dict as the index tensors the passes use."""
    def t(a):
        return torch.from_numpy(np.array(a, dtype=np.int64))  # a writable copy of the read-only array

    def side(x):
        return {"splits": x["splits"],
                "fields": [(f["field"], f["class"], f["add"], t(f["pos"]), t(f["idx"])) for f in x["fields"]]}

    phases = []
    for p, per_chunk in enumerate(sd["exchanges"]):
        phase = {"chunks": [{"send": side(e["send"]), "recv": side(e["recv"])} for e in per_chunk]}
        if p in (_FWD_OUT, _BWD_OUT):
            phase["apply"] = _apply_plan(per_chunk, sd["apply_order"], sd["workers"])
        phases.append(phase)
    return {"phases": phases, "calls": sd["calls"]}


def _apply_plan(per_chunk, apply_order, workers):
    """Out phases: each field's received pieces of every chunk, in the schedule's apply order (peer,
    chunk), as positions into the chunks' class buffers concatenated in chunk order."""
    M = len(per_chunk)
    rank = np.zeros(workers * M, dtype=np.int64)
    for i, (peer, m) in enumerate(apply_order):
        rank[peer * M + m] = i
    offsets = {}
    for c in range(3):
        acc = 0
        for m, e in enumerate(per_chunk):
            offsets[(c, m)] = acc
            acc += sum(e["recv"]["splits"][c])
    entries = {}
    for m, e in enumerate(per_chunk):
        for f in e["recv"]["fields"]:
            key = (f["field"], f["class"], f["add"])
            pos = f["pos"] + offsets[(f["class"], m)]
            order = rank[f["peer"] * M + m]
            entries.setdefault(key, []).append((order, pos, f["idx"]))
    out = []
    for (field, cls, add), parts in entries.items():
        order = np.concatenate([o for o, _, _ in parts])
        pos = np.concatenate([p for _, p, _ in parts])
        idx = np.concatenate([i for _, _, i in parts])
        perm = np.argsort(order, kind="stable")
        out.append((field, cls, add, torch.from_numpy(pos[perm].copy()), torch.from_numpy(idx[perm].copy())))
    return out


def _class_layout(c, dtype, d):
    return (dtype, d) if c == 0 else (torch.float32, 1 if c == 1 else d)


def _post(rt, phase, m, ex, bufs, dtype, d, device):
    """Packs and posts (async) one (phase, chunk)'s sub-messages; returns [(class, work, recv)]."""
    posted = []
    for c in _PHASE_CLASSES[phase]:
        dt, width = _class_layout(c, dtype, d)
        send = torch.empty((sum(ex["send"]["splits"][c]), width), dtype=dt, device=device)
        for field, cls, _add, pos, idx in ex["send"]["fields"]:
            if cls == c:
                send.index_copy_(0, pos, bufs[field].index_select(0, idx))
        recv = torch.empty((sum(ex["recv"]["splits"][c]), width), dtype=dt, device=device)
        work = _a2a(recv, send, ex["recv"]["splits"][c], ex["send"]["splits"][c], rt.group)
        posted.append((c, _watch(rt, work, f"{_PHASE_NAMES[phase]} chunk {m} class {c}"), recv))
    return posted


def _unpack_in(ex, posted, bufs):
    recvs = {}
    for c, work, recv in posted:
        work.wait()
        recvs[c] = recv
    for field, cls, _add, pos, idx in ex["recv"]["fields"]:
        bufs[field].index_copy_(0, idx, recvs[cls].index_select(0, pos))


def _unpack_out(apply, posted_by_chunk, bufs):
    """Waits for every chunk's Out sub-messages and applies them in the schedule's fixed order, so
    the fp32 sums of dK/dV do not depend on arrival order."""
    per_class = {}
    for posted in posted_by_chunk:
        for c, work, recv in posted:
            work.wait()
            per_class.setdefault(c, []).append(recv)
    cat = {c: torch.cat(v) for c, v in per_class.items()}
    for field, cls, add, pos, idx in apply:
        rows = cat[cls].index_select(0, pos)
        if add:
            bufs[field].index_add_(0, idx, rows)
        else:
            bufs[field].index_copy_(0, idx, rows)


def _ptrs(bufs):
    return {name: (t.data_ptr(), t.shape[0]) for name, t in bufs.items()}


def _post_cpu(rt, phase, m, bufs, dtype, d):
    """CPU: packs one (phase, chunk)'s sub-messages with the C++ programs and posts them."""
    posted = []
    data_bytes = torch.empty(0, dtype=dtype).element_size()
    ptrs = _ptrs(bufs)
    for c in _PHASE_CLASSES[phase]:
        dt, width = _class_layout(c, dtype, d)
        send_splits, recv_splits = rt.splits[(phase, m, c)]
        send = torch.empty((sum(send_splits), width), dtype=dt)
        rt.programs.pack(phase, m, c, ptrs, send.data_ptr(), send.shape[0], data_bytes)
        recv = torch.empty((sum(recv_splits), width), dtype=dt)
        work = _a2a(recv, send, recv_splits, send_splits, rt.group)
        posted.append((c, _watch(rt, work, f"{_PHASE_NAMES[phase]} chunk {m} class {c}"), recv))
    return posted


def _unpack_in_cpu(rt, phase, m, posted, bufs, dtype):
    data_bytes = torch.empty(0, dtype=dtype).element_size()
    ptrs = _ptrs(bufs)
    for c, work, recv in posted:
        work.wait()
        rt.programs.unpack(phase, m, c, ptrs, recv.data_ptr(), recv.shape[0], data_bytes)


def _unpack_out_cpu(rt, phase, posted_by_chunk, bufs, dtype):
    data_bytes = torch.empty(0, dtype=dtype).element_size()
    ptrs = _ptrs(bufs)
    per_class = {}
    for posted in posted_by_chunk:
        for c, work, recv in posted:
            work.wait()
            per_class.setdefault(c, []).append(recv)
    for c, recvs in per_class.items():
        rt.programs.apply(phase, c, ptrs, [(r.data_ptr(), r.shape[0]) for r in recvs], data_bytes)


# ---------------------------------------------------------------- kernels

def _kernel_dtype(t):
    if t.dtype == torch.float32:
        return "fp32"
    if t.dtype == torch.bfloat16:
        return "bf16"
    raise ValueError(f"libra.torch.attention: CPU tensors must be float32 or bfloat16, got {t.dtype}")


def _view(buf, prog):
    """Kernel view (data_ptr, dtype, rows, heads, width, row_stride) of a [vectors, width] buffer
    addressed by a strided program (offset, rows, run, stride) over head vectors."""
    offset, rows, run, stride = prog
    # The kernel checks fragments against the view, not the view against the memory behind it.
    if offset < 0 or run < 0 or (rows > 0 and offset + (rows - 1) * stride + run > buf.shape[0]):
        raise RuntimeError(f"libra.torch: kernel view {tuple(prog)} lies outside its buffer of {buf.shape[0]} vectors")
    width = buf.shape[1]
    return (buf.data_ptr() + offset * width * buf.element_size(), _kernel_dtype(buf), rows, run, width,
            stride * width)


def _sources(call, home, comp):
    """A kernel call's (q program, kv program, fragments, Q-family buffers, KV-family buffers): a call
    with q_home (kv_home) reads and writes the home buffers of that family in place, else the compute
    buffers (libra/schedule.hpp, "Data read in place")."""
    qp, kp, frags, q_home, kv_home = call
    return qp, kp, frags, home if q_home else comp, home if kv_home else comp


def _cpu_forward(calls, home, comp, window, scale, threads):
    for call in calls:
        qp, kp, frags, bq, bk = _sources(call, home, comp)
        _libra.kernel_forward(_view(bq["Q"], qp), _view(bk["K"], kp), _view(bk["V"], kp), _view(bq["O"], qp),
                              _view(bq["LSE"], qp), frags, window, scale, threads)


def _cpu_backward(calls, home, comp, window, scale, threads):
    for call in calls:
        qp, kp, frags, bq, bk = _sources(call, home, comp)
        _libra.kernel_backward(_view(bq["Q"], qp), _view(bk["K"], kp), _view(bk["V"], kp), _view(bq["O"], qp),
                               _view(bq["dO"], qp), _view(bq["LSE"], qp), _view(bq["dQ"], qp),
                               _view(bk["dK"], kp), _view(bk["dV"], kp), frags, window, scale, threads)


def _flash_attn():
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: PLC0415
    except ImportError as e:
        raise RuntimeError("libra.torch.attention: CUDA tensors need the flash_attn package "
                           "(flash_attn_varlen_func), which is not importable: " + str(e)) from None
    return flash_attn_varlen_func


def _vectors(prog, rows_idx, device):
    """Head-vector indices [len(rows_idx), run] of rows rows_idx under a strided program."""
    offset, _rows, run, stride = prog
    return offset + rows_idx[:, None] * stride + torch.arange(run, device=device)[None, :]


def _cuda_call_meta(rt, pass_index, m, device):
    """Per kernel call of chunk ``m``: (q_home, kv_home, q vectors, kv vectors, cu_seqlens_q, cu_seqlens_k,
    max_seqlen_q, max_seqlen_k) as flash_attn_varlen_func takes them. Fixed by the schedule, so built
    once per (pass, chunk, device) and kept on the runtime: every layer and step reuses them instead of
    copying index arrays to the device per call."""
    key = (pass_index, m, device)
    meta = rt._cuda_meta.get(key)
    if meta is not None:
        return meta
    calls = rt.schedule["calls"][pass_index][m]
    # Forward and backward run the same calls (same tiles, same buffers): one set of index tensors
    # serves both, which halves their device memory (90-112 MiB a worker at 256K tokens, CP 8).
    other = rt._cuda_meta.get((1 - pass_index, m, device))
    if other is not None and _same_calls(calls, rt.schedule["calls"][1 - pass_index][m]):
        rt._cuda_meta[key] = other
        return other
    meta = []
    for call in calls:
        qp, kp, frags, q_home, kv_home = call
        f = np.asarray(frags, dtype=np.int64)
        nq, nk = f[:, 4] - f[:, 3], f[:, 4]  # per fragment: queries [a, e), keys 0 .. e-1
        q_rows = np.concatenate([np.arange(r, r + n) for r, n in zip(f[:, 0], nq)])
        k_rows = np.concatenate([np.arange(r, r + n) for r, n in zip(f[:, 1], nk)])
        qv = _vectors(qp, torch.from_numpy(q_rows).to(device), device)
        kv = _vectors(kp, torch.from_numpy(k_rows).to(device), device)
        cu_q = torch.from_numpy(np.concatenate([[0], np.cumsum(nq)]).astype(np.int32)).to(device)
        cu_k = torch.from_numpy(np.concatenate([[0], np.cumsum(nk)]).astype(np.int32)).to(device)
        meta.append((bool(q_home), bool(kv_home), qv, kv, cu_q, cu_k, int(nq.max()), int(nk.max())))
    rt._cuda_meta[key] = meta
    return meta


def _same_calls(a, b):
    return len(a) == len(b) and all(
        x[3] == y[3] and x[4] == y[4] and tuple(x[0]) == tuple(y[0]) and tuple(x[1]) == tuple(y[1])
        and np.array_equal(np.asarray(x[2]), np.asarray(y[2])) for x, y in zip(a, b))


def _cuda_calls(meta, home, comp, window, scale):
    """Runs a chunk's calls (their _cuda_call_meta) with flash_attn_varlen_func (differentiable) on the
    Q, K, V of `home` and `comp` (each call reads the buffers its flags name); returns
    [(q_home, q vectors, o)]."""
    fn = _flash_attn()
    ws = (-1, -1) if window is None else (int(window) - 1, 0)
    out = []
    for q_home, kv_home, qv, kv, cu_q, cu_k, max_q, max_k in meta:
        bq, bk = home if q_home else comp, home if kv_home else comp
        o = fn(bq["Q"][qv], bk["K"][kv], bk["V"][kv], cu_q, cu_k, max_q, max_k,
               softmax_scale=scale, causal=True, window_size=ws)
        out.append((q_home, qv, o))
    return out


# ---------------------------------------------------------------- attention

class _Attention(torch.autograd.Function):
    """libra's pipelined executor on torch tensors (libra/schedule.hpp's loop).

    Each pass, per chunk m: post in(m) for every chunk up front, wait in(m),
    unpack, compute the chunk's kernel calls, pack and post out(m); then wait
    every out and apply them in the schedule's fixed order. Forward: Q, K, V
    in; O, LSE out. Backward: Q, dO, O, LSE, K, V in; dQ assigned and fp32
    dK/dV partial sums added at home. Calls flagged q_home / kv_home read and
    write the home tensors in place instead of compute buffers. Only the home
    tensors are saved between the passes.
    """

    @staticmethod
    def forward(ctx, q, k, v, rt, scale):
        d, dt, dev = rt.head_dim, q.dtype, q.device
        sd = rt.schedule
        cq, ckv = sd["compute_q_vectors"], sd["compute_kv_vectors"]
        home = {"Q": q.view(-1, d), "K": k.view(-1, d), "V": v.view(-1, d),
                "O": torch.zeros_like(q).view(-1, d),
                "LSE": torch.zeros((q.shape[0] * q.shape[1], 1), dtype=torch.float32, device=dev)}
        comp = {"Q": q.new_zeros((cq, d)), "K": q.new_zeros((ckv, d)), "V": q.new_zeros((ckv, d)),
                "O": q.new_zeros((cq, d)), "LSE": torch.zeros((cq, 1), dtype=torch.float32, device=dev)}
        _run_pass(rt, _FWD_IN, _FWD_OUT, 0, home, comp, dt, d, dev, scale)
        o = home["O"].view(q.shape)
        ctx.rt, ctx.scale, ctx.lse = rt, scale, home["LSE"]
        ctx.save_for_backward(q, k, v, o)
        return o

    @staticmethod
    def backward(ctx, do):
        rt, scale = ctx.rt, ctx.scale
        q, k, v, o = ctx.saved_tensors
        o, lse = o.view(-1, rt.head_dim), ctx.lse
        d, dt, dev = rt.head_dim, q.dtype, q.device
        sd = rt.schedule
        cq, ckv = sd["compute_q_vectors"], sd["compute_kv_vectors"]
        f32 = dict(dtype=torch.float32, device=dev)
        home = {"Q": q.view(-1, d), "K": k.view(-1, d), "V": v.view(-1, d), "O": o, "LSE": lse,
                "dO": do.contiguous().view(-1, d).to(dt), "dQ": torch.zeros((q.numel() // d, d), **f32),
                "dK": torch.zeros((k.numel() // d, d), **f32), "dV": torch.zeros((v.numel() // d, d), **f32)}
        comp = {n: q.new_zeros((cq if n in ("Q", "O", "dO") else ckv, d)) for n in ("Q", "K", "V", "O", "dO")}
        comp["LSE"] = torch.zeros((cq, 1), **f32)
        comp["dQ"] = torch.zeros((cq, d), **f32)
        comp["dK"] = torch.zeros((ckv, d), **f32)
        comp["dV"] = torch.zeros((ckv, d), **f32)
        _run_pass(rt, _BWD_IN, _BWD_OUT, 1, home, comp, dt, d, dev, scale)
        return (home["dQ"].view(q.shape).to(dt), home["dK"].view(k.shape).to(dt), home["dV"].view(v.shape).to(dt),
                None, None)


# Test-only: "flash" makes every pass take the CUDA tensors' path (flash_attn_varlen_func, as
# _flash_attn returns it, and the index-tensor exchanges) whatever the tensors' device, so the tests
# run that path on CPU with a stand-in for flash_attn. None: CUDA tensors take it, CPU tensors not.
_compute_backend = None


def _run_pass(rt, phase_in, phase_out, pass_index, home, comp, dt, d, dev, scale):
    window = _libra.FULL_CAUSAL if rt.window is None else int(rt.window)
    calls = rt.schedule["calls"][pass_index]
    if _compute_backend not in (None, "flash"):
        raise ValueError(f"libra.torch._compute_backend {_compute_backend!r} must be None or 'flash'")
    on_gpu = dev.type == "cuda" or _compute_backend == "flash"
    cuda = on_gpu or rt.exchange == "index"  # index-tensor exchanges
    if cuda:
        ix = rt.on(dev)
        ins, outs = ix["phases"][phase_in]["chunks"], ix["phases"][phase_out]["chunks"]
        posted_in = [_post(rt, phase_in, m, ex, home, dt, d, dev) for m, ex in enumerate(ins)]
    else:
        posted_in = [_post_cpu(rt, phase_in, m, home, dt, d) for m in range(rt.num_chunks)]
    posted_out = []
    for m in range(rt.num_chunks):
        if cuda:
            _unpack_in(ins[m], posted_in[m], comp)
        else:
            _unpack_in_cpu(rt, phase_in, m, posted_in[m], comp, dt)
        with _compute(rt, f"{'fwd' if pass_index == 0 else 'bwd'} compute chunk {m}"):
            if on_gpu:
                _cuda_pass(rt, pass_index, m, home, comp, scale or None)
            elif pass_index == 0:
                _cpu_forward(calls[m], home, comp, window, scale, rt.threads)
            else:
                _cpu_backward(calls[m], home, comp, window, scale, rt.threads)
        if cuda:
            posted_out.append(_post(rt, phase_out, m, outs[m], comp, dt, d, dev))
        else:
            posted_out.append(_post_cpu(rt, phase_out, m, comp, dt, d))
    if cuda:
        _unpack_out(ix["phases"][phase_out]["apply"], posted_out, home)
    else:
        _unpack_out_cpu(rt, phase_out, posted_out, home, dt)


def _cuda_pass(rt, pass_index, m, home, comp, scale):
    meta = _cuda_call_meta(rt, pass_index, m, home["Q"].device)
    if not meta:
        return
    window = rt.window
    bufs = {True: home, False: comp}  # by a call's q_home / kv_home
    if pass_index == 0:
        with torch.no_grad():
            for q_home, qv, o in _cuda_calls(meta, home, comp, window, scale):
                dst = bufs[q_home]["O"]
                dst[qv] = o.to(dst.dtype)
        return
    # Backward: flash_attn's own backward, through autograd on a recomputed forward, with one leaf
    # per buffer the calls read (home or compute Q; K and V), each gradient added where the kernel
    # would add it (dQ of a row is computed once, so adding into the zeroed dQ assigns it).
    read = sorted({(c[0], "Q") for c in meta} | {(c[1], n) for c in meta for n in ("K", "V")})
    with torch.enable_grad():
        leaves = {key: bufs[key[0]][key[1]].detach().requires_grad_() for key in read}
        src = {where: {n: leaves.get((where, n)) for n in ("Q", "K", "V")} for where in (True, False)}
        res = _cuda_calls(meta, src[True], src[False], window, scale)
        grads = torch.autograd.grad([o for _, _, o in res], [leaves[key] for key in read],
                                    [bufs[q_home]["dO"][qv] for q_home, qv, _ in res], allow_unused=True)
    for (where, n), g in zip(read, grads):
        if g is not None:
            bufs[where]["d" + n] += g.float()


def _call_problem(q, k, v, rt, window):
    """What is wrong with an attention call's arguments, or None."""
    if window != rt.window:
        return f"window {window} differs from the plan's window {rt.window}"
    want_q = (rt.home_rows, rt.heads_q, rt.head_dim)
    want_kv = (rt.home_rows, rt.heads_kv, rt.head_dim)
    for name, t, want in (("q", q, want_q), ("k", k, want_kv), ("v", v, want_kv)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != want:
            shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            return f"{name} has shape {shape} but the plan needs {list(want)}"
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        return "q, k and v must share dtype and device"
    if not q.is_cuda and q.dtype not in (torch.float32, torch.bfloat16):
        return f"CPU tensors must be float32 or bfloat16, got {q.dtype}"
    if q.is_cuda and q.dtype not in (torch.float16, torch.bfloat16):
        return f"CUDA tensors must be float16 or bfloat16 (flash_attn's types), got {q.dtype}"
    return None


def attention(q, k, v, runtime, softmax_scale=None, window=None):
    """Core attention of this worker's home tokens under ``runtime``'s plan; differentiable.

    q: [L/cp, h_q, d]; k, v: [L/cp, h_kv, d] (THD, this worker's home rows of
    its slot's packed sequence); returns o like q. ``window`` must equal the
    plan's (None: plain causal); the masks are bottom-right causal per sample.
    """
    if not isinstance(runtime, PlanRuntime):
        raise ValueError("libra.torch.attention: runtime must be a libra.torch.PlanRuntime")
    rt = runtime
    problem = _call_problem(q, k, v, rt, window)
    if rt.check_calls:
        # One small collective so that a bad call on one rank fails on every rank with the same line
        # instead of leaving the others waiting in the exchange (PlanRuntime(check_calls=False) skips it).
        flag = torch.tensor([0 if problem is None else 1], dtype=torch.int64)
        dist.all_reduce(flag, group=rt.group)
        if int(flag[0]):
            msgs = [None] * dist.get_world_size(rt.group)
            dist.all_gather_object(msgs, problem, group=rt.group)
            first = next(i for i, m in enumerate(msgs) if m is not None)
            raise ValueError(f"libra.torch.attention: group rank {first}: {msgs[first]}")
    elif problem is not None:
        raise ValueError(f"libra.torch.attention: {problem}")
    if q.is_cuda:
        _flash_attn()
    scale = 0.0 if softmax_scale is None else float(softmax_scale)
    return _Attention.apply(q.contiguous(), k.contiguous(), v.contiguous(), runtime, scale)
