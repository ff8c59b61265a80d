"""The `mtwork` command: execute the kernel notebooks and publish HTML walkthroughs.

    mtwork run [NOTEBOOK ...] [-p NAME VALUE ...] [--backend B] [--out DIR] [--jobs N]
    mtwork kernels
    mtwork backends
    mtwork cache [info|clear]
    mtwork selftest [--backend B ...] [--kernel NAME ...] [--no-families]
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from pathlib import Path

from .walkthrough.execute import NotebookRun, run_notebook
from .walkthrough.export import export_html
from .walkthrough.parameters import notebook_parameters
from .walkthrough.shared_builds import start_shared_builds
from .walkthrough.side_by_side import run_notebooks

__all__ = ["export_html", "main", "parser", "run_notebook"]

DEFAULT_NOTEBOOKS = Path("notebooks")
DEFAULT_OUT = Path("out")
USAGE_ERROR = 2  # argparse's exit code for a bad command line; a backend that cannot run too

_PARAMETER_HELP = """\
set parameter NAME of the notebooks to VALUE (repeat -p for more). VALUE is read as a
Python literal when it is one (-p rows 8, -p dtypes "['float16']"), else taken as
text (-p sweep_dtype float16). A notebook gets the parameters it declares (its
cell tagged `parameters`); a NAME no notebook run declares is an error."""


def _parameter_value(text: str) -> object:
    """`-p n 4096` gives an int, `-p dtypes "['f32']"` a list, anything else a string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _jobs(text: str) -> int:
    """--jobs: a whole number of notebooks at once, at least 1."""
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return jobs


def _default_jobs(backend: str | None) -> int:
    """Notebooks at once when --jobs is not given: one per CPU on `sim`, whose kernels run
    on the CPU; one on `metal`, where side-by-side notebooks would share the GPU and
    disturb each other's timings."""
    from .backends import resolve

    return 1 if resolve(backend) == "metal" else os.cpu_count() or 1


def _notebooks(paths: list[str]) -> list[Path]:
    if paths:
        found = [Path(p) for p in paths]
    else:
        found = sorted(DEFAULT_NOTEBOOKS.glob("*.ipynb"))
        if not found:
            raise SystemExit(
                f"no notebooks found in {DEFAULT_NOTEBOOKS.resolve()}: run `mtwork run` from "
                "the mtwork checkout, or name the notebooks to run"
            )
    missing = [p for p in found if not p.is_file()]
    if missing:
        raise SystemExit(f"notebook not found: {', '.join(map(str, missing))}")
    return found


def _notebook_parameters_text() -> str:
    """The epilog of `mtwork run --help`: what each notebook of ./notebooks takes."""
    notebooks = sorted(DEFAULT_NOTEBOOKS.glob("*.ipynb"))
    if not notebooks:
        return ("Run `mtwork run --help` from the mtwork checkout to see the parameters of "
                "its notebooks.")
    lines = [f"parameters of the notebooks in {DEFAULT_NOTEBOOKS}/ (name = default: meaning):"]
    for notebook in notebooks:
        lines.append(f"  {notebook.name}")
        for p in notebook_parameters(notebook):
            lines.append(f"    {p.name} = {p.default}" + (f": {p.help}" if p.help else ""))
    return "\n".join(lines)


def _backend_problem(name: str | None) -> str | None:
    """Why `name` (None: this machine's default) cannot run kernels here, or None."""
    from .backends import backends, default_backend

    reasons = backends()
    chosen = name or default_backend()
    if chosen not in reasons:
        return f"unknown backend {chosen!r}: choose one of {', '.join(sorted(reasons))}"
    if reasons[chosen] is not None:
        return f"backend {chosen!r} cannot run here: {reasons[chosen]}"
    return None


def _parameters_for(notebooks: list[Path], parameters: dict[str, object]
                    ) -> tuple[dict[Path, dict[str, object]], str | None]:
    """Each notebook's share of the -p parameters, or an error naming what none declares."""
    declared = {nb: {p.name for p in notebook_parameters(nb)} for nb in notebooks}
    known = set().union(*declared.values())
    unknown = sorted(set(parameters) - known - {"backend"})
    if unknown:
        return {}, (f"no notebook run declares the parameter(s) {', '.join(unknown)}; "
                    f"they declare: {', '.join(sorted(known)) or 'none'}")
    return {nb: {k: v for k, v in parameters.items() if k in names or k == "backend"}
            for nb, names in declared.items()}, None


def _summary(runs: list[NotebookRun]) -> list[str]:
    from .display import seconds_text, text_table

    rows = []
    for run in runs:
        if run.ok:
            status = "ok"
        else:
            where = f" in cell [{run.failed_cell}]" if run.failed_cell is not None else ""
            status = f"FAILED{where}: {run.error}"[:100]
        rows.append([str(run.notebook), status, seconds_text(run.seconds),
                     str(run.html) if run.html else "(none)"])
    return text_table(["notebook", "status", "time", "HTML"], rows)


