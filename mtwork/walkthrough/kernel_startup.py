"""Run by each notebook kernel that `mtwork run` starts, before the notebook's first cell
(the kernel's PYTHONSTARTUP file, which IPython runs).

plotly's renderers import nbformat, which imports jsonschema, whose optional check of the
"iri" string format (`rfc3987_syntax`, installed with Jupyter's event schemas) compiles
38 grammars when it is imported: 0.9 s of every kernel's start, for a check that no
walkthrough makes. Marked absent, the module is skipped by jsonschema as where it is not
installed; its other formats stay.
"""

import sys

sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[assignment]
