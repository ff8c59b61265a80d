"""The `mtwork` command: execute the kernel notebooks and publish HTML walkthroughs.

    mtwork run [NOTEBOOK ...] [-p NAME VALUE ...] [--backend B] [--out DIR]
    mtwork kernels
    mtwork backends
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from pathlib import Path

DEFAULT_NOTEBOOKS = Path("notebooks")
DEFAULT_OUT = Path("out")


def _parameter_value(text: str) -> object:
    """`-p n 4096` gives an int, `-p dtypes "['f32']"` a list, anything else a string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


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


def export_html(notebook: Path, html: Path) -> None:
    """Writes an HTML walkthrough of an executed notebook (plots embedded, no network)."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(notebook, as_version=4)
    body, _ = HTMLExporter().from_notebook_node(nb)
    html.write_text(body, encoding="utf-8")


def run_notebook(notebook: Path, out_dir: Path, parameters: dict[str, object]) -> Path:
    """Executes one notebook with papermill and exports it; returns the HTML path.
    Raises papermill's PapermillExecutionError when a cell fails."""
    import papermill

    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / notebook.name
    # Plotly >= 6 only emits a mimetype nbconvert drops; the notebook renderer embeds
    # plotly.js so the walkthrough works offline.
    os.environ.setdefault("PLOTLY_RENDERER", "notebook")
    papermill.execute_notebook(
        str(notebook),
        str(executed),
        parameters=parameters,
        cwd=str(notebook.parent),
        progress_bar=False,
        kernel_name="python3",
    )
    html = executed.with_suffix(".html")
    export_html(executed, html)
    return html


def _cmd_run(args: argparse.Namespace) -> int:
    parameters = {name: _parameter_value(value) for name, value in args.parameter}
    if args.backend:
        parameters["backend"] = args.backend
        os.environ["MTWORK_BACKEND"] = args.backend
    failed = []
    for notebook in _notebooks(args.notebooks):
        print(f"running {notebook} ...", flush=True)
        try:
            html = run_notebook(notebook, Path(args.out), parameters)
        except Exception as exc:  # noqa: BLE001 - report every notebook, then fail
            failed.append(notebook)
            print(f"FAILED {notebook}: {exc}", file=sys.stderr)
            continue
        print(f"  wrote {html}")
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(map(str, failed))}",
              file=sys.stderr)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mtwork", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="execute notebooks and write HTML walkthroughs")
    run.add_argument("notebooks", nargs="*", help="notebooks to run (default: notebooks/*)")
    run.add_argument("-p", "--parameter", nargs=2, action="append", default=[],
                     metavar=("NAME", "VALUE"), help="set a notebook parameter")
    run.add_argument("--backend", choices=["metal", "sim"], help="backend for the kernels")
    run.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (default: out)")
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
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
