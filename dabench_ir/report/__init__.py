"""Reports: the `Report` record and its renderers (table, JSON, CSV, plots, HTML, traces)."""

from __future__ import annotations

from .model import SCHEMA, NodeRecord, Report
from .table import human, render_table, seconds

__all__ = ["SCHEMA", "NodeRecord", "Report", "human", "render_table", "seconds"]
