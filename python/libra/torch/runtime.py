"""PlanRuntime: one micro-batch's plan bound to one pool group (collective construction)."""
import datetime
import itertools
import math
import operator
import weakref

import numpy as np
import torch

from .. import _libra
from . import comms
from .groups import _POOLS
from .index import ALL_KINDS, EXCHANGE_KINDS, host_arrays, nbytes, to_device


class _Schedule(dict):
    """The program's summary (``RankProgram.summary``), with its kernel calls (``info["calls"]``, every
    fragment: tests and checks read them) fetched on first read."""

    def __init__(self, summary, program):
        super().__init__(summary)
        self._program = program

    def __missing__(self, key):
        if key != "calls":
            raise KeyError(key)
        value = self["calls"] = self._program.info["calls"]
        return value


def _kinds(backend):
    """(forward's, backward's) index records a backend reads (index.to_device): a varlen backend the
    joined calls (the separate pairs where it recomputes the backward), a buffers backend the
    descriptor tables."""
    if backend is None:
        return ALL_KINDS, ALL_KINDS
    if backend.kind == "buffers":
        return (EXCHANGE_KINDS + ("descriptors", "descriptors_host"),) * 2
    return EXCHANGE_KINDS + ("joined",), EXCHANGE_KINDS + ("joined" if backend.has_backward() else "varlen",)


def _fingerprint_words(fp):
    return [int(fp >> 32), int(fp & 0xFFFFFFFF)]


