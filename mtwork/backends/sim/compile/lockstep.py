"""Which kernels rely on a SIMD-group's lanes touching threadgroup memory in lockstep.

An Apple GPU executes each instruction of a SIMD-group once for all its active lanes, so
a lane's threadgroup store is seen by the other lanes' next load, and every lane's load
comes before any lane's later store, without a simdgroup_barrier between. MSL leaves such
code undefined (the sanitizer reports it as a race), but shipped kernels rely on it:
llama.cpp's vector flash attention (fa_vec_common.metal) reads its scores from
threadgroup scratch in every lane and then has lane 0 overwrite them. The fiber engine
runs each lane on to its next synchronisation point in turn, so such a kernel runs with
its threadgroup accesses traced (compiler.LOCKSTEP_FLAGS), each one a step of the
SIMD-group (runtime/convergence.cpp); every other kernel keeps its plain build.

The check reads the author's MSL, function by function: a kernel needs lockstep when a
function stores and loads threadgroup memory through the same name with no
synchronisation between them (a barrier, simdgroup_barrier or SIMD-group function), in
either order, counting the way round a loop. It is a text check: it errs towards
lockstep where it cannot tell (a branch's store and the other branch's load, a lane's
own element stored in one statement and read in another, a helper's synchronisation),
which costs only speed; it takes one statement's loads and store to be ordered
(`a[t] += a[t + s]`), and an element read and then written back through the same text
(`p *= g[t]; g[t] = p;`) to be the lane's own read-modify-write; it does not pair
accesses in different functions or through different names (`ss` and its alias `ss4`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ....msl.lexing import code_mask, matching

__all__ = ["needs_lockstep"]

# A declaration of a threadgroup pointer, reference or array: its name.
_DECLARED = re.compile(r"\bthreadgroup\b(?!\s*\()[\w\s:<>,*&]*?[\s*&](\w+)\s*(?=\[|=|;|,|\))")
# Where the lanes of a SIMD-group (or all threads) meet: the event sits at the call's end.
_SYNC = re.compile(r"\b(?:threadgroup_barrier|simdgroup_barrier|simd_\w+|quad_\w+|"
                   r"simdgroup_(?:load|store|multiply\w*))\s*\(")
_CONTROL = re.compile(r"\b(?:if|for|while|switch|catch)\s*$")
_LOOP = re.compile(r"\b(?:for|while)\s*\(|\bdo\s*\{")
_COMPOUND = re.compile(r"\s*(?:[-+*/%&|^]|<<|>>)=|\s*(?:\+\+|--)")
_ASSIGN = re.compile(r"\s*=(?!=)")


@dataclass(frozen=True)
class _Event:
    at: int
    kind: str  # "load", "store", "sync"
    lvalue: str = ""  # an access's text, e.g. "ss[2*qq + 0]"
    statement: int = -1  # an access's statement end (its `;`)


def needs_lockstep(texts: Iterable[str]) -> bool:
    """Whether any function of the MSL `texts` pairs a threadgroup store with a threadgroup
    load that no synchronisation separates."""
    return any(_file_needs_lockstep(text) for text in texts if "threadgroup" in text)


def _file_needs_lockstep(text: str) -> bool:
    mask = code_mask(text)
    declared = list(_DECLARED.finditer(mask))
    if not declared:
        return False
    # `threadgroup T* name[N]` is a thread's array of pointers: name[i][j] is the memory.
    indirect = {m.group(1) for m in declared if mask.startswith("[", m.end())
                and "*" in mask[m.start():m.start(1)]}
    names = {m.group(1) for m in declared}
    skip = {m.start(1) for m in declared}
    access = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(names))) + r")\b")
    for start, end in _function_bodies(mask):
        events = _events(mask, start, end, access, indirect, skip)
        if _hazard(events) or any(_hazard(_around(events, a, b))
                                  for a, b in _loop_bodies(mask, start, end)):
            return True
    return False


def _function_bodies(mask: str) -> list[tuple[int, int]]:
    """The outermost `{...}` that follow a parameter list and are not a control
    statement's."""
    bodies: list[tuple[int, int]] = []
    i = 0
    while (i := mask.find("{", i)) >= 0:
        head = mask[max(0, i - 400):i].rstrip()
        head = re.sub(r"(?:\b(?:const|thread|device|constant|threadgroup|noexcept)\b\s*)*$",
                      "", head).rstrip()
        if head.endswith(")") and not _CONTROL.search(_before_parens(head)):
            end = matching(mask, i, "{", "}")
            bodies.append((i, end))
            i = end
        else:
            i += 1
    return bodies


