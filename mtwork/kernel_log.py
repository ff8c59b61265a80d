"""What a kernel's logging calls wrote: Metal's `os_log` (MSL 3.2 specification, section
6.19), recorded on `sim` per thread.

On `sim` every message of `os_log_default.log(...)` or an `os_log(subsystem, category)`'s
`log`, `log_debug`, `log_info`, `log_error` and `log_fault` is kept with the thread that
wrote it (its threadgroup, its position in the threadgroup and in the grid, its SIMD-group
and lane) and the source line of the call: `kernel.last_log` is a `KernelLog`, a table of
them, threadgroup by threadgroup and thread by thread, each thread's messages in the order
it wrote them. `where(...)` filters it; printed it shows its first messages and a count of
the rest, in Jupyter as an HTML table. A kernel that logs prints its first messages under
the call by default ($MTWORK_LOG_PRINT: how many, 0 for none; tools that run kernels many
times, such as timing, sweeps and the editor, print nothing). The log of a dispatch is
bounded ($MTWORK_LOG_BUFFER_SIZE bytes, 1 MiB by default, as Metal's log buffer): what
does not fit is counted and said. A kernel that faults or times out keeps the messages it
wrote before, and its error names the last messages of the threads involved.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, NamedTuple

from .display import bytes_text, count_text, html_table, text_table

__all__ = ["KernelLog", "LogMessage", "announce", "kept", "no_messages", "printing", "quietly",
           "with_log"]

Triple = tuple[int, int, int]
_LEVELS = ("default", "debug", "info", "error", "fault")
SIMD_WIDTH = 32
SHOWN = 20  # messages a printed log shows
SHOWN_HTML = 200  # rows of its HTML table


class LogMessage(NamedTuple):
    """One message: the thread that wrote it (`threadgroup` is
    threadgroup_position_in_grid, `thread` thread_position_in_threadgroup, `grid`
    thread_position_in_grid, `index` thread_index_in_threadgroup, with its `simdgroup` and
    `lane`), the call's place (`file` as the author names it: "source", "header", a file
    of a full-source kernel, an MLX header; `line`, 0 when not known) and the text."""

    threadgroup: Triple
    thread: Triple
    grid: Triple
    index: int
    file: str
    line: int
    text: str
    level: str = "default"
    subsystem: str = ""
    category: str = ""
    cut: bool = False  # the text was cut at 1024 bytes, as Metal cuts it
    order: int = 0  # its place among the dispatch's messages as written

    @property
    def simdgroup(self) -> int:
        return self.index // SIMD_WIDTH

    @property
    def lane(self) -> int:
        return self.index % SIMD_WIDTH

    @property
    def place(self) -> str:
        """``file:line``, e.g. "source:4"."""
        return f"{self.file}:{self.line}" if self.line else self.file

    def who(self) -> str:
        return f"thread {_xyz(self.thread)} of threadgroup {_xyz(self.threadgroup)}"

    def __str__(self) -> str:
        level = "" if self.level == "default" else f"[{self.level}] "
        return f"{self.who()} at {self.place}: {level}{self.text}"


def _xyz(t: Triple) -> str:
    return f"({t[0]},{t[1]},{t[2]})"


def _triple(value: Any, what: str) -> Triple:
    """`value` as (x, y, z): an int is (x, 0, 0); a sequence of one to three ints, the
    rest 0."""
    items = (value,) if isinstance(value, int) and not isinstance(value, bool) else value
    try:
        items = tuple(items)
    except TypeError:
        items = ()
    if not 1 <= len(items) <= 3 or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in items):
        raise ValueError(f"`{what}` must be an int or one to three ints (x[, y[, z]]), "
                         f"got {value!r}")
    padded = (*items, 0, 0)[:3]
    return padded[0], padded[1], padded[2]


def _line_test(line: Any) -> Any:
    if isinstance(line, int) and not isinstance(line, bool):
        return lambda m: m.line == line
    if isinstance(line, str) and line:
        file, _, number = line.rpartition(":")
        if file and number.isdigit():
            return lambda m: m.file == file and m.line == int(number)
        return lambda m: m.file == line
    raise ValueError(f"`line` must be a line number or 'file:line' (e.g. 'source:4'), "
                     f"got {line!r}")


def _ordered(messages: Iterable[LogMessage]) -> tuple[LogMessage, ...]:
    """Threadgroup by threadgroup (x fastest, as the grid counts them), thread by thread,
    each thread's messages as it wrote them."""
    return tuple(sorted(messages, key=lambda m: (m.threadgroup[::-1], m.index, m.order)))


