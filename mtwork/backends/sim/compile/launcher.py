"""Generates the C++ launcher appended to each emulated kernel.

The launcher exports `mtw_entry(group, buffers)`, which runs the group's current thread:
it computes the thread's attributes and calls the kernel with its buffers (see
include/mtw_abi.h), and `mtw_entry_barrier_free`, which runs a whole group in loops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ....msl.signature import ATTRIBUTE_NAMES


@dataclass(frozen=True)
class LaunchParam:
    """How the launcher fills one kernel parameter.

    `buffer`: a pointer (or, when `type_text` ends in `&`, a reference) to the memory in
    slot `slot` of the buffer table; `threadgroup`: a pointer into threadgroup memory at
    the offset held in slot `slot`; `attribute`: a thread attribute.
    """

    kind: Literal["buffer", "threadgroup", "attribute"]
    type_text: str
    slot: int = -1
    attribute: str = ""


def _argument(p: LaunchParam) -> str:
    if p.kind == "attribute":
        if p.attribute not in ATTRIBUTE_NAMES:
            raise ValueError(f"unknown thread attribute [[{p.attribute}]]")
        return f"mtw_attr::as<{p.type_text}>(mtw_attr::{p.attribute}(g, i, local))"
    if p.kind == "threadgroup":
        return f"({p.type_text})(g->tg_memory + (uintptr_t)b[{p.slot}])"
    if p.type_text.rstrip().endswith("&"):
        pointer = p.type_text.rstrip()[:-1] + "*"
        return f"*({pointer})b[{p.slot}]"
    return f"({p.type_text})b[{p.slot}]"


def call_arguments(params: Sequence[LaunchParam]) -> str:
    """The kernel call's arguments, from the group `g`, table `b`, thread `i`, `local`."""
    return ",\n          ".join(_argument(p) for p in params)


def launcher_source(function: str, params: Sequence[LaunchParam], *,
                    inline_loops: bool) -> str:
    """C++ for the two entry points, calling `function` (with template arguments, if any).

    `mtw_entry` runs one thread (the runtime's fibers take threads one after another, and
    a thread that blocks stays suspended on its fiber); having no loop of its own, the
    kernel inlined into it keeps its own code layout, by which the runtime orders
    diverged lanes. `mtw_entry_barrier_free` runs the group as nested loops the compiler
    can vectorize, for kernels that never block. With `inline_loops` (a kernel that can
    run there), the kernel is inlined into the loops whatever its size: past the
    inliner's threshold (a body calling two of the shim's math functions, such as
    `sin(a) + cos(b)`, is over it) the loop would call it once a thread and stay scalar.
    Other kernels keep the inliner's choice there: that entry never runs them, and
    compiling a large kernel twice costs time.
    """
    loop_call = "[[clang::always_inline]] " if inline_loops else ""
    args = call_arguments(params)
    return f"""
#include "mtw_launch.h"
extern "C" __attribute__((visibility("default")))
void mtw_entry(mtw_group* g, void* const* b) {{
  const uint32_t i = g->current;
  const uint3 local = mtw_attr::local_of(g, i);
  {function}(
          {args});
}}
extern "C" __attribute__((visibility("default")))
void mtw_entry_barrier_free(mtw_group* g, void* const* b) {{
  const uint32_t tx = g->tg_size[0], ty = g->tg_size[1], tz = g->tg_size[2];
  for (uint32_t z = 0; z < tz; ++z)
    for (uint32_t y = 0; y < ty; ++y)
      for (uint32_t x = 0; x < tx; ++x) {{
        const uint32_t i = (z * ty + y) * tx + x;
        const uint3 local = uint3(x, y, z);
        {loop_call}{function}(
          {args});
      }}
  g->next_thread = g->done = g->nthreads;
}}
"""
