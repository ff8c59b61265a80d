"""Exceptions raised by mtwork. Each says what went wrong and how to fix it."""

from __future__ import annotations


class MtworkError(Exception):
    """Base class of mtwork's own errors."""


class CompileError(MtworkError):
    """The kernel's MSL did not compile. `message` quotes the compiler, with the author's
    own file names and line numbers (`source:3:5` is line 3 of the kernel body)."""

    def __init__(self, kernel: str, message: str):
        self.kernel = kernel
        self.message = message.rstrip()
        super().__init__(f"kernel `{kernel}` failed to compile:\n{self.message}")

    def __reduce__(self):  # errors cross from the emulator's worker process
        return type(self), (self.kernel, self.message)


class MetalRuleError(CompileError):
    """The kernel breaks a rule of the Metal Shading Language that Apple's compiler
    enforces (and the emulator's C++ would not): each line names the author's file and
    line, the rule and its section of the specification. `violations` holds them
    (`mtwork.msl.rules.Violation`); `docs/msl-rules.md` lists the rules."""

    def __init__(self, kernel: str, violations: tuple | list):
        self.violations = tuple(violations)
        super().__init__(kernel, "\n".join(str(v) for v in self.violations))

    def __reduce__(self):  # errors cross from the emulator's worker process
        return type(self), (self.kernel, self.violations)


class KernelFault(MtworkError, RuntimeError):
    """The kernel crashed while running (bad pointer, trap, stack overflow) or reported an
    error; the host process is unharmed."""

    def __init__(self, kernel: str, detail: str):
        self.kernel = kernel
        self.detail = detail
        super().__init__(f"kernel `{kernel}` faulted: {detail}")

    def __reduce__(self):  # errors cross from the emulator's worker process
        return type(self), (self.kernel, self.detail)


class KernelDeadlock(KernelFault):
    """Threads of a threadgroup can never go on: they wait at different barriers, or some
    returned while others wait at a barrier."""

    def __init__(self, kernel: str, detail: str):
        self.kernel = kernel
        self.detail = detail
        MtworkError.__init__(self, f"kernel `{kernel}` deadlocked: {detail}")


class KernelTimeout(KernelFault):
    """The kernel ran past the watchdog's limit and was stopped."""

    def __init__(self, kernel: str, detail: str):
        self.kernel = kernel
        self.detail = detail
        MtworkError.__init__(self, f"kernel `{kernel}` stopped: {detail}")


class KernelCancelled(KernelFault):
    """The kernel was stopped from outside (Ctrl-C, an editor's Stop) before it ended."""

    def __init__(self, kernel: str, detail: str):
        self.kernel = kernel
        self.detail = detail
        MtworkError.__init__(self, f"kernel `{kernel}` cancelled: {detail}")


class ThreadgroupMemoryError(KernelFault):
    """The kernel's threadgroup memory exceeds the 32 KiB a threadgroup has."""


class BackendUnavailable(MtworkError, RuntimeError):
    """The requested backend cannot run on this machine."""


class EmulatorUnavailable(BackendUnavailable):
    """The sim backend's tools (clang from ziglang, MLX's headers) are missing."""


class SweepError(MtworkError, ValueError):
    """A sweep (or an editor's knobs) is set up wrong: not one configuration's failure."""


class UnknownParameterError(SweepError, KeyError):
    """A constraint, build or metric asked for a parameter the space does not have."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class OracleError(SweepError):
    """The oracle raised before any configuration could be checked."""
