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
import concurrent.futures
import threading

import numpy as np
import torch
import torch.distributed as dist

from . import _libra, make_plan
from . import schedule as _schedule

__all__ = ["pool_group", "PlacementBatchSampler", "PlanRuntime", "Planner", "attention"]

_POOLS = {}  # id(group) -> (group, workers by group rank)


def _world():
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("libra.torch: torch.distributed is not initialised (call init_process_group first)")
    return dist.get_world_size(), dist.get_rank()


def pool_group(pool_size, cp):
    """Collective over the default group: returns (this rank's pool group, its worker index)."""
    world, rank = _world()
    if pool_size < 1 or cp < 1:
        raise ValueError(f"pool_group: pool_size {pool_size} and cp {cp} must be >= 1")
    if world % (pool_size * cp) != 0:
        raise ValueError(f"pool_group: world size {world} must be divisible by pool_size * cp = {pool_size * cp}")
    n = pool_size * cp
    mine = None
    for k in range(world // n):
        ranks = list(range(k * n, (k + 1) * n))
        g = dist.new_group(ranks)  # every rank creates every group, in the same order
        if rank in ranks:
            mine = (g, ranks)
    group, ranks = mine
    # new_group orders group ranks by global rank.
    workers = [(x // cp % pool_size) * cp + x % cp for x in sorted(ranks)]
    _POOLS[id(group)] = (group, workers)
    return group, workers[sorted(ranks).index(rank)]


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
    starts planning batch n+1. make_plan releases the GIL, so planning and
    training run at once. Keyword arguments are those of libra.make_plan.
    """

    def __init__(self, sampler, **plan_kwargs):
        self._sampler = sampler
        self._kw = plan_kwargs
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="libra-planner")
        self._futures = {}

    def _submit(self, n):
        if n < len(self._sampler) and n not in self._futures:
            pool = self._sampler.pool(n)
            self._futures[n] = self._pool.submit(make_plan, pool, **self._kw)

    def get(self, n):
        self._submit(n)
        plan = self._futures.pop(n).result()
        for old in [k for k in self._futures if k < n]:
            self._futures.pop(old).cancel()
        self._submit(n + 1)
        return plan

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

    def __init__(self, plan, group, worker=None, threads=1):
        entry = _POOLS.get(id(group))
        if entry is None and worker is None:
            raise ValueError("PlanRuntime: group was not made by libra.torch.pool_group; pass worker=")
        size = dist.get_world_size(group)
        if size != plan.num_workers:
            raise ValueError(f"PlanRuntime: the group has {size} ranks but the plan has {plan.num_workers} workers")
        me = entry[1][dist.get_rank(group)] if worker is None else int(worker)
        mine = torch.tensor(_fingerprint_words(plan.fingerprint) + [me], dtype=torch.int64)
        everyone = [torch.zeros(3, dtype=torch.int64) for _ in range(size)]
        dist.all_gather(everyone, mine, group=group)
        fps = [(int(t[0]) << 32) | int(t[1]) for t in everyone]
        peers = [int(t[2]) for t in everyone]
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
        cfg = plan.config
        self.window = cfg["window"]
        self.schedule = s = _schedule.build(plan, me, peers)

        def t(a):
            return torch.from_numpy(np.ascontiguousarray(a))

        self.self_src, self.self_dst = t(s.self_src), t(s.self_dst)
        self.dkv_send_index, self.dkv_recv_index = t(s.dkv_send_index), t(s.dkv_recv_index)
        self.chunks = []
        for c in s.chunks:
            self.chunks.append({
                "send_index": t(c.send_index), "send_splits": c.send_splits, "recv_splits": c.recv_splits,
                "q_send_index": t(c.q_send_index), "q_send_splits": c.q_send_splits,
                "q_recv_splits": c.q_recv_splits, "q_select": t(c.q_select),
                "kv_recv_k": t(c.kv_recv_k), "kv_recv_v": t(c.kv_recv_v), "kv_store": t(c.kv_store),
                "calls": c.calls,
            })

    def on(self, device):
        """The chunk index tensors on ``device`` (cached)."""
        device = torch.device(device)
        if device.type == "cpu":
            return self.chunks
        cache = self.__dict__.setdefault("_on", {})
        if device not in cache:
            cache[device] = [{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
                             for c in self.chunks]
        return cache[device]

    @property
    def fingerprint(self):
        return self.plan.fingerprint


# ---------------------------------------------------------------- transfers

def _wire(x):
    """gloo has no bf16: send 16-bit floats as their bytes."""
    return x.view(torch.uint8) if x.dtype in (torch.bfloat16, torch.float16) else x


def _a2a(out, inp, out_splits, in_splits, group):
    """Async all_to_all_single of row buffers (splits count rows); returns the work."""
    return dist.all_to_all_single(_wire(out), _wire(inp), list(out_splits), list(in_splits), group=group,
                                  async_op=True)


def _rows(x, d):
    return x.reshape(-1, d)


# ---------------------------------------------------------------- kernels

def _view(t, dtype_name, head_offset, heads, row_stride_heads):
    """A kernel view of a [rows, H, d] tensor's heads [head_offset, head_offset + heads)."""
    d = t.shape[-1]
    return (t.data_ptr() + head_offset * d * t.element_size(), dtype_name, t.shape[0], heads, d,
            row_stride_heads * d)


def _kernel_dtype(t):
    if t.dtype == torch.float32:
        return "fp32"
    if t.dtype == torch.bfloat16:
        return "bf16"
    raise ValueError(f"libra.torch.attention: CPU tensors must be float32 or bfloat16, got {t.dtype}")


class _CpuKernel:
    @staticmethod
    def forward(calls, qw, ks, vs, ow, lse, window, scale, threads):
        dq = _kernel_dtype(qw)
        dk = _kernel_dtype(ks)
        H, S = qw.shape[1], ks.shape[1]
        for (qo, qn, kvo, kn), frags in calls:
            _libra.kernel_forward(_view(qw, dq, qo, qn, H), _view(ks, dk, kvo, kn, S), _view(vs, dk, kvo, kn, S),
                                  _view(ow, dq, qo, qn, H), _view(lse, "fp32", qo, qn, H), frags, window, scale,
                                  threads)

    @staticmethod
    def backward(calls, qw, ks, vs, ow, dow, lse, dqw, dks, dvs, window, scale, threads):
        dq = _kernel_dtype(qw)
        dk = _kernel_dtype(ks)
        H, S = qw.shape[1], ks.shape[1]
        for (qo, qn, kvo, kn), frags in calls:
            _libra.kernel_backward(_view(qw, dq, qo, qn, H), _view(ks, dk, kvo, kn, S), _view(vs, dk, kvo, kn, S),
                                   _view(ow, dq, qo, qn, H), _view(dow, dq, qo, qn, H), _view(lse, "fp32", qo, qn, H),
                                   _view(dqw, "fp32", qo, qn, H), _view(dks, "fp32", kvo, kn, S),
                                   _view(dvs, "fp32", kvo, kn, S), frags, window, scale, threads)


def _flash_attn():
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: PLC0415
    except ImportError as e:
        raise RuntimeError("libra.torch.attention: CUDA tensors need the flash_attn package "
                           "(flash_attn_varlen_func), which is not importable: " + str(e)) from None
    return flash_attn_varlen_func


def _cuda_call(qw, ks, vs, key, frags, window, scale):
    """One kernel call on CUDA through flash_attn_varlen_func; differentiable (autograd)."""
    fn = _flash_attn()
    (qo, qn, kvo, kn) = key
    f = torch.as_tensor(frags, device=qw.device)
    q_idx = torch.cat([torch.arange(int(r[0]), int(r[0]) + int(r[4] - r[3]), device=qw.device) for r in frags])
    k_idx = torch.cat([torch.arange(int(r[1]), int(r[1]) + int(r[4]), device=qw.device) for r in frags])
    lq = f[:, 4] - f[:, 3]
    lk = f[:, 4]
    cu_q = torch.zeros(len(frags) + 1, dtype=torch.int32, device=qw.device)
    cu_k = torch.zeros(len(frags) + 1, dtype=torch.int32, device=qw.device)
    cu_q[1:] = torch.cumsum(lq, 0)
    cu_k[1:] = torch.cumsum(lk, 0)
    q = qw[q_idx, qo:qo + qn]
    k = ks[k_idx, kvo:kvo + kn]
    v = vs[k_idx, kvo:kvo + kn]
    ws = (-1, -1) if window is None else (int(window) - 1, 0)
    o = fn(q, k, v, cu_q, cu_k, int(lq.max()), int(lk.max()), softmax_scale=scale, causal=True, window_size=ws)
    return q_idx, o


# ---------------------------------------------------------------- attention

class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, rt, scale):
        s = rt.schedule
        d = s.head_dim
        cw = s.chunk_heads
        window = _libra.FULL_CAUSAL if rt.window is None else int(rt.window)
        cuda = q.is_cuda
        src = torch.cat([_rows(q, d), _rows(k, d), _rows(v, d)])
        works, recvs = [], []
        for c in rt.chunks:
            send = src.index_select(0, c["send_index"].to(src.device))
            recv = src.new_empty((sum(c["recv_splits"]), d))
            works.append(_a2a(recv, send, c["recv_splits"], c["send_splits"], rt.group))
            recvs.append(recv)
        store_rows = s.store_tokens * s.store_heads
        ks = src.new_zeros((store_rows, d))
        vs = src.new_zeros((store_rows, d))
        kf, vf = _rows(k, d), _rows(v, d)
        if len(rt.self_src):
            ks.index_copy_(0, rt.self_dst, kf.index_select(0, rt.self_src))
            vs.index_copy_(0, rt.self_dst, vf.index_select(0, rt.self_src))
        ks3 = ks.view(s.store_tokens, s.store_heads, d)
        vs3 = vs.view(s.store_tokens, s.store_heads, d)
        saved_q, saved_o, saved_lse, o_works, o_recvs = [], [], [], [], []
        for c, w, recv in zip(rt.chunks, works, recvs):
            w.wait()
            if len(c["kv_store"]):
                ks.index_copy_(0, c["kv_store"], recv.index_select(0, c["kv_recv_k"]))
                vs.index_copy_(0, c["kv_store"], recv.index_select(0, c["kv_recv_v"]))
            qw = recv.index_select(0, c["q_select"]).view(-1, cw, d)
            ow = torch.zeros_like(qw)
            lse = torch.zeros((qw.shape[0], cw, 1), dtype=torch.float32, device=q.device)
            if cuda:
                for key, frags in c["calls"]:
                    rows, out = _cuda_call(qw, ks3, vs3, key, frags, rt.window, scale or None)
                    ow[rows, key[0]:key[0] + key[1]] = out
            else:
                _CpuKernel.forward(c["calls"], qw, ks3, vs3, ow, lse, window, scale, rt.threads)
            o_recv = q.new_empty((sum(c["q_send_splits"]), d))
            o_works.append(_a2a(o_recv, ow.view(-1, d), c["q_send_splits"], c["q_recv_splits"], rt.group))
            o_recvs.append(o_recv)
            saved_q.append(qw)
            saved_o.append(ow)
            saved_lse.append(lse)
        o = torch.zeros_like(q)
        of = o.view(-1, d)
        for c, w, r in zip(rt.chunks, o_works, o_recvs):
            w.wait()
            of.index_copy_(0, c["q_send_index"], r)
        ctx.rt, ctx.scale, ctx.window = rt, scale, window
        ctx.fwd = (saved_q, saved_o, saved_lse, ks3, vs3)
        ctx.shapes = (q.shape, k.shape, q.dtype)
        return o

    @staticmethod
    def backward(ctx, do):
        rt = ctx.rt
        s = rt.schedule
        d, cw = s.head_dim, s.chunk_heads
        saved_q, saved_o, saved_lse, ks3, vs3 = ctx.fwd
        if do.is_cuda:
            raise RuntimeError("libra.torch.attention: the CUDA backward pass is not implemented")
        qshape, kshape, dtype = ctx.shapes
        dof = do.contiguous().view(-1, d)
        works, recvs = [], []
        for c in rt.chunks:
            send = dof.index_select(0, c["q_send_index"])
            recv = dof.new_empty((sum(c["q_recv_splits"]), d))
            works.append(_a2a(recv, send, c["q_recv_splits"], c["q_send_splits"], rt.group))
            recvs.append(recv)
        dks = torch.zeros(ks3.shape, dtype=torch.float32)
        dvs = torch.zeros(vs3.shape, dtype=torch.float32)
        dq_works, dq_recvs = [], []
        for i, (c, w, recv) in enumerate(zip(rt.chunks, works, recvs)):
            w.wait()
            dow = recv.view(-1, cw, d)
            dqw = torch.zeros(dow.shape, dtype=torch.float32)
            _CpuKernel.backward(c["calls"], saved_q[i], ks3, vs3, saved_o[i], dow, saved_lse[i], dqw, dks, dvs,
                                ctx.window, ctx.scale, rt.threads)
            dq_recv = torch.empty((sum(c["q_send_splits"]), d), dtype=torch.float32)
            dq_works.append(_a2a(dq_recv, dqw.view(-1, d), c["q_send_splits"], c["q_recv_splits"], rt.group))
            dq_recvs.append(dq_recv)
        # dK/dV partial sums go back to the workers whose home tokens they belong to.
        dstore = torch.cat([dks.view(-1, d), dvs.view(-1, d)])
        dsend = dstore.index_select(0, rt.dkv_send_index)
        drecv = torch.empty((sum(s.dkv_recv_splits), d), dtype=torch.float32)
        dkv_work = _a2a(drecv, dsend, s.dkv_recv_splits, s.dkv_send_splits, rt.group)
        k_rows = s.k_rows
        dkv = torch.zeros((2 * k_rows, d), dtype=torch.float32)
        if len(rt.self_src):
            dkv.index_add_(0, rt.self_src, dks.view(-1, d).index_select(0, rt.self_dst))
            dkv.index_add_(0, k_rows + rt.self_src, dvs.view(-1, d).index_select(0, rt.self_dst))
        dq = torch.zeros((qshape[0] * qshape[1], d), dtype=torch.float32)
        for c, w, r in zip(rt.chunks, dq_works, dq_recvs):
            w.wait()
            dq.index_copy_(0, c["q_send_index"], r)
        dkv_work.wait()
        dkv.index_add_(0, rt.dkv_recv_index, drecv)
        dk = dkv[:k_rows].view(kshape).to(dtype)
        dv = dkv[k_rows:].view(kshape).to(dtype)
        return dq.view(qshape).to(dtype), dk, dv, None, None


def attention(q, k, v, runtime, softmax_scale=None, window=None):
    """Core attention of this worker's home tokens under ``runtime``'s plan; differentiable.

    q: [L/cp, h_q, d]; k, v: [L/cp, h_kv, d] (THD, this worker's home rows of
    its slot's packed sequence); returns o like q. ``window`` must equal the
    plan's (None: plain causal); the masks are bottom-right causal per sample.
    """
    if not isinstance(runtime, PlanRuntime):
        raise ValueError("libra.torch.attention: runtime must be a libra.torch.PlanRuntime")
    s = runtime.schedule
    if window != runtime.window:
        raise ValueError(f"libra.torch.attention: window {window} differs from the plan's window {runtime.window}")
    want_q = (s.home_rows, s.heads_q, s.head_dim)
    want_kv = (s.home_rows, s.heads_kv, s.head_dim)
    for name, t, want in (("q", q, want_q), ("k", k, want_kv), ("v", v, want_kv)):
        if tuple(t.shape) != want:
            raise ValueError(f"libra.torch.attention: {name} has shape {list(t.shape)} but the plan needs {list(want)}")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise ValueError("libra.torch.attention: q, k and v must share dtype and device")
    if q.is_cuda:
        _flash_attn()
    elif q.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"libra.torch.attention: CPU tensors must be float32 or bfloat16, got {q.dtype}")
    scale = 0.0 if softmax_scale is None else float(softmax_scale)
    return _Attention.apply(q.contiguous(), k.contiguous(), v.contiguous(), runtime, scale)
