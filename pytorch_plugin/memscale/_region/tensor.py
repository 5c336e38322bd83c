"""The wrapper tensor, and ops on wrappers outside their region's mode.

:class:`DTRTensor` is a ``_make_wrapper_subclass`` tensor: metadata only, its
data held by the :class:`~memscale._region.cells.Cell` it names. Inside its
region, ops on it go through the region's mode. Outside (after the entry
exited, or on a thread the mode is not active on, such as an autograd worker)
:meth:`DTRTensor.__torch_dispatch__` either hands the op to the open entry the
wrapper belongs to or runs it on the plain tensors.

Holds no bookkeeping; materializing an evicted wrapper is the session's job
(``Session.read``).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch
import torch.utils
from torch.utils._python_dispatch import _disable_current_modes

from ..errors import MemscaleError

if TYPE_CHECKING:
    from .cells import Cell, Owner


class EvictedTensorError(MemscaleError):
    """A tensor of a DTR region was used after the region lost its data.

    Only happens after a region exited with an error while the tensor was evicted
    (a region that exits normally makes every tensor that escapes it resident).
    """


class DTRTensor(torch.Tensor):
    """A tensor of a DTR region: metadata only, data held by the region.

    Inside its region, ops on it go through the region (which rebuilds it when it
    was evicted). After the region exited, it behaves as the plain tensor it was
    materialized to: ops on it run on that tensor and return plain tensors. Use
    :meth:`DTRRegion.unwrap` (or :func:`unwrap`) to get the plain tensor itself.
    """

    _c: Cell

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @staticmethod
    def __new__(cls, *args: Any, **kwargs: Any) -> DTRTensor:  # noqa: D102
        raise TypeError("DTRTensor is created by memscale.dtr regions, not directly (use DTRRegion.wrap)")

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return dispatch_outside(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        cell = self._c
        if cell.tensor is None:
            where = "evicted" if cell.session is not None else "lost"
            return f"DTRTensor({where}, size={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"
        with _disable_current_modes():
            return f"DTRTensor({cell.tensor!r})"

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Pickled (torch.save, deepcopy via pickle) as the plain tensor itself:
        # a checkpoint must load with torch.load(weights_only=True) and
        # without memscale.
        return plain_of(self).__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        with _disable_current_modes():
            return plain_of(self).clone()

    def tolist(self) -> Any:  # noqa: D102 - as torch.Tensor.tolist (subclasses lack it)
        with _disable_current_modes():
            return plain_of(self).tolist()

    def numpy(self, *, force: bool = False) -> Any:  # noqa: D102 - as torch.Tensor.numpy
        with _disable_current_modes():
            return plain_of(self).numpy(force=force)

    def __format__(self, format_spec: str) -> str:
        # torch.Tensor.__format__ formats a 0-dim tensor as its number only
        # for type Tensor exactly; a wrapper formats as its plain tensor.
        with _disable_current_modes():
            return plain_of(self).__format__(format_spec)


def hand_back(wrapper: DTRTensor, tensor: torch.Tensor) -> bool:
    """Turn an escaping ``wrapper`` into a plain tensor in place: the program's
    object becomes a ``torch.Tensor`` on ``tensor``'s data (same storage and
    geometry), so whatever the program kept from the entry (a metric in a
    meter, a batch's predictions) is an ordinary tensor afterwards.

    ``torch.utils.swap_tensors`` exchanges the two objects' contents. It is
    refused - and the wrapper stays a wrapper, which behaves as its plain
    tensor outside the region - while anything else references the wrapper's
    TensorImpl (an autograd graph that saved it) or holds a weak reference to
    it; a wrapper that requires grad is not handed back (its autograd history
    lives on the wrapper). Returns whether it was handed back.
    """
    if weakref.getweakrefs(wrapper) or wrapper._use_count() != 1:
        return False
    with _disable_current_modes():
        plain = tensor.detach()
    try:
        torch.utils.swap_tensors(wrapper, plain)
    except RuntimeError:
        return False
    return True


def plain_of(x: DTRTensor) -> torch.Tensor:
    """The real tensor behind ``x``, rebuilt first if its open entry evicted it."""
    cell = x._c
    t = cell.tensor
    if t is None:
        session = cell.session
        if session is not None and not session.closed:
            # Called from user code while the region's mode may be active:
            # re-runs must reach the kernels, not the region.
            with _disable_current_modes():
                t = session.read(cell)
        if t is None:
            raise EvictedTensorError(
                f"tensor of shape {tuple(x.shape)} was evicted inside a memscale.dtr region that "
                "exited with an error; its data cannot be rebuilt"
            )
    return t


def unwrap(x: Any) -> Any:
    """The plain tensor behind a :class:`DTRTensor` (rebuilt if needed); else ``x``."""
    if type(x) is DTRTensor:
        return plain_of(x)
    return x


def unwrap_tree(x: Any) -> Any:
    """``x`` with every :class:`DTRTensor` in it (lists, tuples, dicts) replaced
    by its plain tensor (rebuilt if needed)."""
    if type(x) is DTRTensor:
        return plain_of(x)
    if type(x) in (list, tuple):
        return type(x)(unwrap_tree(y) for y in x)
    if type(x) is dict:
        return {k: unwrap_tree(v) for k, v in x.items()}
    return x


def _open_session_of(x: Any) -> Owner | None:
    if type(x) is DTRTensor:
        session = x._c.session
        if session is not None and not session.closed:
            return session
    elif type(x) in (list, tuple):
        for y in x:
            session = _open_session_of(y)
            if session is not None:
                return session
    return None


def dispatch_outside(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """An op on wrappers with no region mode active on this thread."""
    for a in (*args, *kwargs.values()):
        session = _open_session_of(a)
        if session is not None:  # e.g. an autograd worker thread without the mode
            return session.dispatch(func, args, kwargs)
    with _disable_current_modes():
        return func(*unwrap_tree(list(args)), **unwrap_tree(kwargs))
