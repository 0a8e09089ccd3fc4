"""README and docs/ examples run as written, and the command line's output and exit codes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from robo_resume import make_dataset
from robo_resume.cli import main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
"""The pages whose python examples users copy: the README and every docs/ page."""


def python_blocks(text: str) -> list[str]:
    """The ```python blocks of a markdown text, in order."""
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def examples() -> list[tuple[str, str]]:
    """``(page[block k], source)`` of every python example in README.md and docs/*.md."""
    return [
        (f"{page.relative_to(REPO).as_posix()}[python block {k}]", block)
        for page in PAGES
        for k, block in enumerate(python_blocks(page.read_text()))
    ]


EXAMPLES = examples()


def test_readme_starts_with_two_setup_commands():
    text = README.read_text()
    first = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1).strip().splitlines()
    commands = [line.split("#")[0].strip() for line in first if line.strip()]
    assert commands == ["./scripts/demo", "./scripts/test"]
    assert text.index("```bash") < text.index("```python")


def test_every_example_is_a_python_block_that_checks_something():
    """A ```py block would not run here, so there is none; every example asserts its result."""
    for page in PAGES:
        text = page.read_text()
        assert not re.search(r"^```py$", text, flags=re.M), f"{page.name}: use ```python"
    assert len(EXAMPLES) >= 8 and any("docs/" in where for where, _ in EXAMPLES)
    for where, source in EXAMPLES:
        assert "assert " in source, f"{where} checks nothing (add an assert on its result)"


class HubStandIn:
    """``huggingface_hub.snapshot_download`` serving one local dataset under any repo id.

    Files matching ``allow_patterns`` are copied into a snapshot folder named by a fixed commit,
    as the real cache names it; every call is recorded.
    """

    COMMIT = "0123456789abcdef0123456789abcdef01234567"

    def __init__(self, source: Path, cache: Path):
        self.source, self.cache = source, cache
        self.calls: list[tuple[str, list[str]]] = []

    def __call__(
        self,
        repo_id,
        *,
        repo_type,
        revision,
        allow_patterns,
        cache_dir,
        local_dir,
        local_files_only,
    ):
        from huggingface_hub.utils import filter_repo_objects

        assert repo_type == "dataset"
        self.calls.append((repo_id, list(allow_patterns)))
        snapshot = self.cache / repo_id.replace("/", "--") / "snapshots" / self.COMMIT
        files = [
            p.relative_to(self.source).as_posix() for p in self.source.rglob("*") if p.is_file()
        ]
        for f in filter_repo_objects(files, allow_patterns=allow_patterns):
            (snapshot / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.source / f, snapshot / f)
        return str(snapshot)


@pytest.fixture(scope="module")
def hub_dataset(tmp_path_factory) -> Path:
    """The dataset the Hub stand-in serves: 10 episodes, one camera."""
    root = tmp_path_factory.mktemp("hub") / "pusht"
    return make_dataset(root, episode_lengths=(9, 7, 12, 5, 8, 6, 10, 4, 7, 11)).root


@pytest.mark.parametrize("where,source", EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_python_examples_run(where, source, tmp_path, monkeypatch, capsys, hub_dataset):
    """Every example runs as written (in a fresh namespace, from an empty folder).

    Datasets on the Hub come from a stand-in for ``snapshot_download`` (no network here); an
    example that names a ``repo_id`` must have gone through it, metadata first.
    """
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub = HubStandIn(hub_dataset, tmp_path / "hub-cache")
    if "repo_id=" in source:
        import huggingface_hub  # the dev extra installs it (lerobot needs it): never skipped

        monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    exec(compile(source, where, "exec"), {"__name__": "__doc_example__"})
    out = capsys.readouterr().out
    if where.startswith("README.md"):
        assert "resumed with" in out or out == ""
    if "repo_id=" in source:
        assert hub.calls and hub.calls[0][1] == ["meta/**"], hub.calls
        assert len(hub.calls) > 1, "the selected episodes' files were never fetched"


@pytest.mark.slow(21)
def test_cli_demo_sigkill_and_resume(tmp_path, capsys):
    code = main(
        [
            "demo",
            "--out",
            str(tmp_path),
            "--epochs",
            "1",
            "--checkpoint-every",
            "4",
            "--kill-seed",
            "3",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["killed_by_sigkill"] is True
    assert 4 <= report["resumed_from_checkpoint_step"] <= report["killed_at_step"]
    assert (report["frames_replayed"], report["frames_lost"]) == (0, 0)
    assert report["order_identical"] is True and report["ok"] is True
    # the demo audits itself from the per-step record its checkpoints keep
    final, at_kill = report["audit"], report["audit_at_kill"]
    frames = sum(e["frames"] for e in final["epochs"])
    assert final["ok"] and final["step"] == report["steps_uninterrupted"]
    assert [(e["once"], e["pending"]) for e in final["epochs"]] == [(frames, 0)]
    assert at_kill["ok"] and at_kill["step"] == report["resumed_from_checkpoint_step"]
    (epoch,) = at_kill["epochs"]
    assert epoch["once"] + epoch["pending"] == frames and 0 < epoch["pending"] < frames
    assert epoch["once"] == 16 * at_kill["step"]  # batch 16: full batches before the kill


@pytest.mark.slow(25)
def test_cli_demo_resumes_with_another_topology_and_audits_it(tmp_path, capsys):
    """2 workers, batch 16 -> killed -> resumed with 1 worker, batch 8: elastic, audited."""
    args = ["demo", "--out", str(tmp_path), "--epochs", "2", "--checkpoint-every", "5"]
    args += ["--kill-seed", "5", "--resume-workers", "1", "--resume-batch-size", "8"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "resumed from the checkpoint of step" in out and "with 1 worker, batch 8" in out
    assert "order identical to an uninterrupted run: not compared (another topology" in out
    assert re.search(
        r"audit of the final checkpoint \(step \d+\): \d+ frames trained exactly "
        r"once, over 2 epoch\(s\): ok",
        out,
    ), out
    assert "pending (the resume trains them)" in out
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["resumed_with"] == {"num_workers": 1, "batch_size": 8, "elastic": True}
    assert (report["frames_replayed"], report["frames_lost"]) == (0, 0)
    runs = report["audit"]["runs"]
    assert [(r["num_workers"], r["batch_size"]) for r in runs] == [(2, 16), (1, 8)]
    assert runs[1]["remainder_epoch"] is not None


def test_the_demos_audit_catches_a_tampered_record(tmp_path, capsys):
    """A record in which one step claims the positions of the step before: replayed and lost."""
    from robo_resume.checkpoint import load_checkpoint
    from robo_resume.lerobot_train.audit import audit_record
    from robo_resume.lerobot_train.record import StepRecord
    from robo_resume.state.resume import ResumeState

    args = ["demo", "--out", str(tmp_path), "--epochs", "1", "--checkpoint-every", "4"]
    assert main([*args, "--num-workers", "0", "--kill-seed", "2", "--json"]) == 0
    ckpt = load_checkpoint(tmp_path / "train" / "ckpt.pt")
    record = StepRecord.from_files(ckpt["record"], where="ckpt.pt")
    state, step = ResumeState.from_dict(ckpt["data"]), int(ckpt["step"])
    assert audit_record(record, state, step, checkpoint="ckpt.pt").ok
    rows = record.rows.copy()
    rows[6, 3:] = rows[5, 3:]  # step 7 claims step 6's positions
    tampered = audit_record(StepRecord(record.runs, rows), state, step, checkpoint="ckpt.pt")
    assert not tampered.ok
    (epoch,) = tampered.epochs
    assert epoch.replayed == epoch.lost == 16
    assert [r[3] for r in epoch.replayed_ranges] == [1] * len(epoch.replayed_ranges)
    assert sum(r[2] - r[1] + 1 for r in epoch.lost_ranges) == 16
    assert any(
        "consumed stream positions" in p and "more than once" in p for p in tampered.problems
    ), tampered.problems


def test_cli_inspect_open50(open50, capsys):
    assert main(["inspect", str(open50), "--json"]) == 1  # missing videos are a finding
    info = json.loads(capsys.readouterr().out)
    assert info["version"] == "v3.0" and info["episodes"] == 50 and info["frames"] == 20814
    cam = info["cameras"]["image"]
    assert cam["declared_codec"] == "h264" and cam["container"]["codec"] == "mpeg4"
    assert cam["container"]["keyframe_interval"] == 12 and cam["agrees"] is False
    assert len(info["missing_files"]) == 7
    assert main(["inspect", str(open50)]) == 1
    out = capsys.readouterr().out
    assert "mpeg4 640x480, keyframe every 12 frames  (info.json says h264)" in out
    assert "missing files: 7" in out


def test_cli_inspect_factory(factory, capsys):
    root = factory(codec="mpeg4", gop=12, num_cameras=2).root
    assert main(["inspect", str(root), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert {c["container"]["keyframe_interval"] for c in info["cameras"].values()} == {12}
    assert info["missing_files"] == [] and info["unreadable_files"] == {}


def test_cli_inspect_fingerprint_compares_copies(factory, tmp_path, capsys):
    """Nodes with local copies compare ``robo-resume inspect``'s fingerprint line."""
    import shutil

    root = factory(num_cameras=1, episode_lengths=(9, 14, 6)).root
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    other = factory(num_cameras=1, episode_lengths=(9, 14, 7)).root
    prints = []
    for r in (root, copy, other):
        assert main(["inspect", str(r), "--json"]) == 0
        prints.append(json.loads(capsys.readouterr().out)["fingerprint"])
    assert prints[0] == prints[1] != prints[2]
    assert main(["inspect", str(copy)]) == 0
    assert f"fingerprint {prints[0]} (the same on every copy" in capsys.readouterr().out


