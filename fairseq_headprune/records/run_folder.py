"""Paths in a run folder's records: a path inside the folder is stored relative to it (so the folder moves, or is
copied elsewhere, whole) and resolved against wherever the folder is when the record is read; a path outside it
(the user's own files) stays absolute. The record lists where its relative paths are (pointers: the keys and list
indices leading to each), so no string is ever taken for a path by its look."""
from __future__ import annotations

import copy
import os
from typing import Any, List, Optional, Tuple

Pointer = List[Any]  # the keys (and list indices) from a record's top to one of its values


def within(path: str, root: str) -> Optional[str]:
    """`path` relative to the folder `root` when it lies inside it (by its absolute path, else by its real path:
    a folder reached through a link), else None."""
    pairs = ((os.path.abspath(path), os.path.abspath(root)), (os.path.realpath(path), os.path.realpath(root)))
    for inner, folder in pairs:
        if inner == folder or inner.startswith(folder.rstrip(os.sep) + os.sep):
            return os.path.relpath(inner, folder)
    return None


def relative_paths(value: Any, root: str, at: Tuple = ()) -> Tuple[Any, List[Pointer]]:
    """A copy of `value` with every absolute path inside `root` made relative to it, and the pointers to them."""
    if isinstance(value, dict):
        out, pointers = {}, []
        for key, item in value.items():
            out[key], found = relative_paths(item, root, (*at, key))
            pointers += found
        return out, pointers
    if isinstance(value, (list, tuple)):
        pairs = [relative_paths(item, root, (*at, i)) for i, item in enumerate(value)]
        return [item for item, _ in pairs], [p for _, found in pairs for p in found]
    if isinstance(value, str) and os.path.isabs(value):
        inside = within(value, root)
        if inside is not None:
            return inside, [list(at)]
    return value, []


def resolved_paths(value: Any, root: str, pointers: List[Pointer]) -> Any:
    """A copy of `value` with the relative path at each pointer joined onto `root` (where the folder is now)."""
    out = copy.deepcopy(value)
    for pointer in pointers:
        *path, last = pointer
        holder = out
        for key in path:
            holder = holder[key]
        holder[last] = os.path.normpath(os.path.join(os.path.abspath(root), holder[last]))
    return out