class PlanRuntime:
    """One micro-batch's plan on one pool group, shared by every layer and by backward.

    Construction is collective over ``group``: every option is checked
    before anything is posted, then the ranks exchange their plan
    fingerprints, worker indices and any rank's own error, and every rank
    raises the same one-line ValueError when one rank's options are bad or
    the ranks disagree. The worker's schedule is then precomputed as index
    tensors.

    ``timeout`` (seconds, default 300) becomes the group's own collective
    timeout (``ProcessGroup.set_timeout``) and bounds this agreement,
    ``attention``'s call check and every exchange: when a peer sends nothing
    within it, the other ranks raise a one-line TimeoutError naming it
    (within about twice the timeout: they wait that long again for each
    other's marks in the group's store). The group is unusable after that.

    ``relay`` (default False) sends cross-node inputs through node-mates
    chosen by ``libra.plan_relays`` (libra/relay.hpp): a stage exchange moves
    them over NVLink into the relay's staging buffer a chunk ahead, and the
    main exchange sends them on from there. Every rank must pass the same
    value (the agreement checks it); ``relayed`` says whether stage exchanges
    run (relay=True and the plan relays something).

    This rank's home layout (what its q, k, v rows are, in order), from the
    plan's home layout (``make_plan(..., home_layout=)``: "contiguous" or
    "zigzag"):

    - ``packed_rows``: int64 [home_rows], the row of the slot's packed
      sequence each home row holds (``x_home = x_packed[rt.packed_rows]``);
    - ``position_ids``: int64 [home_rows], each row's position in its sample
      (restarting at 0 per sample: what RoPE needs); padding rows count on
      from 0 as one more sample;
    - ``cu_seqlens``: int32 [n + 1], flash-attn style over the token rows
      [0, home_tokens), one segment per run of one sample's consecutive rows
      (a sample cut by the layout gives a segment per piece); padding
      excluded; ``max_seqlen`` its longest segment;
    - ``packed_cu_seqlens``: int32, the samples of the slot's whole packed
      sequence (TransformerEngine / Megatron ``PackedSeqParams`` style);
    - ``home_tokens`` (rows holding tokens: always the first ones) and
      ``padding_rows`` (the rest); ``home_layout``, ``slot``, ``cp_rank``.
    """

    def __init__(self, plan, group, worker=None, threads=1, trace=False, check_calls=True, schedule=None,
                 exchange="auto", timeout=300, relay=False):
        comm = comms.of(group)
        if comm is None:
            raise ValueError(f"PlanRuntime: group must be a torch.distributed ProcessGroup or an in-process group, "
                             f"got {type(group).__name__}")
        size = comm.size(group)
        # Every option is checked here, before anything is posted; a rank's own problem travels with
        # the agreement below, so every rank raises the same line instead of leaving the others waiting.
        problem, me, timeout = _check_options(comm, plan, group, size, worker, threads, trace, check_calls,
                                              schedule, exchange, timeout, relay)
        self.comm = comm
        self._native_timeout = comm.set_timeout(group, timeout)
        fp = plan.fingerprint if isinstance(plan, _libra.Plan) else 0
        nw = plan.num_workers if isinstance(plan, _libra.Plan) else 0
        # relay changes every rank's exchanges (the C++ schedule fingerprint mixes it in), so it is
        # agreed on with the plan: a rank alone with it would post collectives no peer joins.
        relay_word = int(relay) if isinstance(relay, bool) else -1
        # What needs no peer is read before the agreement (Planner's program's summary and home layout
        # views, the handle): a rank waits on its peers with it done, and leaves the wait with little
        # left to do (an in-process pool's threads, released together, then contend less for the GIL).
        if problem is None and schedule is not None:
            views = _program_views(schedule)
        self.op_handle = register(self)  # what torch.compile's libra::attention op takes in its place (ops.py)
        everyone, first = _agree(comm, group, _fingerprint_words(fp) + [me, nw, relay_word], problem, timeout,
                                 "PlanRuntime", self._native_timeout, array=True)
        if first is not None:
            raise ValueError(f"PlanRuntime: group rank {first[0]}: {first[1]}")
        # Every check below runs on what all ranks gathered, so they all raise the same line.
        peers = everyone[:, 2].tolist()
        _check_agreed(everyone, peers, size)
        self.timeout = timeout
        self.plan = plan
        self.group = group
        self.worker = me
        self.threads = int(threads)
        self.check_calls = check_calls
        # Accepted for compatibility: every device now carries out the same program with index ops.
        self.exchange = exchange
        # The trace of every attention call under this runtime (trace=True), in the C++ engine's format
        # (trace.py): (worker, name, lane, begin_us, end_us) per chunk's compute, exchange and wait.
        self.trace = [] if trace else None
        cp = plan.num_workers // plan.pool_size  # the plan's cp (its workers are pool_size x cp)
        # libra's per-rank flat program (libra/program.hpp), the peers in group-rank order (what
        # all_to_all_single's splits follow); Planner may have built it on its thread.
        progs = schedule
        if progs is not None:
            info = views[0]
            if (info["order"] != peers or info["worker"] != me or info["plan_fingerprint"] != plan.fingerprint
                    or info["relay"] != relay):
                progs = None
        if progs is None:
            progs = _libra.rank_program(plan, me, peers, relay=relay)
            views = _program_views(progs)
        info, lay, self.packed_rows, self.position_ids, self.cu_seqlens, self.packed_cu_seqlens = views
        self.relay = relay
        # Whether stage exchanges run: the same on every rank (plan_relays is a function of the plan).
        self.relayed = bool(info["relayed"])
        self.window = info["window"]  # the plan's (None: full causal), as its schedule holds it
        self.program, self.schedule = progs, info
        self.home_rows, self.heads_q, self.heads_kv = info["home_rows"], info["heads_q"], info["heads_kv"]
        self.head_dim, self.num_chunks = info["head_dim"], info["chunks"]
        self.home_layout, self.home_tokens = lay["home_layout"], lay["home_tokens"]
        self.padding_rows = self.home_rows - self.home_tokens
        self.slot, self.cp_rank = me // cp, me % cp
        self.max_seqlen = lay["max_seqlen"]
        self._position_on = {}  # position_ids of the token rows, by device (attention's check)
        self._peers = peers
        # Every index the passes use, as one int32 host array built by the binding without the GIL
        # (Planner's thread has usually built it already); on(device) copies it once per device.
        self._index_layout = None
        self._on = {}
        self._index_on = {}  # device -> the device copy of the index arrays (the views' storage)
        self._varlen_meta = {}  # the varlen backends' merged calls (index.Pair), by (pass, chunk, device, kind)

    def on(self, device, backend=None):
        """The program's index arrays on ``device`` (one copy per device; index.to_device), with the
        records ``backend`` reads made at once (every kind when None; others when first read)."""
        device = torch.device(device)
        if device not in self._on:
            kinds = _kinds(backend)
            host, self._index_layout = host_arrays(self.program, kinds)
            self._on[device], self._index_on[device] = to_device(host, self._index_layout, device, kinds,
                                                                 self.program)
        return self._on[device]

    def index_bytes(self, device):
        """Device memory the index arrays take on ``device`` (after ``on(device)``)."""
        return nbytes(self._index_on[torch.device(device)])

    @property
    def fingerprint(self):
        return self.plan.fingerprint

    def _deadline(self, work, name):
        """``work`` (an async collective just posted on the group) with this runtime's timeout: its
        ``wait()`` raises one line naming the silent rank instead of blocking."""
        return _Timed(self.comm, self.group, work, _next_seq(self.group), self.timeout,
                      f"libra.torch.attention: {name}", self._native_timeout)

    def _agree(self, problem, what):
        """Collective: this rank's problem (a line, or None) against every rank's; returns the first
        (group rank, line) any rank had, or None. Bounded by the timeout like every exchange."""
        return _agree(self.comm, self.group, [], problem, self.timeout, what, self._native_timeout)[1]

    def _agree_words(self, words, problem, what):
        """``_agree`` that also gathers ``words`` (int64s, as many on every rank): (the words by group
        rank, the first problem or None), in the same one collective."""
        return _agree(self.comm, self.group, words, problem, self.timeout, what, self._native_timeout)


