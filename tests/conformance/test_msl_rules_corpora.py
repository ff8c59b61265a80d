"""The check of the Metal front end's rules: llama.cpp's Metal library compiles on Apple's
compiler, so every one of its host names passes the front end (its text rules and its
address-space check) with no rejection. Check only, no build: every host name of every
library file under `-m slow` (1066 in llama-cpp-python 0.3.36), the first of each file by
default.

The other corpora pass the same check where the conformance suite compiles them (its
conftest holds every file to the rules): MLX's wheel headers (every kernel function of
every header, through test_mlx_compile.py and the tests that run kernels), mlx-lm's and
mlx-audio's kernels; the families in kernels/ and the tutorial notebook's kernel are
checked as the author's own code by their tests.
"""

from __future__ import annotations

import pytest

from mtwork.backends.sim.compile import frontend

from .llama_cpp import kernel_files, library
from .test_llama_cpp_compile import constants_of, host_names


def rejected(file: str, names: list[str]) -> list[str]:
    """The host names of `file` the front end refuses, with what it says."""
    lib = library(file)
    constants = constants_of(lib)
    out = []
    for name in names:
        found = frontend.violations(lib.kernel(name, constants=constants).program)
        out += [f"{name}: {v}" for v in found]
    return out


@pytest.mark.parametrize("file", kernel_files())
def test_the_first_host_name_of_a_file_passes_the_rules(file: str) -> None:
    assert rejected(file, host_names(library(file))[:1]) == []


@pytest.mark.slow
@pytest.mark.parametrize("file", kernel_files())
def test_every_host_name_passes_the_rules(file: str) -> None:
    assert rejected(file, host_names(library(file))) == []
