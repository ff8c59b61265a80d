"""mtwork's kernels as operations of MLX's graph (lazy, inside `mx.compile` and MLX's
transformations): a C++ MLX primitive (`extension.cpp`, built at first use by `build`)
whose evaluation runs the call through `mtwork.backends.run` (`operation`)."""

from .build import GraphUnavailable
from .operation import (
    Finish,
    Input,
    Output,
    Record,
    available,
    give_back_freed,
    is_tracer,
    operation,
    pending,
    unavailable_reason,
    warn_eager,
)

__all__ = ["Finish", "GraphUnavailable", "Input", "Output", "Record", "available",
           "give_back_freed", "is_tracer", "operation", "pending", "unavailable_reason",
           "warn_eager"]
