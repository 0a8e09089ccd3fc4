"""README examples run as written, and the command line's output and exit codes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from robo_resume.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_starts_with_two_setup_commands():
    text = README.read_text()
    first = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1).strip().splitlines()
    commands = [line.split("#")[0].strip() for line in first if line.strip()]
    assert commands == ["./scripts/demo", "./scripts/test"]
    assert text.index("```bash") < text.index("```python")


@pytest.mark.parametrize("block", range(len(python_blocks())))
def test_readme_python_examples_run(block, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(python_blocks()[block], f"README.md[python block {block}]", "exec"), {})
    out = capsys.readouterr().out
    assert "resumed with" in out or out == ""


def test_cli_demo(tmp_path, capsys):
    code = main(["demo", "--out", str(tmp_path), "--num-workers", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "replayed 0, lost 0" in out
    assert "order identical to the uninterrupted run: True" in out


def test_cli_inspect_open50(open50, capsys):
    assert main(["inspect", str(open50), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["version"] == "v3.0" and info["episodes"] == 50 and info["frames"] == 20814
    assert info["cameras"]["image"] == {"declared_codec": "h264", "container_codec": "mpeg4"}
    assert len(info["missing_files"]) == 7
    assert main(["inspect", str(open50)]) == 0
    assert "info.json disagrees" in capsys.readouterr().out


def test_cli_input_error_exit_code(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nope")]) == 2
    assert "dataset root does not exist" in capsys.readouterr().err


def test_console_script_help():
    exe = Path(sys.executable).with_name("robo-resume")
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "demo" in r.stdout and "inspect" in r.stdout
