"""The Metal front end's rules: what Apple's Metal compiler refuses that the emulator's
C++ would accept, each with its section of the Metal Shading Language specification.

- `table`: the rules (`RULES`) and a `Violation` of one;
- `code`: the author's code after the preprocessor, as the rules read it;
- `features`: C++ features Metal leaves out, and its scalar types;
- `scope`: program-scope and threadgroup variables;
- `kernels`: kernel functions, their arguments, function constants, the family's limits;
- `check`: all of them over one program's source (`text_violations`).

Conversions between address spaces need the types of expressions: the emulator checks
them with clang (`mtwork.backends.sim.compile.address_spaces`).
"""

from .check import text_violations
from .kernels import signature_violations
from .table import RULES, SPEC, Rule, Violation

__all__ = ["RULES", "SPEC", "Rule", "Violation", "signature_violations", "text_violations"]
