"""Dtypes on the way to storage: which leaves are storable, how exotic ones are encoded.

HDF5 has no bfloat16/float8/int4, so ml_dtypes arrays are stored as an unsigned-int view of the
same width with a ``jaxlog_dtype`` attribute naming the real dtype; reading views them back, bit
for bit. Typed PRNG keys are stored as their key data (the driver converts, ``to_host`` helps).
Nothing here imports jax at module import time.
"""

from __future__ import annotations

import ast
import io
import tokenize
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16/float8/int4 names with numpy)
import numpy as np

from ..errors import JaxlogError
from ..record.frames import Frames, Schema, dtype_from_name

DTYPE_ATTR = "jaxlog_dtype"
KEY_IMPL_ATTR = "jaxlog_key_impl"
_NUMERIC_KINDS = frozenset("biufc")


def is_ml_dtype(dtype: Any) -> bool:
    """True for ml_dtypes' extension types (bfloat16, float8_*, int4, ...), which numpy sees as 'V'."""
    dtype = np.dtype(dtype)
    return dtype.kind == "V" and dtype.names is None and dtype.type.__module__.startswith("ml_dtypes")


def check_leaf_dtype(path: str, dtype: Any) -> np.dtype:
    """The dtype if it can be stored; JaxlogError naming the record otherwise (object, str, ...)."""
    try:
        dtype = np.dtype(dtype)
    except TypeError as exc:
        raise JaxlogError(f"record {path!r}: dtype {dtype!r} is not a numpy dtype ({exc})") from None
    if dtype.kind in _NUMERIC_KINDS or is_ml_dtype(dtype):
        return dtype
    what = {"O": "Python objects", "U": "strings", "S": "bytes", "M": "datetimes", "m": "timedeltas"}.get(
        dtype.kind, f"dtype {dtype}"
    )
    raise JaxlogError(
        f"record {path!r}: leaves of dtype {dtype} ({what}) cannot be recorded; views must return numeric arrays"
    )


def storage_dtype(dtype: Any) -> tuple[np.dtype, str | None]:
    """(dtype stored in HDF5, name to put in the ``jaxlog_dtype`` attribute or None)."""
    dtype = np.dtype(dtype)
    if is_ml_dtype(dtype):
        return np.dtype(f"u{dtype.itemsize}"), dtype.name
    return dtype, None


def encode(values: np.ndarray) -> np.ndarray:
    """Values as stored: a free view for ml_dtypes, the array itself otherwise (no copy)."""
    stored, name = storage_dtype(values.dtype)
    return values.view(stored) if name is not None else values


def decode(stored: np.ndarray, name: str | None) -> np.ndarray:
    """Undo ``encode``: view the stored uint data as the named ml_dtypes type."""
    if name is None:
        return stored
    return stored.view(dtype_from_name(name))


def to_host(leaf: Any, path: str = "?") -> tuple[np.ndarray, str | None]:
    """A leaf as a host numpy array plus the PRNG impl name if it was a typed key array."""
    key_impl = None
    mod = type(leaf).__module__ or ""
    if mod.startswith("jax") or mod.startswith("jaxlib"):
        import jax  # only when we were handed a jax value, so jax is already imported

        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            key_impl = str(jax.random.key_impl(leaf))
            leaf = jax.random.key_data(leaf)
    arr = np.asarray(leaf)
    check_leaf_dtype(path, arr.dtype)
    return arr, key_impl


def _shape_str(shape: tuple) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def check_frames(schema: Schema, frames: Frames, last_steps: dict[str, int] | None = None) -> None:
    """Cheap validation of a batch against the schema (paths, shapes, dtypes, step order).

    ``last_steps`` (path -> last step already accepted) is checked and updated, so a writer can
    reject steps that go backwards across batches. Raises JaxlogError naming record and step.
    """
    for path in frames.values:
        try:
            leaf = schema[path]
        except KeyError:
            raise JaxlogError(
                f"record {path!r} is not in the schema; recorded: {', '.join(schema.paths) or '(none)'}"
            ) from None
        values, steps = frames.values[path], frames.steps[path]
        if not isinstance(values, np.ndarray):
            raise JaxlogError(f"record {path!r}: frames must be numpy arrays, got {type(values).__name__}")
        n = len(steps)
        if values.ndim < 1 or values.shape[0] != n:
            raise JaxlogError(f"record {path!r}: {n} steps but values of shape {_shape_str(values.shape)}")
        if n == 0:
            continue
        if values.shape[1:] != tuple(leaf.shape):
            raise JaxlogError(
                f"record {path!r}: value at step {int(steps[0])} has shape {_shape_str(values.shape[1:])}, "
                f"expected {_shape_str(leaf.shape)}"
            )
        if values.dtype != leaf.dtype:
            raise JaxlogError(
                f"record {path!r}: value at step {int(steps[0])} has dtype {values.dtype}, expected {leaf.dtype}"
            )
        if n > 1 and not bool((steps[1:] > steps[:-1]).all()):
            bad = int(np.argmin(steps[1:] > steps[:-1])) + 1
            raise JaxlogError(
                f"record {path!r}: steps must increase, got step {int(steps[bad])} after {int(steps[bad - 1])}"
            )
        if last_steps is not None:
            prev = last_steps.get(path)
            if prev is not None and int(steps[0]) <= prev:
                raise JaxlogError(
                    f"record {path!r}: step {int(steps[0])} written after step {prev} (steps must increase)"
                )
            last_steps[path] = int(steps[-1])


