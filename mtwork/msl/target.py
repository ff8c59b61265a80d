"""What a kernel is compiled for: the Metal Shading Language version and the Apple GPU
family, as Apple's compiler and the Metal runtime would hold it to them.

The version decides which rules of the language apply (lambdas from MSL 3.2, placement
``new`` from 4.1, ...) and what the compiler predefines (MSL 3.2 specification, section
1.6.2 "Preprocessor Definitions": ``__METAL_VERSION__`` as MajorMinorPatch, ``__METAL__``
from MSL 3.0, ``__METAL_MACOS__``; ``__HAVE_BFLOAT__`` where the language has ``bfloat``,
MSL 3.1 and later, which MLX's and llama.cpp's sources test). The family decides the
limits a dispatch must keep (Apple's Metal feature set tables).

The default is what MLX compiles with: MLX 0.32 asks Metal for MSL 3.1 on macOS 14, 3.2
on macOS 15 and 4.0 on macOS 26 (``get_metal_version`` in ``mlx/backend/metal/
device.cpp``); mtwork's default is 3.2, the version of macOS 15, which the emulator's
Metal library is written to. ``MTWORK_MSL_VERSION`` and ``MTWORK_GPU_FAMILY`` change the
default; ``msl_version=`` and ``gpu_family=`` on a kernel change it for that kernel.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import total_ordering

__all__ = ["DEFAULT_FAMILY", "DEFAULT_MSL_TARGET", "DEFAULT_VERSION", "FAMILIES", "FamilyLimits",
           "MslTarget", "MslVersion", "resolve_target"]


@total_ordering
@dataclass(frozen=True)
class MslVersion:
    """A Metal Shading Language version, e.g. ``MslVersion(3, 2)`` ("3.2")."""

    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    def __lt__(self, other: MslVersion) -> bool:
        return (self.major, self.minor) < (other.major, other.minor)

    @property
    def macro(self) -> int:
        """``__METAL_VERSION__``: MajorMinorPatch, 320 for 3.2."""
        return self.major * 100 + self.minor * 10

    @classmethod
    def parse(cls, value: object, what: str = "msl_version") -> MslVersion:
        """"3.2", "metal3.2", 3.2 or 320 as a version mtwork knows; a clear error else."""
        if isinstance(value, MslVersion):
            return value
        text = str(value).strip().lower()
        text = text.removeprefix("metal").removeprefix("msl").strip()
        m = re.fullmatch(r"(\d)\.(\d)(?:\.0)?|(\d)(\d)0", text)
        if isinstance(value, bool) or m is None:
            raise ValueError(f"`{what}` must be one of {', '.join(VERSIONS)} (as \"3.2\"), "
                             f"got {value!r}")
        major, minor = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        version = cls(int(major), int(minor))
        if str(version) not in VERSIONS:
            raise ValueError(f"`{what}` must be one of {', '.join(VERSIONS)}, got {value!r}: "
                             f"mtwork's Metal library is written for these")
        return version


# The versions the emulator's Metal library covers (MLX 0.32 runs on macOS 14 and later,
# which compile MSL 3.1 and later; 3.0 is macOS 13's).
VERSIONS = ("3.0", "3.1", "3.2", "4.0", "4.1")
DEFAULT_VERSION = MslVersion(3, 2)


@dataclass(frozen=True)
class FamilyLimits:
    """What one Apple GPU family allows a compute dispatch (Metal feature set tables:
    "Maximum threads per threadgroup", "Maximum total threadgroup memory allocation",
    "Maximum number of entries in the buffer argument table, per graphics or kernel
    function")."""

    name: str
    chips: str
    threads_per_threadgroup: int = 1024
    threadgroup_memory: int = 32 * 1024
    buffer_slots: int = 31


# Apple silicon Macs: every family MLX runs on has the same compute limits.
FAMILIES: dict[str, FamilyLimits] = {f.name: f for f in (
    FamilyLimits("apple7", "M1"),
    FamilyLimits("apple8", "M2"),
    FamilyLimits("apple9", "M3, M4"),
    FamilyLimits("apple10", "M5"),
)}
DEFAULT_FAMILY = "apple7"


@dataclass(frozen=True)
class MslTarget:
    """The language version and GPU family a kernel is checked and compiled for."""

    msl_version: MslVersion = DEFAULT_VERSION
    gpu_family: str = DEFAULT_FAMILY

    @property
    def limits(self) -> FamilyLimits:
        return FAMILIES[self.gpu_family]

    def predefined_macros(self) -> dict[str, str]:
        """What Apple's compiler defines before the first line for this version."""
        v = self.msl_version
        macros = {"__METAL_VERSION__": str(v.macro), "__METAL_MACOS__": "1"}
        if v >= MslVersion(3, 0):
            macros["__METAL__"] = "1"
        if v >= MslVersion(3, 1):
            macros["__HAVE_BFLOAT__"] = "1"
        return macros

    def define_flags(self) -> tuple[str, ...]:
        """`predefined_macros` as a compiler's command-line definitions (``-DNAME=VALUE``)."""
        return tuple(f"-D{name}={value}" for name, value in self.predefined_macros().items())

    def __str__(self) -> str:
        return f"MSL {self.msl_version} on {self.gpu_family}"


DEFAULT_MSL_TARGET = MslTarget()


def _family(value: object, what: str) -> str:
    text = str(value).strip().lower().replace("_", "").replace(" ", "")
    text = text.removeprefix("mtlgpufamily")
    if isinstance(value, str) and text in FAMILIES:
        return text
    known = ", ".join(f"{f.name} ({f.chips})" for f in FAMILIES.values())
    raise ValueError(f"`{what}` must be an Apple GPU family: {known}; got {value!r}")


def resolve_target(msl_version: object = None, gpu_family: object = None) -> MslTarget:
    """The target of a kernel: the arguments given, else $MTWORK_MSL_VERSION and
    $MTWORK_GPU_FAMILY, else MSL 3.2 on apple7."""
    if msl_version is None:
        env = os.environ.get("MTWORK_MSL_VERSION", "").strip()
        version = MslVersion.parse(env, "MTWORK_MSL_VERSION") if env else DEFAULT_VERSION
    else:
        version = MslVersion.parse(msl_version)
    if gpu_family is None:
        env = os.environ.get("MTWORK_GPU_FAMILY", "").strip()
        family = _family(env, "MTWORK_GPU_FAMILY") if env else DEFAULT_FAMILY
    else:
        family = _family(gpu_family, "gpu_family")
    return MslTarget(version, family)