def _before_parens(head: str) -> str:
    """`head` (ending in `)`) without its last balanced parenthesised part."""
    depth = 0
    for k in range(len(head) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(head[k], 0)
        if depth == 0:
            return head[:k].rstrip()
    return head


def _events(mask: str, start: int, end: int, access: re.Pattern[str], indirect: set[str],
            skip: set[int]) -> list[_Event]:
    """The function's synchronisations and threadgroup accesses in the order they run: a
    SIMD-group function after its arguments, a store after its right-hand side; a load
    of the very element the statement stores (`a[i] = f(a[i])`, `a[i] += v`) is the
    lane's own and left out."""
    events = [_Event(matching(mask, m.end() - 1, "(", ")"), "sync")
              for m in _SYNC.finditer(mask, start, end)]
    accesses = []
    for m in access.finditer(mask, start, end):
        if m.start() in skip:
            continue
        kind, stop = _access_kind(mask, m.start(), m.end(), m.group(0) in indirect)
        if kind:
            statement = mask.find(";", stop)
            accesses.append(_Event(statement if kind == "store" else m.start(), kind,
                                   re.sub(r"\s+", "", mask[m.start():stop]), statement))
    stored = {(e.statement, e.lvalue) for e in accesses if e.kind == "store"}
    events += [e for e in accesses if e.kind == "store" or (e.statement, e.lvalue) not in stored]
    return sorted(events, key=lambda e: e.at)


_SPACE = re.compile(r"\s*")
_MEMBER = re.compile(r"\s*\.\s*\w+")
_DEREF = re.compile(r"(?:^|[=(,;{}?:+\-/*&|!<>\[])\s*\*\s*\(?\s*$")
_DEREF_TAIL = re.compile(r"[^;=]*?\)?")


def _access_kind(mask: str, start: int, end: int, indirect: bool) -> tuple[str, int]:
    """What `name` at mask[start:end] does to the memory it points at: nothing (the
    pointer itself is used or changed: ""), a "load" or a "store" (compound assignments
    too); and where the access's text ends."""
    deref = _DEREF.search(mask[max(0, start - 40):start])
    i, subscripts = end, 0
    while True:
        j = _SPACE.match(mask, i).end()
        member = _MEMBER.match(mask, i) if subscripts else None
        if mask.startswith("[", j):
            i, subscripts = matching(mask, j, "[", "]"), subscripts + 1
        elif member:
            i = member.end()
        else:
            break
    if subscripts + bool(deref) < 1 + indirect:
        return "", i
    if deref and not subscripts:  # `*p = v`, `*(p + k) = v`: the store follows the `)`
        i = _DEREF_TAIL.match(mask, i).end()
    if _COMPOUND.match(mask, i) or _ASSIGN.match(mask, i):
        return "store", i
    return "load", i


def _loop_bodies(mask: str, start: int, end: int) -> list[tuple[int, int]]:
    bodies = []
    for m in _LOOP.finditer(mask, start, end):
        i = m.end() - 1
        if mask[i] == "(":
            i = _SPACE.match(mask, matching(mask, i, "(", ")")).end()
            if not mask.startswith("{", i):
                continue
        bodies.append((i, matching(mask, i, "{", "}")))
    return bodies


def _around(events: list[_Event], start: int, end: int) -> list[_Event]:
    """A loop body's accesses after its last synchronisation, then (the way round) those
    before its first: nothing when the body has no synchronisation (the straight-line
    check sees the whole body then)."""
    inside = [e for e in events if start <= e.at < end]
    syncs = [k for k, e in enumerate(inside) if e.kind == "sync"]
    if not syncs:
        return []
    return inside[syncs[-1] + 1:] + inside[:syncs[0]]


def _hazard(events: list[_Event]) -> bool:
    """Whether a run of `events` without synchronisation loads and stores through the same
    name in different statements (different names are taken to be different memory; one
    statement's loads come before its store in every lane, as in the tree reduction
    `a[t] += a[t + s]`; a load of an element text followed by a store of the very same
    text, `g[t]` read in one statement and written in the next, is taken to be the lane's
    own read-modify-write, as within one statement)."""
    seen: dict[tuple[str, str], dict[str, set[int]]] = {}
    for e in events:
        if e.kind == "sync":
            seen.clear()
            continue
        name = re.match(r"\w*", e.lvalue.lstrip("*(")).group(0)
        seen.setdefault((name, e.kind), {}).setdefault(e.lvalue, set()).add(e.statement)
        other = seen.get((name, "store" if e.kind == "load" else "load"), {})
        # the same element text counts only when its store came first (read by a lane
        # other than the one that stored it, as in `if (l == 31) s[g] = x; y = s[g];`)
        if any((lvalue != e.lvalue or e.kind == "load") and statements - {e.statement}
               for lvalue, statements in other.items()):
            return True
    return False
