"""One lazily imported table of named implementations, shared by the compute
backends and the communicators: each name in ``order`` is a module of
``package`` (``-`` spelled ``_``) exporting ``attribute``. Importing on first
use keeps optional dependencies (flash-attn, CUDA) out of ``import libra``.

    _REGISTRY = Registry(__name__, ORDER, "BACKEND", "libra.torch backend")
    _REGISTRY.get("sdpa")
"""

import importlib


class Registry:
    def __init__(self, package, order, attribute, what):
        self._package, self._order, self._attribute, self._what = package, order, attribute, what
        self._table = {}

    def table(self):
        """Every implementation of ``order`` by name."""
        if not self._table:
            # Built whole, then published: the in-process pool's workers call this at once, and one
            # that saw a half-filled table refused a backend not imported yet.
            table = {}
            for name in self._order:
                module = importlib.import_module(f".{name.replace('-', '_')}", self._package)
                table[name] = getattr(module, self._attribute)
            self._table = table
        return self._table

    def get(self, name):
        table = self.table()
        if name not in table:
            raise ValueError(f"{self._what} {name!r}: must be one of {', '.join(self._order)}")
        return table[name]
