"""Pass infrastructure: `Pass`, `PassResult` and the `PassManager` that runs a list of them."""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Iterable, Sequence
from typing import ClassVar, NamedTuple

from dabench_ir.errors import UserError
from dabench_ir.ir import Graph

__all__ = ["Pass", "PassError", "PassManager", "PassResult"]

logger = logging.getLogger(__name__)


class PassResult(NamedTuple):  # a record built at import without generated code (a dataclass: ~1 ms)
    graph: Graph
    modified: bool


class PassError(RuntimeError):
    """A pass failed on a bug, not on the user's input; names the pass and what ran before."""


class Pass(abc.ABC):
    """One job on a Graph.

    Subclasses (usually frozen dataclasses whose fields are the pass options) set ``name``,
    may override ``requires`` to check the annotations they read, and implement ``call``.
    ``in_place`` declares whether the pass rewrites the graph it is given (the default) or
    returns a new one and leaves its input as it was; a caller that must keep its graph
    passes ``graph.clone()`` to an in-place pass.
    """

    name: str = "pass"
    in_place: ClassVar[bool] = True

    def requires(self, graph: Graph) -> None:  # noqa: B027 - optional hook, no-op by default
        """Raise with a clear message when an annotation this pass reads is missing."""

    @abc.abstractmethod
    def call(self, graph: Graph) -> PassResult:
        """Do the pass's job on ``graph``; say whether anything changed."""

    def __call__(self, graph: Graph) -> PassResult:
        self.requires(graph)
        result = self.call(graph)
        if not isinstance(result, PassResult):
            raise PassError(f"pass {self.name!r} returned {type(result).__name__}, not PassResult")
        if self.in_place and result.graph is not graph:
            raise PassError(f"pass {self.name!r} declares in_place but returned a new graph")
        if not self.in_place and result.graph is graph and result.modified:
            raise PassError(f"pass {self.name!r} declares it returns a new graph but modified its input")
        return result


class PassManager:
    """Runs passes in order. A failure names the failing pass and the passes before it."""

    def __init__(self, passes: Iterable[Pass]) -> None:
        self.passes: list[Pass] = list(passes)
        self.timings: dict[str, float] = {}

    def __call__(self, graph: Graph) -> PassResult:
        modified = False
        done: list[str] = []
        for p in self.passes:
            start = time.perf_counter()
            try:
                result = p(graph)
            except UserError:
                raise  # the user's to fix: the message already says what and how
            except Exception as exc:
                ran = ", ".join(done) or "none"
                raise PassError(f"pass {p.name!r} failed (passes run before it: {ran}): {exc}") from exc
            self.timings[p.name] = time.perf_counter() - start
            logger.debug("pass %s: %.3f s, modified=%s", p.name, self.timings[p.name], result.modified)
            graph = result.graph
            modified |= result.modified
            done.append(p.name)
        return PassResult(graph, modified)

    @property
    def names(self) -> Sequence[str]:
        return [p.name for p in self.passes]
