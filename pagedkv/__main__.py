"""Command line: ``python -m pagedkv info | figures [--out figures/] | labs [--out labs/] | reading [--out course/]
| map [--out COURSE_MAP.md] | visualize``."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def info() -> int:
    import pagedkv
    from pagedkv.kernels import resolve_backend

    print(f"pagedkv {pagedkv.__version__} on python {platform.python_version()} ({platform.machine()})")
    for name in ("torch", "numba", "numba-cuda", "numpy", "matplotlib", "ipywidgets"):
        print(f"  {name:<11} {_version(name)}")
    print(pagedkv.CUDA_MODE.describe())
    print(f"paged_attention(backend='auto') uses the {resolve_backend('auto')!r} backend")
    return 0


def fail(message: str) -> int:
    """A command-line error: one line on stderr, exit status 2, no traceback."""
    print(f"python -m pagedkv: {message}", file=sys.stderr)
    return 2


def figures(out: str) -> int:
    from pagedkv.viz.figures import make_all_figures

    if Path(out).exists() and not Path(out).is_dir():
        return fail(f"--out {out} is a file; give a folder for the figures (default: figures/).")
    try:
        for path in make_all_figures(out):
            print(path)
    except OSError as error:
        return fail(f"cannot write the figures to {out}: {error.strerror or error}.")
    return 0


def labs(notebooks: str, out: str) -> int:
    os.environ.setdefault("PAGEDKV_QUIET", "1")  # generating notebooks runs no kernel: no GPU notice
    from pagedkv.labs.generate import generate_labs, is_untouched_lab

    if not Path(notebooks).is_dir():
        return fail(f"--notebooks {notebooks} is not a folder of notebooks.")
    if Path(out).exists() and not Path(out).is_dir():
        return fail(f"--out {out} is a file; give a folder for the lab notebooks (default: labs/).")
    if Path(out).resolve() == Path(notebooks).resolve():
        return fail(f"--out {out} is the solutions folder: the labs would overwrite every solution. "
                    "Write them somewhere else (default: labs/).")
    kept = [p.name for p in sorted(Path(out).glob("[0-9][0-9]_*.ipynb")) if not is_untouched_lab(p)]
    if kept:
        return fail(f"{out} holds notebooks that are not untouched generated labs ({', '.join(kept[:3])}): "
                    "solutions, or labs someone has edited (a student's answers?). Refusing to overwrite them; "
                    "move them away or choose another --out.")
    try:
        paths = generate_labs(notebooks, out)
    except (ValueError, KeyError, TypeError) as error:  # json.JSONDecodeError is a ValueError
        return fail(f"a notebook in {notebooks} is not valid notebook JSON ({type(error).__name__}: {error}); "
                    "open it in JupyterLab and save it again.")
    except OSError as error:
        return fail(f"cannot write the labs to {out}: {error.strerror or error}.")
    if not paths:
        print(f"no numbered notebooks (NN_name.ipynb) in {notebooks}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


def tcp_port(text: str) -> int:
    """A TCP port number for argparse: 1-65535, or a message that says so (argparse prints it and exits 2)."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port: use a number from 1 to 65535, e.g. 8866")
    return port


def visualize(port: int, open_browser: bool) -> int:
    """Serve the block-table visualizer as a page with no code cells (Voila), on this machine only."""
    import importlib.util

    if importlib.util.find_spec("voila") is None:
        return fail("the visualizer app needs Voila: pip install -e '.[viz]' in the checkout (or run make visualizer).")
    print(f"pagedkv visualizer: http://127.0.0.1:{port}/  (Ctrl-C stops it)", flush=True)
    os.environ.setdefault("PAGEDKV_QUIET", "1")
    command = voila_command(port, open_browser)
    os.execv(command[0], command)  # Voila replaces this process: Ctrl-C and signals reach it directly


# A page's kernel (~420 MB) is shut down as the page is left (Voila's beforeunload); one whose page vanished without
# a word (a crashed or killed tab) is culled this long after its last message, within CULL_INTERVAL_SECONDS.
CULL_IDLE_SECONDS = 120
CULL_INTERVAL_SECONDS = 30


def voila_command(port: int, open_browser: bool) -> list[str]:
    """Voila on 127.0.0.1 only; every page load starts a kernel, shut down when the page is left: the page posts
    to Voila's shutdown handler as it unloads, with the ``_xsrf`` cookie Voila never sets, so that handler refused
    every one ("'_xsrf' argument missing from POST") and kernels piled up; the XSRF check is off (the server
    answers this machine only, and each kernel's URL holds its random id). Kernels left idle with no page
    connected (a tab that crashed) are culled after ``CULL_IDLE_SECONDS``; a connected page's kernel never is."""
    app = Path(__file__).parent / "viz" / "app.ipynb"
    command = [sys.executable, "-m", "voila", str(app), "--Voila.ip=127.0.0.1", f"--port={port}",
               "--show_tracebacks=False", f"--MappingKernelManager.cull_idle_timeout={CULL_IDLE_SECONDS}",
               f"--MappingKernelManager.cull_interval={CULL_INTERVAL_SECONDS}",
               "--MappingKernelManager.cull_connected=False", "--Voila.tornado_settings=disable_check_xsrf=True"]
    return command if open_browser else command + ["--no-browser"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagedkv", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="versions, and whether kernels run on a GPU or in the CUDA simulator")
    fig = commands.add_parser("figures", help="regenerate every figure the README and notebooks show")
    fig.add_argument("--out", default="figures/", help="output folder (default: figures/)")
    lab = commands.add_parser("labs", help="write the students' exercise notebooks from the solution notebooks")
    lab.add_argument("--out", default="labs/", help="output folder (default: labs/)")
    lab.add_argument("--notebooks", default="notebooks/", help="the solution notebooks (default: notebooks/)")
    read = commands.add_parser("reading", help="write the reading copies (outputs kept, answers removed) that "
                                               "README.md's course table links")
    read.add_argument("--out", default="course/", help="output folder (default: course/)")
    read.add_argument("--notebooks", default="notebooks/", help="the solution notebooks (default: notebooks/)")
    course_map = commands.add_parser("map", help="write the course map (COURSE_MAP.md) from the notebooks' "
                                                 "metadata and pagedkv/labs/concepts.py")
    course_map.add_argument("--out", default="COURSE_MAP.md", help="output file (default: COURSE_MAP.md)")
    course_map.add_argument("--notebooks", default="notebooks/", help="the solution notebooks (default: notebooks/)")
    viz = commands.add_parser("visualize", help="serve the block-table visualizer as a web app (Voila) on 127.0.0.1")
    viz.add_argument("--port", type=tcp_port, default=8866, help="port on 127.0.0.1, 1-65535 (default: 8866)")
    viz.add_argument("--no-browser", action="store_true", help="do not open a browser")
    args = parser.parse_args(argv)
    if args.command == "visualize":
        return visualize(args.port, not args.no_browser)
    if args.command == "info":
        return info()
    if args.command == "labs":
        return labs(args.notebooks, args.out)
    if args.command == "map":
        from pagedkv.labs.course_map import write_map

        print(write_map(args.notebooks, args.out))
        return 0
    if args.command == "reading":
        from pagedkv.labs.generate import generate_reading_copies

        print(f"wrote {len(generate_reading_copies(args.notebooks, args.out))} reading copies to {args.out}")
        return 0
    return figures(args.out)


if __name__ == "__main__":
    sys.exit(main())
