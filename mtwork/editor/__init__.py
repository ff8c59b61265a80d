"""Live MSL editing in JupyterLab: `mtwork.editor(...)` (this package is callable) shows a
kernel's body (and header) in a code editor; edits compile, run on the notebook's inputs
and are diffed against the oracle as you type, with compile errors at their lines, knobs
for the kernel's parameters, and a sweep button. See `make.editor` for the arguments.

Modules: `loop` (the edit-compile-run-check loop, no widgets), `background` (its worker
thread), `knobs` (parameter space and constraints), `diagnostics` (compiler messages),
`outcome` (what a step gave), `panels` (HTML for the panels and the static copy),
`widget` (the Jupyter widgets) and `make` (`editor(...)`).

The browser side is `js/editor_src.js`, bundled with CodeMirror 6 into one ESM file,
`static/editor.js`, so the editor works offline. To rebuild it (Node.js 18+), in a folder
outside the repository:

    npm install codemirror@6.0.2 @codemirror/lang-cpp@6.0.3 @codemirror/lint@6.9.8 \\
        @codemirror/state@6.7.6 @codemirror/view@6.43.15 esbuild@0.28.2
    NODE_PATH=$PWD/node_modules npx esbuild <repo>/mtwork/editor/js/editor_src.js \\
        --bundle --format=esm --minify --legal-comments=none --target=es2020 \\
        "--banner:js=/* mtwork MSL editor: js/editor_src.js bundled with CodeMirror 6 (MIT, \\
see THIRD_PARTY_LICENSES.txt). */" --outfile=<repo>/mtwork/editor/static/editor.js

CodeMirror and its packages are MIT-licensed: static/THIRD_PARTY_LICENSES.txt.
"""

import sys
import types
from typing import Any

from .diagnostics import Diagnostic, parse_diagnostics
from .knobs import Knobs
from .loop import EditLoop
from .make import editor
from .outcome import Outcome
from .widget import CodeEditor, Editor, Snapshot

__all__ = [
    "CodeEditor",
    "Diagnostic",
    "EditLoop",
    "Editor",
    "Knobs",
    "Outcome",
    "Snapshot",
    "editor",
    "parse_diagnostics",
]


class _CallableModule(types.ModuleType):
    """`mtwork.editor(...)` makes an editor, and `mtwork.editor.Editor` & co. stay reachable."""

    def __call__(self, *args: Any, **kwargs: Any) -> Editor:
        return editor(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
