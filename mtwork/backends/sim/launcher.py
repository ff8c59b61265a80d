"""Generates the C++ launcher appended to each emulated kernel.

The launcher exports `mtw_entry(group, buffers)`: a loop that starts the group's threads
one after another, computes each thread's attributes and calls the kernel with its
buffers (see include/mtw_abi.h for why the loop takes threads from the group).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ...source import METAL_ATTRIBUTES

ATTRIBUTE_NAMES = frozenset(name for name, _ in METAL_ATTRIBUTES)


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


def launcher_source(function: str, params: Sequence[LaunchParam]) -> str:
    """C++ for the two entry points, calling `function` (with template arguments, if any).

    `mtw_entry` takes threads one at a time from the group, so a thread that blocks can
    leave the loop suspended; `mtw_entry_barrier_free` runs the group as nested loops
    the compiler can vectorize, for kernels that never block.
    """
    args = ",\n          ".join(_argument(p) for p in params)
    return f"""
#include "mtw_launch.h"
extern "C" __attribute__((visibility("default")))
void mtw_entry(mtw_group* g, void* const* b) {{
  for (;;) {{
    const uint32_t i = g->next_thread;
    if (i >= g->nthreads) return;
    g->next_thread = i + 1;
    g->current = i;
    g->tg_cursor[i] = g->tg_static_bytes;
    // The runtime (and the sanitizer's access checks) read g->current: keep the store here.
    __asm__ volatile("" ::: "memory");
    const uint3 local = mtw_attr::local_of(g, i);
    // Not inlined into this loop: rotating the loop would put the kernel's last blocks
    // before its first, and the runtime orders diverged lanes by code address.
    [[clang::noinline]] {function}(
          {args});
    g->done += 1;
    g->simd_done[i / MTW_SIMD_WIDTH] += 1;
  }}
}}
extern "C" __attribute__((visibility("default")))
void mtw_entry_barrier_free(mtw_group* g, void* const* b) {{
  const uint32_t tx = g->tg_size[0], ty = g->tg_size[1], tz = g->tg_size[2];
  for (uint32_t z = 0; z < tz; ++z)
    for (uint32_t y = 0; y < ty; ++y)
      for (uint32_t x = 0; x < tx; ++x) {{
        const uint32_t i = (z * ty + y) * tx + x;
        const uint3 local = uint3(x, y, z);
        {function}(
          {args});
      }}
  g->next_thread = g->done = g->nthreads;
}}
"""
