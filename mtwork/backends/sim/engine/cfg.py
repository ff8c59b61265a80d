"""Control flow of one function: edges, post-dominators and the liveness of values."""

from __future__ import annotations

from dataclasses import dataclass

from .ir import Function, locals_in

__all__ = ["Graph", "Liveness"]


@dataclass
class Graph:
    """The blocks of a function and the edges between them."""

    order: list[str]  # blocks in the function's order; the first is the entry
    succ: dict[str, list[str]]
    pred: dict[str, list[str]]

    @classmethod
    def of(cls, function: Function) -> Graph:
        order = [b.name for b in function.blocks]
        succ = {b.name: b.successors() for b in function.blocks}
        pred: dict[str, list[str]] = {name: [] for name in order}
        for name in order:
            for s in succ[name]:
                pred[s].append(name)
        return cls(order, succ, pred)

    def reachable(self, starts: list[str], stop: frozenset[str] = frozenset()) -> list[str]:
        """Blocks reachable from `starts` (included) without entering a block of `stop`,
        in function order."""
        work = [b for b in starts if b not in stop]
        seen = set(work)
        while work:
            for s in self.succ[work.pop()]:
                if s not in seen and s not in stop:
                    seen.add(s)
                    work.append(s)
        return [b for b in self.order if b in seen]

    def reverse_postorder(self) -> list[str]:
        """The blocks reachable from the entry, each after the blocks that dominate it."""
        post, seen = [], {self.order[0]}
        stack = [(self.order[0], iter(self.succ[self.order[0]]))]
        while stack:
            node, it = stack[-1]
            nxt = next((s for s in it if s not in seen), None)
            if nxt is None:
                post.append(node)
                stack.pop()
            else:
                seen.add(nxt)
                stack.append((nxt, iter(self.succ[nxt])))
        return post[::-1]

    def immediate_postdominators(self) -> dict[str, str | None]:
        """Each block's immediate post-dominator (None: the function's exit, or a block
        that never reaches one)."""
        exit_ = "<exit>"
        succ = {b: (list(self.succ[b]) or [exit_]) for b in self.order}
        # Post-order of the reversed graph, from the virtual exit.
        preds_rev = {b: list(self.pred[b]) for b in self.order}
        preds_rev[exit_] = [b for b in self.order if not self.succ[b]]
        post, seen = [], {exit_}
        stack = [(exit_, iter(preds_rev[exit_]))]
        while stack:
            node, it = stack[-1]
            nxt = next((p for p in it if p not in seen), None)
            if nxt is None:
                post.append(node)
                stack.pop()
            else:
                seen.add(nxt)
                stack.append((nxt, iter(preds_rev[nxt])))
        index = {b: k for k, b in enumerate(post)}
        ipdom: dict[str, str] = {exit_: exit_}

        def intersect(a: str, b: str) -> str:
            while a != b:
                while index[a] < index[b]:
                    a = ipdom[a]
                while index[b] < index[a]:
                    b = ipdom[b]
            return a

        changed = True
        while changed:
            changed = False
            for node in reversed(post[:-1]):  # reverse post-order, the exit excluded
                candidates = [s for s in succ[node] if s in ipdom]
                if not candidates:
                    continue
                new = candidates[0]
                for s in candidates[1:]:
                    new = intersect(s, new)
                if ipdom.get(node) != new:
                    ipdom[node] = new
                    changed = True
        return {b: (None if ipdom.get(b, exit_) == exit_ else ipdom[b]) for b in self.order}


@dataclass
class Liveness:
    """Which values are live at the start of each block (phi results excluded: they are
    made on entry) and on each edge."""

    live_in: dict[str, set[str]]
    live_out: dict[str, set[str]]

    @classmethod
    def of(cls, function: Function, graph: Graph) -> Liveness:
        values = function.values()
        uses: dict[str, set[str]] = {}
        defs: dict[str, set[str]] = {}
        edge_uses: dict[tuple[str, str], set[str]] = {}
        for block in function.blocks:
            used, defined = set(), set()
            for inst in block.instructions:
                if inst.opcode == "phi":
                    for value, pred in inst.incoming():
                        edge_uses.setdefault((pred, block.name), set()).update(
                            v for v in locals_in(value) if v in values)
                else:
                    used.update(v for v in inst.operands() if v in values and v not in defined)
                if inst.result:
                    defined.add(inst.result)
            uses[block.name], defs[block.name] = used, defined
        live_in = {b: set() for b in graph.order}
        live_out = {b: set() for b in graph.order}
        changed = True
        while changed:
            changed = False
            for b in reversed(graph.order):
                out = set()
                for s in graph.succ[b]:
                    out |= live_in[s]
                    out |= edge_uses.get((b, s), set())
                new_in = uses[b] | (out - defs[b])
                if out != live_out[b] or new_in != live_in[b]:
                    live_out[b], live_in[b] = out, new_in
                    changed = True
        return cls(live_in, live_out)

