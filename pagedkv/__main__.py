"""Command line: ``python -m pagedkv info`` and ``python -m pagedkv figures [--out figures/]``."""

from __future__ import annotations

import argparse
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagedkv", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="versions, and whether kernels run on a GPU or in the CUDA simulator")
    fig = commands.add_parser("figures", help="regenerate every figure the README and notebooks show")
    fig.add_argument("--out", default="figures/", help="output folder (default: figures/)")
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    return figures(args.out)


if __name__ == "__main__":
    sys.exit(main())
