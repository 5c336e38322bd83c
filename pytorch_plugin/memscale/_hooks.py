"""The hooks memscale puts on a program's modules, as objects the program can
save and copy.

A hook registered on a user's module sits in the module's own hook dicts, so
whatever the program does with the module - ``torch.save(model)``,
``copy.deepcopy(model)``, ``pickle`` - meets it. A closure or a bound method
there breaks that (a local object cannot be pickled; a deep copy of a bound
method copies memscale's whole state onto the copy). :class:`WeakHook` is a
module-level class holding its owner (the steps, the block tracker) weakly:

* pickled, it becomes :func:`detached_hook`, which does nothing: a model saved
  whole loads as a plain model (where ``memscale`` can be imported; a
  ``state_dict`` needs nothing of memscale);
* deep-copied, it becomes :func:`detached_hook` too (the copy is a plain
  model: wrap it to track it), or - for an owner that tracks copies, as the
  block tracker does - itself, so the copy is tracked by the same owner and
  nothing of the owner is duplicated;
No dependencies; no policy.
"""

from __future__ import annotations

import weakref
from typing import Any


def detached_hook(*args: Any, **kwargs: Any) -> None:
    """What a memscale hook becomes in a saved or copied model: nothing."""
    return None


class ModuleHook:
    """A module hook calling ``owner.<method>(*bound, *args, **kwargs)``.

    Args:
        owner: the object whose method is called.
        method: the name of the owner's method to call.
        bound: arguments passed first (a block's name).
        share_on_copy: a deep copy of the module keeps this hook (tracked by
            the same owner) instead of a hook that does nothing.
        weak: hold the owner weakly (the hook does nothing once it is gone).
    """

    __slots__ = ("_owner", "_weak", "_method", "_bound", "_share", "__weakref__")

    def __init__(self, owner: Any, method: str, *bound: Any, share_on_copy: bool = False, weak: bool = False) -> None:
        self._owner = weakref.ref(owner) if weak else owner
        self._weak = weak
        self._method = method
        self._bound = bound
        self._share = share_on_copy

    def owner(self) -> Any:
        """The owner, or ``None`` once a weakly held one is gone."""
        return self._owner() if self._weak else self._owner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        owner = self.owner()
        if owner is None:
            return None
        return getattr(owner, self._method)(*self._bound, *args, **kwargs)

    def __reduce__(self) -> Any:
        return (_detached, ())

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self if self._share else detached_hook

    def __copy__(self) -> Any:
        return self

    def __repr__(self) -> str:
        owner = self.owner()
        return f"<memscale hook {type(owner).__name__ if owner is not None else 'detached'}.{self._method}>"


def _detached() -> Any:
    return detached_hook
