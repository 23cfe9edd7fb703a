"""Reductions of the collectives (``ziptrail.group``): the built-in
operations :data:`SUM`, :data:`MIN` and :data:`MAX`, and how a member's input
(a list of ints or floats, an ``array.array``, a numpy array, a scalar or
bytes) becomes elements of one format on the wire and back (see the
``ziptrail.group`` module doc, "Reductions")."""

from __future__ import annotations

import operator
import sys
from array import array
from typing import Any, Callable, Sequence, Union

from ._objects import _view
from .errors import InvalidError

class Op:
    """A built-in reduction: :data:`SUM`, :data:`MIN` or :data:`MAX`."""

    def __init__(self, name: str, py: Callable[[Any, Any], Any], ufunc: str) -> None:
        self.name, self.py, self.ufunc = name, py, ufunc

    def __repr__(self) -> str:
        return f"ziptrail.{self.name.upper()}"


SUM = Op("sum", operator.add, "add")
MIN = Op("min", min, "minimum")
MAX = Op("max", max, "maximum")

#: A reduction: a built-in Op or a user function of two values.
Reduction = Union[Op, Callable[[Any, Any], Any]]


# --- numeric vectors ------------------------------------------------------------

_TYPECODES = "bBhHiIlLqQfd"


def _fmt_of_typecode(tc: str) -> str:
    kind = "f" if tc in "fd" else ("u" if tc.isupper() else "i")
    return f"{kind}{array(tc).itemsize}"


_FMT_TYPECODE: dict[str, str] = {}
for _tc in _TYPECODES:
    _FMT_TYPECODE.setdefault(_fmt_of_typecode(_tc), _tc)


def _numpy() -> Any:
    """numpy when it is installed, else None (imported on first use)."""
    global _np
    if _np is False:
        try:
            import numpy
            _np = numpy
        except ImportError:
            _np = None
    return _np


_np: Any = False


def _is_ndarray(value: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray)


def _itemsize(fmt: str) -> int:
    return int(fmt[1:])


class _Vec:
    """How a member's reduction input becomes elements of one format (and
    bytes on the wire), and how a result goes back to the caller's kind."""

    def __init__(self, value: Any) -> None:
        self.shape: tuple[int, ...] | None = None
        if _is_ndarray(value):
            np = sys.modules["numpy"]
            a = np.ascontiguousarray(value)
            self.kind, self.fmt, self.shape = "numpy", f"{a.dtype.kind}{a.dtype.itemsize}", a.shape
            self.buf = memoryview(a.reshape(-1).view(np.uint8))
        elif isinstance(value, array):
            if value.typecode not in _TYPECODES:
                raise InvalidError("reduce", f"array.array of typecode {value.typecode!r} is not numeric")
            self.kind, self.fmt = "array", _fmt_of_typecode(value.typecode)
            self.buf = memoryview(value).cast("B")
        elif isinstance(value, (bool, int, float)):
            self.kind = "scalar"
            self.fmt, self.buf = self._pack([value])
        elif isinstance(value, (list, tuple)):
            self.kind = "list"
            self.fmt, self.buf = self._pack(value)
        else:
            self.kind, self.fmt, self.buf = "bytes", "", _view(value)

    @staticmethod
    def _pack(values: Sequence[Any]) -> tuple[str, memoryview]:
        if all(isinstance(v, int) for v in values):
            tc = "q"
        elif all(isinstance(v, (int, float)) for v in values):
            tc = "d"
        else:
            bad = next(v for v in values if not isinstance(v, (int, float)))
            raise InvalidError("reduce", f"reductions take numbers, got a {type(bad).__name__}")
        try:
            return _fmt_of_typecode(tc), memoryview(array(tc, values)).cast("B")
        except OverflowError as e:
            raise InvalidError("reduce", f"an int does not fit in int64: {e}") from None

    def decode(self, fmt: str, buf: Any) -> Any:
        """The caller's kind of value for a result."""
        if self.kind == "bytes":
            return buf
        if self.kind == "numpy" or fmt not in _FMT_TYPECODE:
            np = _numpy()
            if np is None:
                raise InvalidError("reduce", f"elements of format {fmt} need numpy")
            out = np.frombuffer(bytearray(buf), dtype=np.dtype(fmt))
            if self.kind == "numpy" and self.shape is not None:
                return out.reshape(self.shape)
            return out if self.kind != "scalar" else out[0].item()
        a = array(_FMT_TYPECODE[fmt])
        a.frombytes(buf)
        if self.kind == "array":
            return a
        if self.kind == "scalar":
            return a[0]
        return a.tolist()


def _promote(fa: str, fb: str) -> str:
    if fa == fb:
        return fa
    if {fa, fb} == {"i8", "f8"}:
        return "f8"
    raise InvalidError("reduce", f"members reduce different element types ({fa} and {fb})")


def _convert(buf: Any, src: str, dst: str) -> Any:
    if src == dst:
        return buf
    np = _numpy()
    if np is not None:
        return np.frombuffer(buf, dtype=np.dtype(src)).astype(np.dtype(dst)).tobytes()
    a = array(_FMT_TYPECODE[src])
    a.frombytes(buf)
    return array(_FMT_TYPECODE[dst], a).tobytes()


def _apply(op: Op, fmt: str, a: Any, b: Any) -> bytes:
    """Elementwise op over two buffers of elements of format fmt."""
    if len(memoryview(a)) != len(memoryview(b)):
        raise InvalidError("reduce", f"members reduce arrays of different lengths ({len(memoryview(a)) // _itemsize(fmt)} "
                           f"and {len(memoryview(b)) // _itemsize(fmt)} elements)")
    np = _numpy()
    if np is not None:
        dt = np.dtype(fmt)
        x, y = np.frombuffer(a, dtype=dt), np.frombuffer(b, dtype=dt)
        out = getattr(np, op.ufunc)(x, y).tobytes()
        del x, y
        return out
    if fmt not in _FMT_TYPECODE:
        raise InvalidError("reduce", f"elements of format {fmt} need numpy")
    tc = _FMT_TYPECODE[fmt]
    x, y = array(tc), array(tc)
    x.frombytes(a)
    y.frombytes(b)
    try:
        return array(tc, map(op.py, x, y)).tobytes()
    except OverflowError as e:
        raise InvalidError("reduce", f"{op.name} overflows {fmt}: {e}") from None