@dataclass(frozen=True)
class KernelLog:
    """The messages one dispatch of a kernel wrote (see the module's documentation).
    `dropped` messages did not fit in the log's `capacity` bytes; `truncated` ones were cut
    at 1024 bytes; `incomplete`: the process running the kernel died while writing one.
    `note` says where the log came from when that is worth saying (a call sent to sim)."""

    kernel: str
    messages: tuple[LogMessage, ...] = ()
    dropped: int = 0
    capacity: int = 0
    truncated: int = 0
    incomplete: bool = False
    note: str = ""
    of: int | None = field(default=None, compare=False)  # messages before a `where`

    @classmethod
    def of_messages(cls, kernel: str, messages: Iterable[LogMessage], **fields: Any
                    ) -> KernelLog:
        """A log of `messages` in the table's order (see `_ordered`)."""
        return cls(kernel, _ordered(messages), **fields)

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self) -> Iterator[LogMessage]:
        return iter(self.messages)

    def __getitem__(self, index: int) -> LogMessage:
        return self.messages[index]

    @property
    def texts(self) -> list[str]:
        """The messages' texts, in the table's order."""
        return [m.text for m in self.messages]

    def where(self, *, thread: Any = None, threadgroup: Any = None, grid: Any = None,
              line: Any = None, lane: int | None = None, level: str | None = None,
              contains: str | None = None) -> KernelLog:
        """The messages that match every filter given: `thread` (its position in the
        threadgroup; an int is (x, 0, 0)), `threadgroup`, `grid` (thread_position_in_grid),
        `line` (a number, or "file:line"), `lane` (in its SIMD-group), `level` ("default",
        "debug", "info", "error", "fault") or text that `contains` a string."""
        tests = []
        if thread is not None:
            want_thread = _triple(thread, "thread")
            tests.append(lambda m: m.thread == want_thread)
        if threadgroup is not None:
            want_group = _triple(threadgroup, "threadgroup")
            tests.append(lambda m: m.threadgroup == want_group)
        if grid is not None:
            want_grid = _triple(grid, "grid")
            tests.append(lambda m: m.grid == want_grid)
        if line is not None:
            tests.append(_line_test(line))
        if lane is not None:
            if not isinstance(lane, int) or not 0 <= lane < SIMD_WIDTH:
                raise ValueError(f"`lane` must be 0 to {SIMD_WIDTH - 1}, got {lane!r}")
            tests.append(lambda m: m.lane == lane)
        if level is not None:
            if level not in _LEVELS:
                raise ValueError(f"`level` must be one of {', '.join(_LEVELS)}, got {level!r}")
            tests.append(lambda m: m.level == level)
        if contains is not None:
            tests.append(lambda m: contains in m.text)
        kept = tuple(m for m in self.messages if all(t(m) for t in tests))
        return replace(self, messages=kept, of=self.of if self.of is not None else len(self))

    def last(self, thread: Any, threadgroup: Any = 0, n: int = 3) -> tuple[LogMessage, ...]:
        """The last `n` messages of one thread (its position in `threadgroup`)."""
        return self.where(thread=thread, threadgroup=threadgroup).messages[-n:]

    def last_words(self, threads: Iterable[tuple[Triple, Triple]], n: int = 3) -> list[str]:
        """For each (threadgroup, thread) that wrote any, a line with its last `n`
        messages: what a fault's or a sanitizer finding's report quotes."""
        lines = []
        for group, thread in dict.fromkeys(threads):
            last = self.last(thread, group, n)
            if last:
                quoted = "; ".join(f'{m.place}: "{m.text}"' for m in last)
                lines.append(f"last messages of thread {_xyz(thread)} of threadgroup "
                             f"{_xyz(group)}: {quoted}")
        return lines

    def summary(self) -> str:
        """One line: how many messages, and what did not make it."""
        count = len(self)
        head = (f"kernel `{self.kernel}` logged {count_text(count)} "
                f"message{'s' if count != 1 else ''}")
        if self.of is not None:
            head = (f"{count_text(count)} of the {count_text(self.of)} messages of kernel "
                    f"`{self.kernel}`")
        return "; ".join([head, *self.losses()])

    def losses(self) -> list[str]:
        """What the log could not keep, said."""
        said = []
        if self.dropped:
            said.append(f"{count_text(self.dropped)} more were dropped: the log "
                        f"({bytes_text(self.capacity)} a dispatch; $MTWORK_LOG_BUFFER_SIZE "
                        f"sets it) was full")
        if self.truncated:
            said.append(f"{count_text(self.truncated)} were cut at 1024 bytes, as Metal "
                        f"cuts them")
        if self.incomplete:
            said.append("the process running the kernel died while writing the next one")
        if self.note:
            said.append(self.note)
        return said

    def rows(self, limit: int | None = None) -> list[list[str]]:
        """The table's rows: threadgroup, thread, SIMD lane, source line, message."""
        shown = self.messages if limit is None else self.messages[:limit]
        return [[_xyz(m.threadgroup), _xyz(m.thread), str(m.lane), m.place,
                 ("" if m.level == "default" else f"[{m.level}] ") + m.text] for m in shown]

    HEADER = ("threadgroup", "thread", "lane", "line", "message")

    def text(self, limit: int | None = SHOWN, *, indent: str = "") -> str:
        """The summary and the first `limit` messages (None: all) as a plain table."""
        lines = [indent + self.summary()]
        if self.messages:
            lines += text_table(self.HEADER, self.rows(limit), indent=indent + "  ")
        rest = len(self) - (len(self) if limit is None else min(limit, len(self)))
        if rest:
            lines.append(f"{indent}  … and {count_text(rest)} more (kernel.last_log.where(...) "
                         f"selects; .text(None) shows them all)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"<KernelLog of `{self.kernel}`: {len(self)} messages>"

    def _repr_html_(self) -> str:
        rest = len(self) - min(len(self), SHOWN_HTML)
        note = (f"… and {count_text(rest)} more: kernel.last_log.where(...) selects"
                if rest else "")
        rows = self.rows(SHOWN_HTML)
        mono = "font-family:monospace;white-space:pre-wrap"
        return html_table(header=self.HEADER, rows=rows, caption=self.summary(),
                          cell_styles=[["", "", "", mono, mono]] * len(rows), note=note)


# --- printing under the call ------------------------------------------------------------

_quiet = 0
_quiet_lock = threading.Lock()


@contextlib.contextmanager
def quietly() -> Iterator[None]:
    """Within it (in any thread), kernels' logs are not printed: for tools that run a
    kernel many times and show its log their own way."""
    global _quiet
    with _quiet_lock:
        _quiet += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet -= 1


def printing() -> int:
    """How many messages a call that logged prints: $MTWORK_LOG_PRINT (default 10; 0:
    none), and none inside `quietly`."""
    if _quiet:
        return 0
    value = os.environ.get("MTWORK_LOG_PRINT", "").strip()
    if not value:
        return 10
    if not value.isdigit():
        raise ValueError(f"MTWORK_LOG_PRINT must be how many messages a call prints (0: "
                         f"none), got {value!r}")
    return int(value)


@lru_cache(maxsize=1024)
def no_messages(kernel: str) -> KernelLog:
    """The empty log of `kernel`'s dispatches that keep no messages (a kernel without a
    logging call): one shared object, a log being immutable, so such a call pays nothing
    for it."""
    return KernelLog(kernel)


def kept(log: KernelLog | None, error: BaseException | None, note: str = ""
         ) -> KernelLog | None:
    """The log a kernel keeps of a dispatch: the completion's `log`, or the one its
    `error` carries; with `note` (why it ran where it did) when there is one."""
    found = log if error is None else getattr(error, "log", None)
    if found is not None and note:
        found = replace(found, note=note)
    return found


def announce(log: KernelLog | None) -> None:
    """Prints the first messages of a call that logged (see `printing`)."""
    shown = printing() if log is not None and (log.messages or log.dropped) else 0
    if shown and log is not None:
        print(log.text(shown), file=sys.stdout, flush=True)


# --- faults ------------------------------------------------------------------------------


def with_log(error: BaseException, log: KernelLog | None,
             threads: Sequence[tuple[Triple, Triple]] = ()) -> BaseException:
    """`error` (a kernel's fault) with the log of its dispatch as `.log`, and the last
    messages of `threads` (threadgroup, thread) said after its message."""
    said = log.last_words(threads) if log is not None else []
    if not said:
        with contextlib.suppress(AttributeError):  # an exception that takes no attributes
            error.log = log  # type: ignore[attr-defined]
        return error
    told = copy.copy(error)
    extra = "\n" + "\n".join(said)
    if hasattr(told, "detail"):
        told.detail = told.detail + extra  # type: ignore[attr-defined]
    told.args = (str(error) + extra, *error.args[1:])
    told.log = log  # type: ignore[attr-defined]
    told.__cause__, told.__traceback__ = error.__cause__, error.__traceback__
    return told
