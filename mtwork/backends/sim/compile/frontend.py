"""The Metal front end every compile on the emulator passes: what Apple's compiler would
refuse is refused here, at the author's lines, with the rule and its section of the Metal
Shading Language specification (`MetalRuleError`), even where clang builds the kernel as
C++. The check runs in a thread beside the build (`Check`), and its verdict comes first.

Two parts: the text rules (`mtwork.msl.rules`: excluded C++ features, scalar types,
program-scope and threadgroup variables, kernel arguments, function constants, the GPU
family's limits) and the address-space check (`address_spaces.py`, clang parsing the
program with Metal's address spaces as real ones). Both are cached by content.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator

from ....dispatch import BodyForm, Program
from ....errors import MetalRuleError
from ....msl.lexing import code_mask, code_without_directives, matching
from ....msl.rules import Violation, text_violations
from .address_spaces import address_space_violations

__all__ = ["Check", "checking_every_file", "violations"]

_DEFINE = re.compile(r"^#define\s+([A-Za-z_]\w*)(?:\s+(.*))?$", re.M)
# A function constant's value (`msl/constants.py`) is named only by the rewritten code.
_CONSTANT_VALUE = "__mtw_fc_"
_every_file = threading.local()


@contextlib.contextmanager
def checking_every_file() -> Iterator[None]:
    """Within it, the check holds every file a kernel includes to the rules, MLX's headers
    too (the conformance suite's check of the check: Apple compiles them all)."""
    before = getattr(_every_file, "on", False)
    _every_file.on = True
    try:
        yield
    finally:
        _every_file.on = before


def _holding_every_file() -> bool:
    return getattr(_every_file, "on", False)


def text_rule_violations(program: Program) -> tuple[Violation, ...]:
    """What the text rules find in `program`'s sources."""
    src = program.sources
    defines = tuple((m.group(1), m.group(2) or "1") for m in _DEFINE.finditer(program.defines)
                    if not m.group(1).startswith(_CONSTANT_VALUE)
                    or _names_constant_values(program))
    form = program.form
    if isinstance(form, BodyForm):
        regions = tuple((r.first, r.last, r.name, r.offset) for r in src.regions)
        return text_violations(src.text, label=src.label, target=program.msl_target,
                               prelude=src.prelude, defines=defines, regions=regions,
                               authored=(("source", form.source), ("header", form.header)),
                               kernels=False, every_file=_holding_every_file())
    return text_violations(src.text, label=src.label, target=program.msl_target, files=src.files,
                           search_dirs=src.search_dirs, prelude=src.prelude, defines=defines,
                           every_file=_holding_every_file())


def _names_constant_values(program: Program) -> bool:
    """Whether anything the text rules read names a function constant's value macro: the
    author's texts never do, so those defines change nothing they see, and without them
    the preprocessor's run is the one `load_metal` made (its cache's)."""
    src = program.sources
    return any(_CONSTANT_VALUE in t for t in (src.text, src.prelude,
                                              *(text for _, text in src.files)))


def violations(program: Program) -> tuple[Violation, ...]:
    """Every rule `program` breaks: the text rules', then the address-space check's
    (where the program can break one)."""
    every_file = _holding_every_file()
    checked = every_file or not (_plain_values(program) or _no_author_code(program))
    return (*text_rule_violations(program),
            *(address_space_violations(program, every_file=every_file) if checked else ()))


_ADDRESS_SPACE_WORD = re.compile(r"\b(?:device|constant|threadgroup|thread)\b")
_AMPERSAND = re.compile(r"(?<!&)&(?![&=])")
_OUT_PARAMETERS = re.compile(r"\b(?:frexp|modf|sincos|remquo)\s*\(")
# `threadgroup float tile[64];`: one threadgroup array, in a statement of its own.
_THREADGROUP_ARRAY = re.compile(
    r"(?:^|(?<=[;{}]))\s*(?P<word>threadgroup)\s+(?:const\s+)?[A-Za-z_][\w:]*"
    r"(?:\s*<[^;<>{}()]*>)?\s+(?P<name>[A-Za-z_]\w*)\s*(?:\[[^\[\];]*\]\s*)+;", re.M)


def _no_author_code(program: Program) -> bool:
    """Whether a full-source program's own files (and prelude) hold nothing but
    preprocessor lines and comments (MLX's kernels named by their headers, instantiated
    by the check's own line): the address-space check reports only what is at the
    author's lines, or instantiated from them, and there is none, so it can be spared."""
    if isinstance(program.form, BodyForm):
        return False
    src = program.sources
    return all(not code_without_directives(text).strip()
               for text in (src.text, src.prelude, *(text for _, text in src.files)))


def _plain_values(program: Program) -> bool:
    """Whether a body-form kernel's own code reaches its buffers and threadgroup arrays
    only as values, so no pointer or reference in it can change address space and the
    address-space check can be spared: no address-space word but in the declaration of a
    threadgroup array, no `&` (address-of, reference), every buffer (MLX's shape and
    strides included) and threadgroup array subscripted at once with no member access
    after, no call of a function that writes through a reference argument."""
    form = program.form
    if not isinstance(form, BodyForm):
        return False
    code = code_mask(form.header + "\n" + form.source)
    arrays = []
    for m in _THREADGROUP_ARRAY.finditer(code):
        arrays.append(m.group("name"))
        code = code[:m.start("word")] + " " * len("threadgroup") + code[m.end("word"):]
    if _ADDRESS_SPACE_WORD.search(code) or _AMPERSAND.search(code) or \
            _OUT_PARAMETERS.search(code):
        return False
    buffers = [p.name for p in program.params if p.kind == "buffer"
               and not (p.derived and p.derived[0] == "ndim")]
    for name in (*buffers, *arrays):
        for m in re.finditer(rf"\b{re.escape(name)}\b", code):
            after = code[m.end():].lstrip()
            if not after.startswith("["):
                return False
            close = matching(code, m.end() + code[m.end():].index("["), "[", "]")
            if re.match(r"\s*(?:\.|->|\[)", code[close:]):
                return False
    return True


class Check:
    """The check of one program, run in a thread of its own from the moment it is made
    (beside the build); `verdict()` waits for it and raises what it found."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self._every_file = _holding_every_file()
        self._found: tuple[Violation, ...] = ()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="mtwork-metal-check",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if self._every_file:
                with checking_every_file():
                    self._found = violations(self.program)
            else:
                self._found = violations(self.program)
        except BaseException as exc:  # noqa: BLE001 - raised again by verdict()
            self._error = exc

    def verdict(self) -> None:
        """Waits for the check; raises `MetalRuleError` when the program breaks a rule
        (or what stopped the check)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._found:
            raise MetalRuleError(self.program.label, self._found)
