"""A stored state's structure read back from its pytree text, for states made of Python's own
containers (one array, tuples, lists, dicts, None), so they come back without ``like=``.

A checkpoint keeps its state's structure as the text ``str(jax.tree_util.tree_structure(state))``
(``PyTreeDef((*, [*, {'a': *}]))``). That text is parsed, never evaluated (the file may be
hostile): only tuple, list and dict displays, ``None``, ``*`` (a leaf) and literal dict keys are
accepted; anything else (a namedtuple, a dataclass, a registered node: ``CustomNode(...)``) gives
None, and such a state needs a template of the kernel's own type.
"""

from __future__ import annotations

import ast
import io
import tokenize
from typing import Any

CHECKPOINT_META = "jaxlog_checkpoint"  # drive.checkpoint.META: the entry holding a checkpoint's JSON
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