def wrap_key_data(data: np.ndarray, impl: str, where: str) -> Any:
    """A typed PRNG key array of stored key data; an impl JAX does not know (a damaged or
    hostile file), or data of the wrong shape or dtype for it, is a ``JaxlogError``."""
    import jax

    try:
        return jax.random.wrap_key_data(data, impl=impl)  # type: ignore[arg-type]  # (numpy data is taken)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise JaxlogError(f"{where}: the stored PRNG key data (impl {str(impl)[:80]!r}) cannot be read as keys "
                          f"({type(exc).__name__}: {str(exc)[:200]})") from None

# ---------------------------------------------------------------------------------------------
# A stored state's structure read back from its pytree text, for states made of Python's own
# containers (one array, tuples, lists, dicts, None), so they come back without ``like=``.
#
# A checkpoint keeps its state's structure as the text ``str(jax.tree_util.tree_structure(state))``
# (``PyTreeDef((*, [*, {'a': *}]))``). That text is parsed, never evaluated (the file may be
# hostile): only tuple, list and dict displays, ``None``, ``*`` (a leaf) and literal dict keys are
# accepted; anything else (a namedtuple, a dataclass, a registered node: ``CustomNode(...)``) gives
# None, and such a state needs a template of the kernel's own type.

CHECKPOINT_META = "jaxlog_checkpoint"  # drive.checkpoints.checkpoint.META: the entry holding a checkpoint's JSON
_LEAF = "_jaxlog_leaf_"


class Leaf:
    """Where a template has an array (no shape to check it against)."""


def template(text: Any) -> Any | None:
    """The pytree ``text`` describes with :class:`Leaf` leaves, or None when it holds anything
    but Python's own containers (or is not pytree text)."""
    if not isinstance(text, str) or not text.startswith("PyTreeDef(") or not text.endswith(")") or len(text) > 1 << 20:
        return None
    inner = text[len("PyTreeDef("):-1]
    try:
        tokens = [(tokenize.NAME, _LEAF) if tok.type == tokenize.OP and tok.string == "*" else (tok.type, tok.string)
                  for tok in tokenize.generate_tokens(io.StringIO(inner).readline)]
        tree = ast.parse(tokenize.untokenize(tokens).strip(), mode="eval").body
    except (SyntaxError, tokenize.TokenError, ValueError, RecursionError, MemoryError):
        return None
    try:
        return _build(tree)
    except (_Unsupported, RecursionError):
        return None


class _Unsupported(Exception):
    pass


def _build(node: ast.AST) -> Any:
    if isinstance(node, ast.Name) and node.id == _LEAF:
        return Leaf()
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    if isinstance(node, ast.Tuple):
        return tuple(_build(x) for x in node.elts)
    if isinstance(node, ast.List):
        return [_build(x) for x in node.elts]
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, (str, int))
                                          for k in node.keys):
        return {k.value: _build(v) for k, v in zip(node.keys, node.values)}  # type: ignore[attr-defined]  # (checked above)
    raise _Unsupported


def beyond_dicts(tree: Any, *, top: bool = True) -> bool:
    """Whether a template is more than dicts: one array, or a tuple or list somewhere (a state of
    dicts alone reads back as nested dicts from its paths, as it always has)."""
    if isinstance(tree, Leaf):
        return top
    if isinstance(tree, (tuple, list)):
        return True
    if isinstance(tree, dict):
        return any(beyond_dicts(v, top=False) for v in tree.values())
    return False