def _program_views(program):
    """(the program's summary as the runtime's ``schedule``, its home layout, and the layout's
    packed_rows, position_ids, cu_seqlens and packed_cu_seqlens as CPU tensors): built with the
    program in C++ (without the GIL), taken as views of its arrays."""
    lay = program.home
    return (_Schedule(program.summary, program), lay, torch.from_numpy(lay["packed_rows"]),
            torch.from_numpy(lay["position_ids"]),
            torch.from_numpy(lay["cu_seqlens"]), torch.from_numpy(lay["packed_cu_seqlens"]))


def _check_agreed(everyone, peers, size):
    """Raises the same line on every rank unless the ranks' gathered words (int64 [size, 5]: the plan
    fingerprint's halves, the worker, the plan's workers, relay) hold one plan of ``size`` workers,
    one relay value, and a permutation of the workers; one pass of the binding's C++ over the words
    where they agree (the usual case), Python over them only to name a disagreement."""
    if _libra.plan_words_agree(everyone, size):
        return
    fp_same = bool((everyone[:, :2] == everyone[0, :2]).all())
    rows = everyone.tolist()
    if fp_same and rows[0][3] != size:
        raise ValueError(f"PlanRuntime: the group has {size} ranks but the plan has {rows[0][3]} workers")
    if not fp_same:
        counts = {}
        for i, t in enumerate(rows):
            counts.setdefault((t[0] << 32) | t[1], []).append(i)
        parts = "; ".join(f"group ranks {r} hold {f:016x}" for f, r in sorted(counts.items()))
        raise ValueError(f"plan fingerprint mismatch across the pool group: {parts}")
    relays = [t[4] for t in rows]
    if len(set(relays)) != 1:
        parts = "; ".join(f"group ranks {[i for i, x in enumerate(relays) if x == v]} pass relay={bool(v)}"
                          for v in sorted(set(relays)))
        raise ValueError(f"PlanRuntime: relay differs across the pool group ({parts}): every rank must pass "
                         f"the same value")
    raise ValueError(f"PlanRuntime: the group's worker indices {peers} are not a permutation of 0..{size - 1}")


# ---- handles: what torch.compile's custom op (ops.py) takes in place of a runtime

_RUNTIMES = weakref.WeakValueDictionary()  # handle -> PlanRuntime; a runtime dies with its micro-batch
_NEXT = itertools.count(1)


def register(runtime):
    """Gives ``runtime`` its handle, a 0-dim int64 CPU tensor (PlanRuntime's constructor calls this)."""
    n = next(_NEXT)
    _RUNTIMES[n] = runtime
    # From numpy: the same 0-dim int64 CPU tensor as torch.tensor(n), a fraction of its host time.
    return torch.from_numpy(np.array(n, dtype=np.int64))


def runtime_of(handle):
    """The live PlanRuntime of ``handle``."""
    rt = _RUNTIMES.get(int(handle))
    if rt is None:
        raise RuntimeError(f"libra::attention: no live PlanRuntime has handle {int(handle)}")
    return rt


# ---- option checks, agreement and deadlines (issue 21: no rank waits on a peer that will never come)

_SEQ = {}  # id(group) -> libra collectives posted on it so far (the same count on every rank)


def _next_seq(group):
    _SEQ[id(group)] = _SEQ.get(id(group), 0) + 1
    return _SEQ[id(group)]


def _number(value):
    return not isinstance(value, bool) and isinstance(value, (int, float)) or (
        type(value).__module__ == "numpy" and hasattr(value, "dtype") and value.dtype.kind in "iuf")


