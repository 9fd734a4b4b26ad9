"""Command line: ``python -m pagedkv info | figures [--out figures/] | labs [--out labs/] | reading [--out course/]
| map [--out COURSE_MAP.md] | visualize | trace <run> [--html run.html] [--json run.json] | site [--out site/]
| autograde | guide``."""

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
    trust_app()
    command = voila_command(port, open_browser)
    os.execve(command[0], command, voila_environ(os.environ))  # Voila replaces this process: signals reach it


# A page's kernel (410-540 MB resident) is shut down as the page is left (Voila's beforeunload); one whose page
# vanished without a word (a crashed or killed tab) is culled this long after its last message, within
# CULL_INTERVAL_SECONDS.
CULL_IDLE_SECONDS = 120
CULL_INTERVAL_SECONDS = 30
VIZ = Path(__file__).parent / "viz"
APP = VIZ / "app.ipynb"
# viz/jupyter/ holds what Voila reads besides the notebook: voila.json (its config) and the "pagedkv" template
# (voila/templates/pagedkv/: Voila's lab template, less the Font Awesome stylesheets it fetches from a CDN).
JUPYTER_FILES = VIZ / "jupyter"


def trust_app() -> None:
    """Sign app.ipynb for this user, as ``jupyter trust`` does, so Voila does not log "Notebook app.ipynb is not
    trusted" on every page load. A signature is an HMAC with a key of the user's own (Jupyter's data folder), so
    no file can ship one; signing changes nothing in the notebook and runs nothing."""
    import nbformat
    from nbformat.sign import NotebookNotary

    notebook = nbformat.read(APP, as_version=4)
    notary = NotebookNotary()
    if not notary.check_signature(notebook):
        notary.sign(notebook)


def voila_environ(environ) -> dict:
    """``environ`` with viz/jupyter/ first on ``JUPYTER_PATH``, where Voila looks for the "pagedkv" template."""
    path = [str(JUPYTER_FILES), *filter(None, environ.get("JUPYTER_PATH", "").split(os.pathsep))]
    return {**environ, "JUPYTER_PATH": os.pathsep.join(path)}


def voila_command(port: int, open_browser: bool) -> list[str]:
    """Voila on 127.0.0.1 only; every page load starts a kernel, shut down when the page is left: the page posts
    to Voila's shutdown handler as it unloads, with the ``_xsrf`` cookie Voila never sets, so that handler refused
    every one ("'_xsrf' argument missing from POST") and kernels piled up; the XSRF check is off (the server
    answers this machine only, and each kernel's URL holds its random id). Kernels left idle with no page
    connected (a tab that crashed) are culled after ``CULL_IDLE_SECONDS``; a connected page's kernel never is.

    The tornado settings are in viz/jupyter/voila.json, since a command line gives a dict's values as strings:
    ``disable_check_xsrf``, and ``ws_ping_timeout`` 30 s, equal to jupyter_server's ping interval (its default
    timeout, three intervals, made tornado warn "The websocket_ping_timeout (90000) cannot be longer than the
    websocket_ping_interval (30000)" on every page load). voila.json also leaves out two JupyterLab extensions that
    the page would load from the venv and cannot run (nbgrader's and Notebook 7's, there with the grade extra):
    each logged an error in the browser's console on every load ("Shared module @jupyterlab/filebrowser doesn't
    exist in shared scope default"), with Voila's stock template as with ours. The "pagedkv" template is found
    through ``voila_environ``."""
    command = [sys.executable, "-m", "voila", str(APP), "--Voila.ip=127.0.0.1", f"--port={port}",
               "--show_tracebacks=False", f"--MappingKernelManager.cull_idle_timeout={CULL_IDLE_SECONDS}",
               f"--MappingKernelManager.cull_interval={CULL_INTERVAL_SECONDS}",
               "--MappingKernelManager.cull_connected=False", f"--Voila.config_file_paths={JUPYTER_FILES}",
               "--template=pagedkv"]
    return command if open_browser else command + ["--no-browser"]


