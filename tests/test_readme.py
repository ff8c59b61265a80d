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


def test_every_variable_the_package_reads_is_in_the_settings_table():
    root = Path(__file__).resolve().parents[1]
    read = set()
    for path in (root / "mtwork").rglob("*"):
        if path.is_file() and (path.suffix in {".py", ".h", ".cpp"}
                               or path.parent.name == "include"):
            read |= set(re.findall(r"MTWORK_[A-Z_]+[A-Z]", path.read_text(errors="replace")))
    read.discard("MTWORK_EMULATOR")  # the __HAVE_MTWORK_EMULATOR__ macro, not a variable
    readme = (root / "README.md").read_text()
    table = readme[readme.index("## Settings"):]
    table = table[:table.index("\n## ", 1)]
    documented = set(re.findall(r"^\| `(MTWORK_[A-Z_]+)` \|", table, flags=re.M))
    assert read - documented == set(), "read by the package but not in the README's table"
    assert documented - read == set(), "in the README's table but read nowhere"