def _index(value):
    """value as an int (Python or numpy integers; not a bool), or None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _check_options(comm, plan, group, size, worker, threads, trace, check_calls, schedule, exchange, timeout,
                   relay=False):
    """(this rank's first problem or None, its worker or -1, the timeout to use) for PlanRuntime's
    arguments; nothing here communicates."""
    if not _number(timeout) or not math.isfinite(float(timeout)) or float(timeout) <= 0:
        # The agreement still needs a deadline: the default's, while the bad value travels to every rank.
        return f"timeout {timeout!r}: must be a finite number of seconds > 0", -1, 300.0
    timeout = float(timeout)
    me = -1
    entry = _POOLS.get(id(group))
    if not isinstance(plan, _libra.Plan):
        return f"plan must be a libra.Plan, got {type(plan).__name__}", me, timeout
    if worker is None:
        if entry is None:
            return ("group was not made by libra.torch.pool_group or domain_groups; pass worker=", me, timeout)
        me = entry[1][comm.rank(group)]
    elif _index(worker) is None:
        return f"worker {worker!r}: must be an integer", me, timeout
    else:
        me = _index(worker)
        if not 0 <= me < plan.num_workers:
            return f"worker {me}: must be in [0, {plan.num_workers}) (the plan's workers)", -1, timeout
    if _index(threads) is None or not 1 <= _index(threads) <= 1024:
        return f"threads {threads!r}: must be an integer in [1, 1024]", me, timeout
    for name, v in (("trace", trace), ("check_calls", check_calls), ("relay", relay)):
        if not isinstance(v, bool):
            return f"{name} {v!r}: must be True or False", me, timeout
    if exchange not in ("auto", "programs", "index"):
        return f"exchange {exchange!r}: must be auto, programs or index", me, timeout
    if schedule is not None and not isinstance(schedule, _libra.RankProgram):
        return f"schedule must be None or Planner's, got {type(schedule).__name__}", me, timeout
    return None, me, timeout


class _Timed:
    """An async collective with a deadline (what ``wait`` raises when a peer is silent)."""

    def __init__(self, comm, group, work, seq, timeout, what, native):
        self.comm, self.group, self.work, self.seq, self.timeout, self.what = comm, group, work, seq, timeout, what
        self.native = native  # the communicator times the collective out itself (set_timeout took)

    def wait(self):
        try:
            # A deadline on wait() makes NCCL's wait block the CPU; where the communicator keeps its own
            # timeout, wait() stays the plain one.
            if self.native:
                self.work.wait()
            else:
                self.work.wait(timeout=datetime.timedelta(seconds=self.timeout))
        except RuntimeError as e:
            raise _silent_peers(self, e) from None
        return True


def _silent_peers(timed, err):
    """The error of a collective that did not complete, naming the ranks that never joined it where the
    communicator can tell (comms.Communicator.silent)."""
    comm, group, timeout, what = timed.comm, timed.group, timed.timeout, timed.what
    missing = comm.silent(group, timed.work, timed.seq, timeout)
    ranks = comm.world_ranks(group)
    t = f"{timeout:g} s"
    if missing:
        names = ", ".join(f"{r} (global rank {ranks[r]})" for r in missing)
        return TimeoutError(f"{what}: group rank{'s' if len(missing) > 1 else ''} {names} sent nothing within {t}")
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if missing == []:
        return TimeoutError(f"{what}: failed on every rank of the group within {t} ({first})")
    return TimeoutError(f"{what}: a peer sent nothing within {t} ({first})")


def _agree(comm, group, words, problem, timeout, what, native=False, array=False):
    """Collective: gathers every rank's int64 ``words`` and its problem line (or None). Returns (the
    gathered words by group rank: lists, or with ``array`` one int64 numpy array [ranks, words], the
    first (group rank, line) of a rank with a problem, or None).
    The protocol is the C++ engine's (libra::agree, through the binding: the lengths with the words,
    the lines only when some rank has one); here its two gathers are all-gathers on the group's
    communicator, each with the deadline."""
    size = comm.size(group)

    def gather(mine):
        # numpy arrays (the communicator's all_gather_array): one allocation, and no torch op where the
        # communicator moves them as they are (the in-process one).
        everyone = np.zeros((size, *mine.shape), dtype=mine.dtype)
        _Timed(comm, group, comm.all_gather_array(everyone, mine, group), _next_seq(group), timeout, what,
               native).wait()
        return everyone

    lengths = []  # every rank's problem length (its last word)

    def gather_words(mine):
        # An array goes to the binding as it is (no Python int per word); lists where the caller wants them.
        got = gather(np.array(mine, dtype=np.int64))
        lengths[:] = got[:, -1].tolist()
        return got if array else got.tolist()

    def gather_bytes(mine):
        # all_gather moves equal sizes: padded to the longest, whose length came with the words.
        buf = np.zeros(max(lengths), dtype=np.uint8)
        buf[:len(mine)] = np.frombuffer(mine, dtype=np.uint8)
        return [t[:n].tobytes() for t, n in zip(gather(buf), lengths)]

    msg = b"" if problem is None else str(problem).encode("utf-8", "replace")
    words = [int(w) for w in words]
    if array:
        # The protocol's first gather done here (the words, then the problem's length): where no rank
        # has a problem (the usual case) that is all of it, read with no Python int per word and no
        # call into the binding; where one has, the binding goes on from these gathered words.
        got = gather(np.array(words + [len(msg)], dtype=np.int64))
        if not got[:, -1].any():
            return got[:, :-1], None
        lengths[:] = got[:, -1].tolist()

        def gather_words(_mine):
            return got

    everyone, problems, failed = _libra.agree(words, msg, gather_words, gather_bytes)
    if not failed:
        return everyone, None
    return everyone, (failed[0], problems[failed[0]].decode("utf-8", "replace"))
