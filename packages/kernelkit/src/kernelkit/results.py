"""Record a benchmark run as JSON: the numbers plus the GPU, software versions, date and command."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import shlex
import sys
from collections.abc import Mapping, Sequence

from .device import gpu_name, sw_versions


def _check_records(records: object) -> list[dict[str, object]]:
    if not isinstance(records, Sequence) or isinstance(records, (str, bytes)):
        raise TypeError(f"records: expected a list of dicts, got {type(records).__name__}")
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping):
            raise TypeError(f"records[{i}]: expected a dict, got {type(rec).__name__}")
    return [dict(rec) for rec in records]


def write_results_json(
    path: str | os.PathLike[str], records: Sequence[Mapping[str, object]], meta: Mapping[str, object] | None = None
) -> pathlib.Path:
    """Write ``{"gpu", "versions", "date", "command", "meta", "records"}`` to ``path`` and return it.

    Args:
        path: the JSON file to write (parent folders are created); written atomically.
        records: one dict per measurement, JSON-serialisable, no NaN / inf (use None for "no value").
        meta: extra run facts (package, git commit, ...); ``meta["command"]`` overrides the recorded
            command line, which is otherwise this process's own.

    ``gpu`` is ``gpu_name()``, ``versions`` is ``sw_versions()``, ``date`` is ISO 8601 in UTC.
    """
    recs = _check_records(records)
    if meta is not None and not isinstance(meta, Mapping):
        raise TypeError(f"meta: expected a dict or None, got {type(meta).__name__}")
    meta = dict(meta or {})
    doc = {
        "gpu": gpu_name(),
        "versions": sw_versions(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": str(meta.pop("command", shlex.join(sys.orig_argv))),
        "meta": meta,
        "records": recs,
    }
    try:
        text = json.dumps(doc, indent=2, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"records/meta: not JSON-serialisable without NaN/inf: {exc}") from exc
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(out)  # a reader never sees a half-written file
    return out
