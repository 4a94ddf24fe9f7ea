"""The communicators of ``libra.torch``: what moves a pool group's messages, behind one small interface.

Everything libra.torch sends goes through a ``Communicator``: the exchanges of the flat program
(``all_to_all``, one per pipeline chunk, direction and element class), the agreements before work
(``all_gather``) and the naming of a silent peer (``silent``). The exchange, the pipeline order and
the agreement protocol are the same code over every communicator. Two are registered:

- ``torch-dist``: torch.distributed process groups (gloo, NCCL, ...), one process per worker;
- ``inprocess``: one process runs all W workers of a pool on threads (``inprocess.run``), so tests
  run without spawning processes and one GPU can run a whole pool.

A group belongs to the first communicator of ``ORDER`` that ``owns`` it; ``current()`` is the one
whose world the caller runs in (a thread of an in-process pool, else torch.distributed).
``pool_group`` and ``domain_groups`` create their groups on it, so the same training loop or test
body runs on either.

A new communicator is a new file in this folder defining a ``Communicator`` (``COMMUNICATOR``) and
its name in ``ORDER`` below.
"""
from .._registry import Registry

# Each name is a module of this package (dashes as underscores) whose COMMUNICATOR it registers. The
# in-process one comes first: its threads may run inside a process that also has torch.distributed.
ORDER = ("inprocess", "torch-dist")


class Communicator:
    """What every communicator provides. Groups are its own objects; ``rank`` and ``size`` are the
    caller's place in one. Asynchronous operations return a work whose ``wait(timeout=None)`` (a
    timedelta) raises RuntimeError when it did not complete."""

    name = "?"

    def owns(self, group):
        """Whether ``group`` is one of this communicator's groups."""
        raise NotImplementedError

    def active(self):
        """Whether the caller runs in this communicator's world."""
        raise NotImplementedError

    def world(self):
        """(size, rank) of the caller's world."""
        raise NotImplementedError

    def new_group(self, ranks):
        """Collective over the world (every rank, same order): a group of ``ranks`` (world ranks), for a
        member; anything for a non-member. Group ranks follow increasing world rank."""
        raise NotImplementedError

    def size(self, group):
        raise NotImplementedError

    def rank(self, group):
        raise NotImplementedError

    def world_ranks(self, group):
        """The world rank of every group rank."""
        raise NotImplementedError

    def all_to_all(self, out, inp, out_splits, in_splits, group):
        """Async all-to-all of row buffers (dim 0): ``in_splits[j]`` rows of ``inp`` go to group rank j,
        ``out_splits[j]`` rows from j land in ``out``, in rank order. ``inp`` stays untouched until the
        work completes on every rank (libra never reuses a posted buffer)."""
        raise NotImplementedError

    def all_gather(self, outs, inp, group):
        """Async: every group rank's ``inp`` into ``outs[rank]`` (group None: the world)."""
        raise NotImplementedError

    def all_gather_into(self, out, inp, group):
        """``all_gather`` into the rows of one tensor ``out`` ([size, *inp.shape])."""
        return self.all_gather(list(out.unbind(0)), inp, group)

    def all_gather_array(self, out, inp, group):
        """``all_gather_into`` of numpy arrays (``out`` [size, *inp.shape]: the agreements' few words
        and bytes); here through CPU tensors sharing the arrays' memory."""
        import torch  # noqa: PLC0415 - this package's modules load without torch until a group is used

        return self.all_gather_into(torch.from_numpy(out), torch.from_numpy(inp), group)

    def set_timeout(self, group, seconds):
        """Makes ``group``'s own operations time out after ``seconds``; True where it takes it (its
        works' plain ``wait()`` then ends), False where only a deadline on ``wait`` bounds them."""
        raise NotImplementedError

    def silent(self, group, work, seq, timeout):
        """After ``work`` (the ``seq``-th libra collective on ``group``) did not complete: the group
        ranks that never joined it (waiting up to ``timeout`` for the others to say they did), [] when
        every rank joined, None when it cannot tell."""
        raise NotImplementedError

    # For training loops and tests that run on either communicator.
    def barrier(self, group=None):
        raise NotImplementedError

    def all_reduce(self, tensor, group=None):
        """Sums ``tensor`` in place over ``group`` (the world when None); blocking."""
        raise NotImplementedError


_REGISTRY = Registry(__name__, ORDER, "COMMUNICATOR", "libra.torch communicator")


def registry():
    """Every communicator of ORDER by name (imported on first use)."""
    return _REGISTRY.table()


def get(name):
    return _REGISTRY.get(name)


def of(group):
    """The communicator that owns ``group``, or None."""
    for comm in registry().values():
        if comm.owns(group):
            return comm
    return None


def current():
    """The communicator whose world the caller runs in; RuntimeError when none is set up."""
    for comm in registry().values():
        if comm.active():
            return comm
    raise RuntimeError("libra.torch: torch.distributed is not initialised (call init_process_group first) "
                       "and this thread is not a worker of an in-process pool")