def test_cli_plan_matches_round_robin_formula(factory, capsys):
    root = factory(num_cameras=0).root
    assert (
        main(
            [
                "plan",
                str(root),
                "--step",
                "5",
                "--batch-size",
                "4",
                "--num-workers",
                "2",
                "--world-size",
                "2",
                "--json",
            ]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert len(plan["streams"]) == 4
    for s in plan["streams"]:
        # after 5 batches: old role 0 made 3 batches, role 1 made 2; new worker 0 plays role 1
        role = (s["worker"] + 5) % 2
        assert s["stream"] == s["rank"] * 2 + role
        assert s["position"] == (5 // 2 + (role < 5 % 2)) * 4
        assert s["epoch"] == 0 and s["chunk"] is not None
    assert main(["plan", str(root), "--step", "5", "--batch-size", "4", "--num-workers", "0"]) == 0
    assert "rank 0 worker 0 -> stream 0: epoch 0, position 20" in capsys.readouterr().out


def test_cli_verify_and_plot(factory, tmp_path, capsys):
    root = factory(num_cameras=0).root
    png = tmp_path / "overlap.png"
    assert (
        main(
            [
                "verify",
                str(root),
                "--crash-at",
                "3,4",
                "--batch-size",
                "4",
                "--chunk-frames",
                "8",
                "--plot",
                str(png),
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    by = {(r["crash_at"], r["scenario"]): r for r in report["results"]}
    assert by[(3, "arithmetic")]["replayed"] == by[(3, "cursor")]["lost"] == 0
    assert by[(3, "naive")]["replayed"] > 0 and by[(3, "restart")]["replayed"] == 12
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert main(["verify", str(root), "--world-size", "2", "--batch-size", "4"]) == 0
    assert "robo_resume: exactly once" in capsys.readouterr().out


def test_cli_verify_reports_a_broken_resume(factory, monkeypatch, capsys):
    """If the audit finds a replayed frame in robo_resume's scenarios, verify says so, exit 1."""
    from robo_resume import audit

    real = audit._compare

    def broken(name, full, got, keep):
        if name == "arithmetic":
            got = [got[0], *got]  # one frame consumed twice
        return real(name, full, got, keep)

    monkeypatch.setattr(audit, "_compare", broken)
    root = factory(num_cameras=0).root
    assert main(["verify", str(root), "--crash-at", "3", "--batch-size", "4"]) == 1
    out = capsys.readouterr().out
    assert "robo_resume: FAILED" in out


def test_cli_bench(factory, capsys):
    root = factory(num_cameras=1).root
    assert main(["bench", str(root), "--batches", "5", "--batch-size", "8", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["frames"] == 40 and r["stream_frames_per_s"] > 0
    assert r["sequential_decode_frames_per_s"] > 0


def test_cli_usage_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", str(tmp_path)])  # --step is required
    assert e.value.code == 2
    assert main(["inspect", str(tmp_path / "nope")]) == 2
    assert "dataset root does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["demo", "inspect", "plan", "verify", "audit", "bench"])
def test_every_command_has_help_and_json(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert "--json" in capsys.readouterr().out


def test_console_script_help():
    exe = Path(sys.executable).with_name("robo-resume")
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for command in ("demo", "inspect", "plan", "verify", "audit", "bench"):
        assert command in r.stdout