def _cmd_run(args: argparse.Namespace) -> int:
    parameters = {name: _parameter_value(value) for name, value in args.parameter}
    if args.backend:
        parameters["backend"] = args.backend
    backend = parameters.get("backend")
    problem = _backend_problem(backend if isinstance(backend, str) else None)
    if problem:
        print(f"mtwork run: {problem}", file=sys.stderr)
        return USAGE_ERROR
    notebooks = _notebooks(args.notebooks)
    shares, problem = _parameters_for(notebooks, parameters)
    if problem:
        print(f"mtwork run: {problem}", file=sys.stderr)
        return USAGE_ERROR
    env = {"MTWORK_BACKEND": backend} if isinstance(backend, str) else {}
    jobs = args.jobs or _default_jobs(backend if isinstance(backend, str) else None)
    shared_builds = start_shared_builds(backend if isinstance(backend, str) else None)
    runs = run_notebooks(notebooks, Path(args.out), shares, jobs=jobs, env=env)
    for thread in shared_builds:  # done long before on a real run; none outlives the command
        thread.join()
    print("\n".join(_summary(runs)))
    failed = [run for run in runs if not run.ok]
    if failed:
        print(f"{len(failed)} of {len(runs)} notebook(s) failed", file=sys.stderr)
        return 1
    return 0


def _cmd_kernels(_: argparse.Namespace) -> int:
    from .families import family_names, load_family

    for name in family_names():
        family = load_family(name)
        print(f"{name}: {getattr(family, 'DESCRIPTION', '')}")
        for kernel_name, spec in family.KERNELS.items():
            print(f"  {kernel_name:<28} {spec.description}")
    return 0


def _cmd_backends(_: argparse.Namespace) -> int:
    from .backends import backends, default_backend

    for name, reason in backends().items():
        print(f"{name:<6} {'usable' if reason is None else 'unusable: ' + reason}")
    print(f"default: {default_backend()}")
    return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    from .cachedir import cache_info, clear_cache
    from .display import bytes_text

    if args.action == "clear":
        print(f"removed {bytes_text(clear_cache())} from {cache_info()['path']}")
        return 0
    info = cache_info()
    print(f"path:      {info['path']}")
    print(f"size:      {bytes_text(info['bytes'])}, of which artefacts "
          f"{bytes_text(info['artefact_bytes'])} (limit {bytes_text(info['limit'])}, "
          f"MTWORK_CACHE_MAX)")
    print(f"artefacts: {info['artefacts']} ({info['kernels']} compiled kernels)")
    return 0


def _cmd_selftest(args: argparse.Namespace) -> int:
    from .selftest import selftest

    try:
        report = selftest(args.backend or None, families=args.families,
                          kernels=args.kernel or None)
    except ValueError as exc:  # an unknown backend or kernel
        print(f"mtwork selftest: {exc}", file=sys.stderr)
        return USAGE_ERROR
    print(report)
    if not report.backends:
        print("mtwork selftest: no backend can run here", file=sys.stderr)
        return USAGE_ERROR
    return 1 if report.failed else 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

    try:
        return version("mtwork")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return __version__


def parser() -> argparse.ArgumentParser:
    """The command line's parser (its subcommands and their options)."""
    top = argparse.ArgumentParser(prog="mtwork", description=__doc__.splitlines()[0])
    top.add_argument("--version", action="version", version=f"mtwork {_version()}")
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run", help="execute notebooks and write HTML walkthroughs",
        description=(
            "Execute notebooks with papermill, --jobs of them at once, the slowest first\n"
            "(a line as each starts and ends; with --jobs 1 a progress bar over each\n"
            "one's cells), and write an HTML walkthrough of each to --out, also of one\n"
            "that fails (its failing cell marked); a summary table in the order given\n"
            "ends the run. Exit status: 0 when every notebook ran, 1 when one failed, 2\n"
            "when the backend cannot run here or the command line is wrong."),
        epilog=_notebook_parameters_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("notebooks", nargs="*", help="notebooks to run (default: notebooks/*)")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[],
                     metavar=("NAME", "VALUE"), help=_PARAMETER_HELP)
    run.add_argument("--backend", help="backend for the kernels: sim or metal (default: "
                     "metal where MLX has a Metal device, else sim); checked before any "
                     "notebook starts")
    run.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (default: out)")
    run.add_argument("--jobs", "-j", type=_jobs, default=None, metavar="N",
                     help="notebooks run at once, the slowest first (default: the number of "
                          "CPUs on sim, 1 on metal, whose GPU they would share); with 1, "
                          "one after another with a progress bar over each "
                          "one's cells, else a line as each starts and ends")
    run.set_defaults(handler=_cmd_run)
    sub.add_parser("kernels", help="list the kernel families and their kernels").set_defaults(
        handler=_cmd_kernels
    )
    sub.add_parser("backends", help="which backends can run here").set_defaults(
        handler=_cmd_backends
    )
    cache = sub.add_parser("cache", help="what mtwork has cached, or clear it")
    cache.add_argument("action", nargs="?", choices=["info", "clear"], default="info")
    cache.set_defaults(handler=_cmd_cache)
    selftest = sub.add_parser(
        "selftest", help="check the toolchain and run a corpus of kernels on every backend",
        description=(
            "Check the toolchain, build the emulator's runtime, run a corpus of kernels\n"
            "(elementwise, half and bfloat, threadgroup memory, SIMD-group functions,\n"
            "simdgroup_matrix, atomics, MLX's own kernels, one of each kernel family) on\n"
            "every backend that can run here, compare each with its oracle and the\n"
            "backends with each other, and print a table and a summary to paste into a\n"
            "bug report. Exit status: 0 when everything agrees, 1 when anything\n"
            "disagrees or fails, 2 when no backend can run or the command line is wrong."),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    selftest.add_argument("--backend", action="append", default=[],
                          help="a backend to run (repeat for more; default: every backend "
                               "that can run here)")
    selftest.add_argument("--kernel", action="append", default=[],
                          help="run only this kernel of the corpus (repeat for more)")
    selftest.add_argument("--no-families", dest="families", action="store_false",
                          help="leave out the kernel families of kernels/")
    selftest.set_defaults(handler=_cmd_selftest)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
