"""The documentation site builds from the docstrings with warnings as errors, offline, and
holds what the README promises: the API reference and the tutorial notebook as a page, the
guides first and the records after. The architecture map names only files and modules that
exist."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "docs" / "mkdocs.yml"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(CONFIG), "-d", str(out)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text(encoding="utf-8")


def test_the_api_reference_documents_the_public_names(site):
    kernels, tuning = page(site, "api/kernels"), page(site, "api/tuning")
    for name in ("mtwork.metal_kernel", "mtwork.Launch", "mtwork.KernelSpec",
                 "mtwork.load_metal"):
        assert f'id="{name}"' in kernels, name
    assert 'id="mtwork.sweep.driver.sweep"' in tuning
    assert "returns a `Launch`" in tuning or "returns a <code>Launch</code>" in tuning
    plots = page(site, "api/plots")
    for name in ("heatmap", "lines", "speedup_bars", "roofline", "setup_offline"):
        assert f'id="mtwork.plots.{name}"' in plots, name


def test_the_tutorial_page_is_the_notebook_with_its_formulas_as_mathml(site):
    tutorial = page(site, "tutorial")
    assert "Your first kernel" in tutorial and "<math" in tutorial
    assert "mtwork.editor(" in tutorial and "mtwork.sweep(" in tutorial
    text = re.sub(r"<pre.*?</pre>|<code.*?</code>|<script.*?</script>", "", tutorial, flags=re.S)
    assert not re.search(r"\$[^$\n<]{1,40}\$", text)


def test_the_site_asks_no_font_or_script_service(site):
    for html in site.rglob("*.html"):
        text = html.read_text(encoding="utf-8")
        assert not re.search(r'<(script|link)[^>]+(src|href)="https?://', text), html


def test_the_navigation_shows_the_guides_then_the_reference_then_the_records(site):
    nav = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))["nav"]
    titles = [next(iter(entry)) for entry in nav]
    assert titles[:3] == ["Home", "Your first kernel", "The command"], titles
    assert titles.index("Guides") < titles.index("Architecture") < titles.index(
        "API reference") < titles.index("Records") == len(titles) - 1, titles
    sections = {next(iter(e)): next(iter(e.values())) for e in nav}
    guides = [next(iter(e.values())) for e in sections["Guides"]]
    records = [next(iter(e.values())) for e in sections["Records"]]
    assert all("/" not in g for g in guides) and all(r.startswith("records/") for r in records)
    # Every page in docs/ is a guide of the site, every record in docs/records/ a record
    # (a generated record's preamble aside).
    assert {p.name for p in (ROOT / "docs").glob("*.md")} == {*guides, "architecture.md"}
    assert {f"records/{p.name}" for p in (ROOT / "docs" / "records").glob("*.md")
            if not p.name.endswith(".intro.md")} == set(records)
    for name in [*guides, *records]:
        assert (site / name.removesuffix(".md") / "index.html").is_file(), name
    # Each record links its guide, and the guide links back.
    for record in records:
        text = (ROOT / "docs" / record).read_text(encoding="utf-8")
        linked = [g for g in guides if f"](../{g})" in text]
        assert linked, f"{record} links no guide"
        assert any(f"]({record}" in (ROOT / "docs" / g).read_text(encoding="utf-8")
                   for g in linked), f"the guide {record} links has no link back"


# --- every file and module docs/architecture.md names exists ------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"
FILE_SUFFIXES = (".py", ".cpp", ".h", ".inc", ".md", ".yml", ".ipynb", ".toml")
UNTRACKED = ("out/",)  # folders mtwork writes, not part of a checkout
SIM = "mtwork/backends/sim/"


def repository_paths() -> set[str]:
    """Every file and folder of the checkout's trees, as paths from its root (folders with a
    trailing slash)."""
    paths = set()
    for top in ("mtwork", "tests", "bench", "docs", "notebooks", "kernels"):
        paths.add(top + "/")
        for path in (ROOT / top).rglob("*"):
            if "__pycache__" not in path.parts:
                rel = path.relative_to(ROOT).as_posix()
                paths.add(rel + "/" if path.is_dir() else rel)
    return paths


def modules() -> dict[tuple[str, ...], Path]:
    """mtwork's modules by their dotted parts (a package by its folder's)."""
    found = {}
    for path in (ROOT / "mtwork").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[parts[:-1] if parts[-1] == "__init__" else parts] = path
    return found


def defines(source: str, name: str) -> bool:
    """Whether a module's text defines or imports `name`."""
    imports = " ".join(re.findall(r"^\s*from\s+\S+\s+import\s+(\([^)]*\)|[^\n]*)", source,
                                  flags=re.M))
    return bool(re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]",
                          source, flags=re.M) or re.search(rf"\b{name}\b", imports))


