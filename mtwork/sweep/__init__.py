"""Parameter sweeps (`mtwork.sweep`): `space` (configurations, expressions, constraints),
`results` (records and the result), `cache` (the resumable cache file) and `driver`
(the sweep itself); each configuration runs through `mtwork.run.Runner`."""

from ..errors import OracleError, SweepError, UnknownParameterError
from .driver import sweep
from .results import Record, SweepInterrupted, SweepResult
from .space import (
    Config,
    Constraint,
    Expression,
    constraint,
    divides,
    threadgroup_memory_under,
    threads_per_threadgroup_under,
)

__all__ = [
    "Config",
    "Constraint",
    "Expression",
    "OracleError",
    "Record",
    "SweepError",
    "SweepInterrupted",
    "SweepResult",
    "UnknownParameterError",
    "constraint",
    "divides",
    "sweep",
    "threadgroup_memory_under",
    "threads_per_threadgroup_under",
]
