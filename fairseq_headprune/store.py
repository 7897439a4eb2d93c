"""Writing results so that a crash never leaves a half-written file."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def write_json_atomic(path: str, obj: Any) -> None:
    """Write JSON to a temporary file in the same folder, fsync it, then rename it over `path`."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
