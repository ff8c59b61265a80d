"""The README's examples run as written, in order, on sim."""

import re
import textwrap
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def python_blocks() -> list[str]:
    text = README.read_text()
    return [textwrap.dedent(block) for block in
            re.findall(r"^ *```python\n(.*?)^ *```", text, flags=re.S | re.M)]


def test_the_readme_examples_run(capsys):
    blocks = python_blocks()
    assert len(blocks) >= 2  # the kernel, then the editor on it
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    printed = capsys.readouterr().out
    assert "PASS" in printed  # the diff of the first example
    editor = namespace["ed"]
    outcome = editor.wait(120)
    assert outcome is not None and outcome.status == "ok", outcome
