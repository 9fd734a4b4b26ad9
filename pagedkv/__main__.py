"""Command line: ``python -m pagedkv info | figures [--out figures/] | labs [--out labs/]``."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version


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


def figures(out: str) -> int:
    from pagedkv.viz.figures import make_all_figures

    for path in make_all_figures(out):
        print(path)
    return 0


def labs(notebooks: str, out: str) -> int:
    os.environ.setdefault("PAGEDKV_QUIET", "1")  # generating notebooks runs no kernel: no GPU notice
    from pagedkv.labs.generate import generate_labs

    paths = generate_labs(notebooks, out)
    if not paths:
        print(f"no numbered notebooks (NN_name.ipynb) in {notebooks}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
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
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    if args.command == "labs":
        return labs(args.notebooks, args.out)
    return figures(args.out)


if __name__ == "__main__":
    sys.exit(main())