def unroomed(parts: list[str] | tuple[str, ...], hits: list[str]) -> str | None:
    """Why a name found only inside the emulator's rooms is ambiguous on the map: it
    leaves out its room (`sources.py` for `compile/sources.py`), or None."""
    if not hits or any(not hit.startswith(SIM) for hit in hits):
        return None
    inside = [hit[len(SIM):] for hit in hits]
    rooms = {rest.split("/")[0] for rest in inside if "/" in rest}
    if rooms and not rooms & set(parts):
        return f"name its room: {' or '.join(sorted(rooms))}/"
    return None


def missing(token: str, paths: set[str], mods: dict[tuple[str, ...], Path]) -> str | None:
    """Why a backticked `token` names nothing in the checkout, or None (also for a token
    that is no file or module path: code, a variable, a name of another project)."""
    token = re.sub(r"\(.*\)$", "", token)
    if re.search(r"[\s<>*$=,]", token) or token.startswith(UNTRACKED):
        return None
    if token.endswith(FILE_SUFFIXES) or token.endswith("/"):
        hits = [p for p in paths if p == token or p.endswith("/" + token)]
        if not hits:
            return "no such file or folder"
        return unroomed(token.rstrip("/").split("/"), hits)
    if not re.fullmatch(r"[A-Za-z_]\w*([./][A-Za-z_]\w*)+", token):
        return None
    parts = tuple(token.replace("/", ".").split("."))
    for cut in range(len(parts), 0, -1):  # the longest prefix that is a module
        found = [path for mod, path in mods.items() if mod[-cut:] == parts[:cut]]
        if found:
            roomless = unroomed(parts[:cut], [p.relative_to(ROOT).as_posix() for p in found])
            if roomless or cut == len(parts):
                return roomless
            name = parts[cut]
            if any(defines(p.read_text(encoding="utf-8"), name) for p in found):
                return None
            return f"no `{name}` in {', '.join(str(p.relative_to(ROOT)) for p in found)}"
    return None  # not one of mtwork's modules (a class's attribute, another package's name)


def test_the_architecture_map_names_only_what_exists():
    paths, mods = repository_paths(), modules()
    tokens = re.findall(r"`([^`\n]+)`", ARCHITECTURE.read_text(encoding="utf-8"))
    problems = {t: why for t in tokens if (why := missing(t, paths, mods))}
    assert not problems, problems
    # It checks something: the flat emulator's paths, a module without its room, a name
    # its module lacks.
    assert missing("backends/sim/isolation.py", paths, mods)
    assert missing("lockstep.py", paths, mods) == "name its room: compile/"
    assert missing("sources.translation_unit", paths, mods) == "name its room: compile/"
    assert missing("compile.sources.no_such_function", paths, mods)
    assert missing("run.memory.Memory", paths, mods) is None
    assert missing("dispatch.check_memory", paths, mods) is None


def test_every_sim_room_is_on_the_map():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    sim = ROOT / "mtwork" / "backends" / "sim"
    rooms = {p.name for p in sim.iterdir() if p.is_dir() and p.name != "__pycache__"}
    for room in rooms:
        assert f"`backends/sim/{room}/`" in text, room
    for module in sim.glob("*/*.py"):
        if module.name != "__init__.py":
            assert f"{module.parent.name}/{module.name}" in text, module