def trace(name: str | None, html_path: str | None, json_path: str | None) -> int:
    """Record one of the course's runs (``pagedkv/viz/runs.py``) and write it as a page and/or JSON."""
    os.environ.setdefault("PAGEDKV_QUIET", "1")
    from pagedkv.errors import PagedKVError
    from pagedkv.viz.runs import RUNS, get_run

    if name is None:
        for run in RUNS:
            print(f"{run.name:<12} {run.title} (notebook {run.notebook})")
        return 0
    if not html_path and not json_path:
        return fail("say where to write it: --html run.html (a page that opens from disk) and/or --json run.json.")
    try:
        if name.endswith(".json"):  # a trace recorded earlier (TraceRecorder, or --json): checked, then written
            from pagedkv.viz.trace import load_trace

            recorded = load_trace(Path(name))
        else:
            recorded = get_run(name).record()
    except PagedKVError as error:
        return fail(str(error))
    try:
        for path, write in ((html_path, recorded.write_html), (json_path, recorded.write)):
            if path:
                print(write(path))
    except OSError as error:
        return fail(f"cannot write the trace: {error.strerror or error}.")
    return 0


def site(course: str, out: str) -> int:
    os.environ.setdefault("PAGEDKV_QUIET", "1")
    from pagedkv.viz.site import build_site

    if not Path(course).is_dir():
        return fail(f"--course {course} is not a folder of reading copies (python -m pagedkv reading writes them).")
    if Path(out).exists() and not Path(out).is_dir():
        return fail(f"--out {out} is a file; give a folder for the site (default: site/).")
    try:
        pages = build_site(course, out)
    except OSError as error:
        return fail(f"cannot write the site to {out}: {error.strerror or error}.")
    print(f"wrote {len(pages)} pages to {out} (open {Path(out) / 'index.html'})")
    return 0


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
    rec = commands.add_parser("trace", help="record one of the course's runs and write it as a player page that "
                                            "opens from disk (--html) or as JSON (--json); no run: list them")
    rec.add_argument("run", nargs="?", help="the run's name (python -m pagedkv trace lists them), or a trace's "
                                            "JSON file to write as a page")
    rec.add_argument("--html", help="write a self-contained HTML player here")
    rec.add_argument("--json", help="write the trace's JSON here")
    web = commands.add_parser("site", help="render the reading copies as a static site, the key runs as players")
    web.add_argument("--out", default="site/", help="output folder (default: site/)")
    web.add_argument("--course", default="course/", help="the reading copies (default: course/)")
    grade = commands.add_parser("autograde", help="nbgrader autograde, several students at once (make autograde "
                                                  "JOBS=N); run it in the course folder")
    grade.add_argument("assignment", help="the assignment's name (make's ASSIGNMENT: pagedkv)")
    grade.add_argument("--jobs", type=int, default=2, help="students graded at once, in batches (default: 2)")
    # everything after the assignment, options included, goes to nbgrader: --jobs comes before the assignment
    grade.add_argument("nbgrader_args", nargs=argparse.REMAINDER, help="passed on to each nbgrader autograde")
    guide = commands.add_parser("guide", help="rewrite the instructor guide's generated block (counts, points, "
                                              "each notebook's exercises) from the notebooks and exercises.py")
    guide.add_argument("--guide", default="notebooks/README.md", help="the guide (default: notebooks/README.md)")
    guide.add_argument("--notebooks", default="notebooks/", help="the solution notebooks (default: notebooks/)")
    args = parser.parse_args(argv)
    if args.command == "trace":
        return trace(args.run, args.html, args.json)
    if args.command == "site":
        return site(args.course, args.out)
    if args.command == "guide":
        from pagedkv.labs.guide import rewrite

        try:
            changed = rewrite(args.guide, args.notebooks)
        except (OSError, ValueError) as error:
            return fail(str(error))
        print(f"{args.guide}: {'rewritten' if changed else 'already up to date'}")
        return 0
    if args.command == "autograde":
        from pagedkv.labs.autograde import autograde

        if args.jobs < 1:
            return fail(f"--jobs {args.jobs}: give how many students to grade at once, 1 or more.")
        return autograde(Path.cwd(), args.assignment, args.jobs, args.nbgrader_args)
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
