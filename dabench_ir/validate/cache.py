"""The graph cache validation points share: 1-layer base exports on disk, costed L-layer graphs in memory.

Points of one model differ only in options, so the export and graph build run once per model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dabench_ir.validate.catalog import Point

__all__ = ["GraphCache", "Say", "graph_key"]

logger = logging.getLogger(__name__)


Say = Callable[[str], None]


def graph_key(p: Point) -> tuple:
    if p.kind != "model":
        return ("", 0)
    return (json.dumps(dict(p.model), sort_keys=True, default=str), 0)


class GraphCache:
    """Base exports (disk cache) and costed L-layer graphs (memory), shared by points."""

    def __init__(self, folder: Path, say: Say) -> None:
        self.folder = folder
        self.say = say
        self.bases: dict[str, bytes | Exception] = {}
        self.graphs: dict[tuple[str, int], Any] = {}
        self.uses: dict[tuple[str, int], int] = {}  # `expect`: the asks still to come for a graph

    def expect(self, models: list[Mapping[str, Any]]) -> None:
        """Count the asks `graph` will get for each of ``models`` (one per entry): the last one
        counted is handed the cached graph itself instead of a copy (a copy is ~2 ms per 1,000
        nodes, and most models are asked for once). An ask not counted gets a copy, as before."""
        from dabench_ir.sweep import graphs

        for model in models:
            try:
                gkey = (graphs.base_key(dict(model)), int(model["layers"]))
            except Exception:  # `graph` raises it for the point that asks
                continue
            self.uses[gkey] = self.uses.get(gkey, 0) + 1

    def prefetch(self, models: list[Mapping[str, Any]], jobs: int) -> None:
        """Export the bases of ``models`` missing from the disk cache in ``jobs`` processes at once.

        A base whose export fails here is left to `graph`, which exports it again in this process
        and raises what the export raised (the point's reason, as without the prefetch)."""
        from dabench_ir.sweep import graphs
        from dabench_ir.sweep.executors import LocalExecutor

        wanted: dict[str, dict[str, Any]] = {}
        for model in models:
            try:
                key = graphs.base_key(dict(model))
            except Exception:  # `graph` raises it for the point that asks
                continue
            if key not in self.bases:
                wanted.setdefault(key, dict(model))
        if jobs < 2 or len(wanted) < 2:
            return  # one export: in this process, as `graph` does it
        missing = [key for key in wanted if not (self.folder / f"{key}.onnx").is_file()]
        if len(missing) < 2:
            return
        self.say(
            f"exporting {len(missing)} models in {min(jobs, len(missing))} processes (once; cached in {self.folder})"
        )
        executor = LocalExecutor(min(jobs, len(missing)), start="spawn")
        try:
            bases, _errors, _ = graphs.export_missing(self.folder, {k: wanted[k] for k in missing}, executor)
        finally:
            executor.close()
        self.bases.update(bases)

    def graph(self, model: Mapping[str, Any]) -> Any:
        """A fresh costed Graph of ``model`` (raises what export or building raised)."""
        from dabench_ir.sweep import graphs

        params = dict(model)
        key = graphs.base_key(params)
        if key not in self.bases:
            data = graphs.load_base(self.folder, key)
            if data is None:
                self.say(f"exporting {key} (once; cached in {self.folder})")
                try:
                    data = graphs.export_base(params)
                except Exception as exc:  # an export failure is the point's reason, not a crash
                    self.bases[key] = exc
                    raise
                try:
                    graphs.save_base(self.folder, key, data)
                except OSError as exc:
                    logger.warning("cannot cache the export in %s: %s", self.folder, exc)
            self.bases[key] = data
        base = self.bases[key]
        if isinstance(base, Exception):
            raise base
        gkey = (key, int(params["layers"]))
        if gkey not in self.graphs:
            self.graphs[gkey] = graphs.build_graph(base, int(params["layers"]))
        left = self.uses.get(gkey, 0) - 1
        if left == 0:  # the last ask counted: nobody reads the cached graph after this point
            del self.uses[gkey]
            return self.graphs.pop(gkey)
        if left > 0:
            self.uses[gkey] = left
        return self.graphs[gkey].clone()
