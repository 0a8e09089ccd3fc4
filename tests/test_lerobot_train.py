"""``robo-resume train``: lerobot 0.6's training pipeline with robo_resume's data path.

Every test runs the real command in a process of its own on CPU with a small ACT policy
(lerobot's own factories, optimizer and checkpoint code) on factory datasets. The strongest
check is the model itself: a run SIGKILLed after a checkpoint and resumed with
``--resume=true`` must end with the same ``model.safetensors``, byte for byte, as the
uninterrupted run. The data side is
read from ``ROBO_RESUME_TRAIN_INDEX_LOG`` (one JSON line per step and rank with the ``index``
values trained on).

Most runs are forked from a pre-imported parent (tests/train_zygote.py: a run then costs a fork,
not the 8 s import of torch and lerobot). There are two such parents, with different
``PYTHONHASHSEED`` values, and the runs a test compares (an uninterrupted run and the run that
continues from its checkpoint) never come from the same one. The resumed run of
test_kill_resume_bit_identical is a real ``robo-resume train`` subprocess and the two ranks of
the accelerate test are real processes under torchrun, so a fresh process resuming exactly is
still proven.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from stuck_run import run_or_dump
from train_zygote import Zygote, kill_group

from robo_resume.testing import make_dataset

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY_ACT = [
    "--policy.type=act",
    "--policy.pretrained_backbone_weights=null",
    "--policy.device=cpu",
    "--policy.push_to_hub=false",
    "--policy.dim_model=32",
    "--policy.n_heads=2",
    "--policy.dim_feedforward=64",
    "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1",
    "--policy.latent_dim=8",
    "--policy.chunk_size=5",
    "--policy.n_action_steps=5",
    "--wandb.enable=false",
    "--log_freq=1",
]
LENGTHS = (40, 25, 33, 30)  # 128 frames


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("train")
    a = make_dataset(base / "a", episode_lengths=LENGTHS, num_cameras=1, height=48, width=64)
    b = make_dataset(
        base / "b", episode_lengths=(20, 28, 16), num_cameras=1, height=48, width=64, version="v2.1"
    )
    c = make_dataset(base / "c", episode_lengths=(30, 22), num_cameras=1, height=48, width=64)
    return base, a.root, b.root, c.root


@pytest.fixture(scope="module")
def zygotes(tmp_path_factory):
    """Two zygotes (tests/train_zygote.py), hash seeds 1 and 2, both started here and ended
    with the module. Every test that takes them runs in both (the accelerate test forks from
    the second only, after its torchrun run, which the imports overlap), so the second imports
    while the first's run trains instead of after it."""
    base = tmp_path_factory.mktemp("zygotes")
    pair = tuple(Zygote(seed, env_for(None), base / f"zygote{seed}.err") for seed in (1, 2))
    try:
        for z in pair:
            z.launch()
        yield pair
    finally:
        for z in pair:
            z.close()


def env_for(log: Path | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("ROBO_RESUME_TRAIN_INDEX_LOG", None)
    if log is not None:
        env["ROBO_RESUME_TRAIN_INDEX_LOG"] = str(log)
    return env


def train(
    args: list[str],
    log: Path | None = None,
    *,
    ok: bool = True,
    timeout: float = 240,
    zygote: Zygote | None = None,
    command: str = "robo-resume",
):
    """Run ``COMMAND ARGS`` (``robo-resume train ARGS`` by default) to the end, forked from
    ``zygote`` or else in a subprocess; returns (exit code, output)."""
    argv = ["train", *args] if command == "robo-resume" else list(args)
    if zygote is None:
        p = subprocess.run(
            [str(BIN / command), *argv],
            capture_output=True,
            text=True,
            env=env_for(log),
            timeout=timeout,
        )
        code, out = p.returncode, p.stdout + p.stderr
    else:
        out_file = _out_file(zygote)
        code = zygote.wait(zygote.start(command, argv, env_for(log), out_file), timeout)
        out = out_file.read_text()
    if ok:
        assert code == 0, out[-4000:]
    return code, out


def _out_file(zygote: Zygote) -> Path:
    """A new (empty) file for one forked run's output, next to the zygote's own."""
    path = zygote.errfile.with_name(f"run{next(_RUNS)}.out")
    path.touch()  # before the fork: the test may open it before the run does
    return path


_RUNS = itertools.count()


def train_until_killed(args: list[str], kill_at: int, log: Path, zygote: Zygote) -> str:
    """Fork ``robo-resume train`` from ``zygote`` and SIGKILL its process group (the run and
    its DataLoader workers) once it logs step ``kill_at``."""
    out_file = _out_file(zygote)
    pid = zygote.start("robo-resume", ["train", *args], env_for(log), out_file)
    deadline = time.monotonic() + 240
    text = ""
    try:
        with open(out_file) as f:
            while f" step:{kill_at} " not in text and time.monotonic() < deadline:
                chunk = f.read()
                if not chunk and not _alive(pid):
                    break
                text += chunk
                time.sleep(0.01)
    finally:
        kill_group(pid)  # at step kill_at, or if it ended or hung before
    code = zygote.wait(pid, 60)
    text = out_file.read_text()
    assert code == -signal.SIGKILL, text[-3000:]
    return text


def _alive(pid: int) -> bool:
    """Whether the zygote's child ``pid`` has not ended yet (a zombie until the zygote reaps
    it counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def steps_of(log: Path, rank: int = 0) -> list[tuple[int, list[int]]]:
    """(step, index values) per logged step of one rank, in log order."""
    path = Path(f"{log}.rank{rank}")
    return [(r["step"], r["index"]) for r in map(json.loads, path.read_text().splitlines())]


def ckpt(out: Path, step: int | str) -> Path:
    name = step if isinstance(step, str) else f"{step:06d}"
    return out / "checkpoints" / name


def resume_args(out: Path) -> list[str]:
    cfg = ckpt(out, "last") / "pretrained_model" / "train_config.json"
    return ["--resume=true", f"--config_path={cfg}"]


def audit(out: Path, *args: str, zygote: Zygote, as_json: bool = False) -> tuple[int, Any]:
    """``robo-resume audit OUT ARGS`` forked from ``zygote``: (exit code, text or parsed JSON)."""
    out_file = _out_file(zygote)
    err_file = _out_file(zygote) if as_json else None  # else stderr into the text too
    argv = ["audit", str(out), *args, *(["--json"] if as_json else [])]
    code = zygote.wait(zygote.start("robo-resume", argv, env_for(None), out_file, err_file), 120)
    text = out_file.read_text()
    assert code in (0, 1, 2), text[-3000:] + (err_file.read_text()[-3000:] if err_file else "")
    return code, json.loads(text) if as_json else text


def frames_of(ranges: list[list[int]], starts: dict[int, int]) -> set[int]:
    """Dataset ``index`` values of the audit's ``[episode, first, last, times]`` ranges."""
    return {starts[ep] + f for ep, a, b, _ in ranges for f in range(a, b + 1)}


def tampered_record_fails_the_audit(ref: Path, log: Path, out: Path, zygote: Zygote) -> None:
    """A copy of ``ref`` (8 steps, 2 workers) whose record says step 6 consumed step 5's stream
    positions: step 5's frames are replayed and step 6's lost, named by the audit (exit 1)."""
    import numpy as np

    shutil.copytree(ref, out, symlinks=True)
    path = ckpt(out, 8) / "training_state" / "robo_resume" / "consumed_steps.npz"
    with np.load(path) as z:
        rows = z["rows"]
    assert rows[:, 0].tolist() == list(range(1, 9))
    rows[5, 2:] = rows[4, 2:]  # role and positions of step 5, on step 6
    with open(path, "wb") as f:
        np.savez_compressed(f, rows=rows)
    steps = dict(steps_of(log))
    code, text = audit(out, f"--index-log={log}", zygote=zygote)
    assert code == 1, text
    assert "robo_resume: FAILED" in text and "replayed: episode" in text and "lost: episode" in text
    assert "steps 5-6 consumed stream positions" in text
    assert "step 6 rank 0: the record's frames" in text  # the index log disagrees
    code, report = audit(out, zygote=zygote, as_json=True)
    assert code == 1 and not report["ok"]
    (epoch,) = report["epochs"]
    starts = dict(zip(range(4), itertools.accumulate((0, *LENGTHS[:-1])), strict=True))
    assert frames_of(epoch["replayed_ranges"], starts) == set(steps[5])
    assert frames_of(epoch["lost_ranges"], starts) == set(steps[6])
    assert epoch["replayed"] == epoch["lost"] == 4


def data_state_of_another_dataset_is_refused(data, ref: Path, zygote: Zygote) -> None:
    """A copy of ``ref`` (an uninterrupted run on dataset a) resumed on dataset c: refused."""
    base, _, _, other = data
    out = base / "other"
    shutil.copytree(ref, out, symlinks=True)
    assert (ckpt(out, "last") / "training_state" / "robo_resume" / "data_state.json").is_file()
    code, text = train(
        [*TINY_ACT, "--dataset.repo_id=local/a", "--batch_size=4", "--num_workers=0", "--seed=3",
         "--save_freq=4", f"--dataset.root={other}", "--steps=12", f"--output_dir={out}",
         "--dataset.eval_split=0.0", "--eval_steps=0", *resume_args(out)],
        ok=False,
        zygote=zygote,
    )  # fmt: skip
    assert code == 2, text[-3000:]
    assert "holds the data state of a run on another dataset" in text
    assert "Traceback" not in text


@pytest.mark.slow(75)
def test_kill_resume_bit_identical(data, zygotes):
    """SIGKILL at a random step after a checkpoint, resume: the same weights, bit for bit.

    The runs hold out episodes (lerobot's --dataset.eval_split, evaluated every 4 steps): tasks
    alternate over the 4 episodes, so episodes 2 and 3 are held out and 0 and 1 (frames 0-64)
    train. Then a copy of the uninterrupted run's checkpoint is resumed with another dataset
    and refused (here, not in a test of its own sharing these runs through a module fixture:
    pytest-xdist may run a file's tests in two processes, and each would make the runs).
    """
    base, root, _, _ = data
    common = [
        *TINY_ACT,
        "--dataset.repo_id=local/a",
        f"--dataset.root={root}",
        "--batch_size=4",
        "--steps=8",
        "--save_freq=4",
        "--num_workers=2",
        "--seed=3",
        "--dataset.eval_split=0.5",
        "--eval_steps=4",
    ]
    # The reference and the killed run start their workers with fork (quick); the resumed run
    # with spawn, lerobot's default, whose workers need their own log handler for the resume
    # lines checked below. The order does not depend on the start method.
    fork, spawn = (
        "--dataloader_multiprocessing_context=fork",
        "--dataloader_multiprocessing_context=spawn",
    )
    # The reference is forked from one zygote, the killed run from the other (another hash
    # seed), the resumed run is a fresh robo-resume process (a third).
    ref, run = base / "ref", base / "run"
    _, ref_out = train([*common, fork, f"--output_dir={ref}"], base / "ref.idx", zygote=zygotes[0])
    assert "Checkpoint policy after step 8" in ref_out
    # the held-out episodes: evaluated at steps 4 and 8, never trained on
    assert "Train/eval split: 2 train, 2 eval" in ref_out
    assert ref_out.count("eval_loss=") == 2
    assert all(max(idx) < 65 for _, idx in steps_of(base / "ref.idx"))
    kill_at = random.Random(os.environ.get("PYTEST_XDIST_WORKER", "0")).randint(5, 7)
    train_until_killed(
        [*common, fork, f"--output_dir={run}"], kill_at, base / "run.idx", zygotes[1]
    )
    assert os.readlink(ckpt(run, "last")) == "000004"
    assert not list((run / "checkpoints").glob(".*")), "a partial checkpoint was left visible"
    # what kills at other points of a save leave (a run killed between the two renames of a
    # step written again, or before its new `last` link replaced the old): the next run
    # removes them all (they name a dead writer: the run resuming holds the lock)
    dead = subprocess.Popen(["true"])
    dead.wait()
    planted = (f".000008.partial-{dead.pid}", f".000008.old-{dead.pid}")
    for name in planted:
        (run / "checkpoints" / name / "pretrained_model").mkdir(parents=True)
    (run / "checkpoints" / f".last.{dead.pid}").symlink_to("000004")
    # the killed run's audit: steps 1..4 attested by checkpoint 4, the steps after it (logged
    # by the index log) are retrained by the resume
    code, text = audit(run, f"--index-log={base / 'run.idx'}", zygote=zygotes[0])
    assert code == 0, text
    assert (
        "epoch 0 (in progress, 48 pending): 64 frames, 16 trained once, 0 replayed, 0 lost" in text
    )
    # (the step after kill_at may have been logged too: a step is logged before it trains)
    assert re.search(r"steps 5-[678] were logged after checkpoint step 4", text), text
    _, out = train([*common, spawn, f"--output_dir={run}", *resume_args(run)], base / "run.idx")
    left = sorted(p.name for p in (run / "checkpoints").glob(".*"))
    assert left == [], f"a save left these behind: {left}"
    assert "Resuming from" in out and "at step 4" in out
    # each of the two streams (spawned workers) logs where it resumes
    assert out.count("resume: stream=") == 2, out[-3000:]
    final = "pretrained_model/model.safetensors"
    assert (ckpt(run, 8) / final).read_bytes() == (ckpt(ref, 8) / final).read_bytes()
    # the new runs' default order (--stream.*, tests/test_train_stream.py), kept by the resume
    for c in (ckpt(run, 4), ckpt(run, 8)):
        options = json.loads((c / "training_state/robo_resume/options.json").read_text())
        assert options["stream"] == {"order": "shuffle", "shuffle_frames": 1024}, options
    # the data: steps 1..4 from the killed run, then 5..8 from the resumed run, in the
    # uninterrupted order (steps after the checkpoint that the killed run logged are replaced)
    ref_steps = steps_of(base / "ref.idx")
    logged = steps_of(base / "run.idx")
    resumed = [s for s in logged if s[0] > 4][-4:]
    assert [s for s in logged if s[0] <= 4] == ref_steps[:4]
    assert resumed == ref_steps[4:]
    # lerobot's own loaders read the result
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.policies.act.modeling_act import ACTPolicy

    policy = ACTPolicy.from_pretrained(ckpt(run, "last") / "pretrained_model")
    assert sum(p.numel() for p in policy.parameters()) > 0
    cfg = TrainPipelineConfig.from_pretrained(ckpt(run, "last") / "pretrained_model")
    assert cfg.batch_size == 4 and cfg.steps == 8
    assert cfg.dataloader_multiprocessing_context == "spawn"
    # then an elastic resume (1 worker, batch 8) finishes epoch 0; the audit of the three runs
    # (killed, resumed, elastic) says every frame of epoch 0 was trained exactly once
    elastic = [a for a in common if not a.startswith(("--batch_size", "--num_workers", "--steps"))]
    elastic += [fork, "--batch_size=8", "--num_workers=1", "--steps=12", f"--output_dir={run}"]
    train([*elastic, *resume_args(run)], base / "run.idx", zygote=zygotes[0])
    code, text = audit(run, f"--index-log={base / 'run.idx'}", zygote=zygotes[1])
    assert code == 0, text
    assert (
        "run 3: steps 9..12, resumed from 000008, world_size=1 num_workers=1 batch_size=8, "
        "remainder of epoch 0 re-partitioned" in text
    ), text
    # 65 training frames, 2 streams of 32: one frame is in no stream of epoch 0 (tail="drop")
    assert (
        "epoch 0 (complete): 64 frames, 64 trained once, 0 replayed, 0 lost, 1 in no "
        "stream (tail)" in text
    ), text
    assert "index log: 12 step(s) compared with the record" in text
    assert text.rstrip().endswith("robo_resume: exactly once")
    tampered_record_fails_the_audit(ref, base / "ref.idx", base / "tampered", zygotes[1])
    data_state_of_another_dataset_is_refused(data, ref, zygotes[0])


def epoch_frames_exactly_once(entries: list[list[int]], frames: int) -> None:
    flat = [i for idx in entries for i in idx]
    first = Counter(flat[:frames])
    assert first == Counter(range(frames)), (
        f"epoch 0: replayed {sorted(k for k, v in first.items() if v > 1)[:10]}, "
        f"lost {sorted(set(range(frames)) - set(first))[:10]}"
    )


@pytest.mark.slow(40)
def test_two_processes_under_accelerate_then_one_with_other_workers_and_batch_size(data, zygotes):
    """2 CPU processes under accelerate (loader not prepared, 2 workers each, batch 4), then
    resumed elastically with 1 process, 1 worker and batch 8: the epoch's frames exactly once."""
    base, root, _, _ = data
    out = base / "ddp"
    log = base / "ddp.idx"
    common = [
        *TINY_ACT,
        "--dataset.repo_id=local/a",
        f"--dataset.root={root}",
        "--seed=2",
        "--dataloader_multiprocessing_context=fork",
    ]
    cmd = [
        # --multi_gpu starts the processes with torchrun; on CPU (--policy.device=cpu) they use
        # gloo. accelerate's --cpu launcher would start a single process. Port 0: a free port
        # (accelerate's default, 29500, is shared by every such run on the machine; two that
        # start together both find it free, and the second fails with EADDRINUSE).
        str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes=2", "--num_machines=1",
        "--main_process_port=0", "--mixed_precision=no", "--dynamo_backend=no",
        "-m", "robo_resume.cli", "train",
        *common, "--batch_size=4", "--num_workers=2", "--steps=5", "--save_freq=5",
        f"--output_dir={out}",
    ]  # fmt: skip
    # well within pytest's 300 s (fixtures included, and the dump takes a while on a loaded
    # machine): a hang fails with every process's stacks (tests/stuck_run.py)
    p = run_or_dump(cmd, env=env_for(log), timeout=200)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    r0, r1 = steps_of(log, 0), steps_of(log, 1)
    assert [s for s, _ in r0] == [s for s, _ in r1] == [1, 2, 3, 4, 5]
    seen0 = {i for _, idx in r0 for i in idx}
    seen1 = {i for _, idx in r1 for i in idx}
    assert not seen0 & seen1, "the two ranks trained on the same frames"
    state = json.loads(
        (ckpt(out, 5) / "training_state" / "robo_resume" / "data_state.json").read_text()
    )
    assert state["world_size"] == 2 and len(state["cursors"]) == 4  # 2 ranks x 2 workers
    # one process, one worker, batch 8 finishes the interrupted epoch: 128 - 40 = 88 frames in
    # 11 batches of 8
    _, text = train([*common, "--batch_size=8", "--num_workers=1", "--steps=16",
                     "--save_freq=100", f"--output_dir={out}", *resume_args(out)], log,
                    zygote=zygotes[1])  # fmt: skip
    assert "Resuming from" in text
    rest = [idx for s, idx in steps_of(log, 0) if s > 5]
    assert [len(idx) for idx in rest[:11]] == [8] * 11
    epoch_frames_exactly_once([idx for _, idx in r0] + [idx for _, idx in r1] + rest, 128)
    # the audit from the record alone (2 ranks' rows gathered into each checkpoint), and with
    # the index log of both ranks
    code, report = audit(out, f"--index-log={log}", zygote=zygotes[1], as_json=True)
    assert code == 0, report
    assert [(r["world_size"], r["num_workers"], r["batch_size"]) for r in report["runs"]] == [
        (2, 2, 4),
        (1, 1, 8),
    ]
    assert report["log_steps_checked"] == 5 * 2 + 11
    e0 = report["epochs"][0]
    assert (e0["frames"], e0["once"], e0["replayed"], e0["lost"], e0["pending"]) == (
        128,
        128,
        0,
        0,
        0,
    )


@pytest.mark.slow(17)
def test_mix_of_two_datasets_resumes_per_source(data, zygotes, capsys):
    """--mix.roots/--mix.weights (lerobot refuses several datasets): exact resume.

    The resumed run starts from a copy of the uninterrupted run's step-4 checkpoint (the same
    files a run stopped after step 4 leaves; a kill mid-run is test_kill_resume_bit_identical's).
    """
    base, a, b, _ = data
    common = [*TINY_ACT, "--dataset.repo_id=local/mix", f"--mix.roots={a},{b}",
              "--mix.weights=1,3", "--batch_size=4", "--num_workers=0", "--seed=4",
              "--save_freq=4"]  # fmt: skip
    ref, run = base / "mixref", base / "mixrun"
    train([*common, "--steps=8", f"--output_dir={ref}"], base / "mixref.idx", zygote=zygotes[0])
    shutil.copytree(ref, run, symlinks=True)
    shutil.rmtree(ckpt(run, 8))
    ckpt(run, "last").unlink()
    ckpt(run, "last").symlink_to("000004")
    # resumed without the --mix flags: the checkpoint remembers the sources
    resumed = [a for a in common if not a.startswith("--mix.")]
    _, text = train([*resumed, "--steps=8", f"--output_dir={run}", *resume_args(run)],
                    base / "mixrun.idx", zygote=zygotes[1])  # fmt: skip
    assert "mix of 2 datasets" in text and "Resuming from" in text
    # each source's stream says where it resumes, naming the source
    assert f"source=0 ({a})" in text and f"source=1 ({b})" in text, text[-3000:]
    # robo-resume plan names each source's line (a source logs it when first drawn)
    cfg = ckpt(run, 4) / "pretrained_model" / "train_config.json"
    plan = plan_of(capsys, f"--config_path={cfg}")
    assert [s["source"] for s in plan["streams"]] == [0, 1]
    assert resume_lines(text) and set(resume_lines(text)) <= {s["line"] for s in plan["streams"]}
    code, report = audit(run, zygote=zygotes[0])
    assert code == 2 and "robo-resume audit does not audit --mix.* runs yet" in report, report
    assert "a mix of 2 sources" in report and "ROBO_RESUME_TRAIN_INDEX_LOG=PATH" in report
    ref_steps = steps_of(base / "mixref.idx")
    assert [s for s, _ in ref_steps] == list(range(1, 9))
    assert steps_of(base / "mixrun.idx") == ref_steps[4:]
    final = "pretrained_model/model.safetensors"
    assert (ckpt(run, 8) / final).read_bytes() == (ckpt(ref, 8) / final).read_bytes()
    # the new runs' default order (--stream.*, tests/test_train_stream.py), kept by the resume
    for c in (ckpt(run, 4), ckpt(run, 8)):
        options = json.loads((c / "training_state/robo_resume/options.json").read_text())
        assert options["stream"] == {"order": "shuffle", "shuffle_frames": 1024}, options


@pytest.mark.slow(20)
def test_plain_lerobot_checkpoint_resumes_with_warning(data, zygotes):
    """A checkpoint written by lerobot-train itself (no data state) resumes, with a warning."""
    base, root, _, _ = data
    out = base / "plain"
    common = [*TINY_ACT, "--dataset.repo_id=local/a", f"--dataset.root={root}",
              "--batch_size=4", "--num_workers=0", "--seed=1", "--save_freq=2",
              "--dataset.video_backend=pyav"]  # fmt: skip
    train([*common, "--steps=2", f"--output_dir={out}"], zygote=zygotes[0],
          command="lerobot-train")  # fmt: skip
    assert not (ckpt(out, 2) / "training_state" / "robo_resume").exists()
    _, text = train([*common, "--steps=3", f"--output_dir={out}", *resume_args(out)],
                    zygote=zygotes[1])  # fmt: skip
    assert "has no robo_resume data state" in text
    assert "resume exactly, but the data starts a new robo_resume epoch 0" in text
    assert (ckpt(out, 3) / "training_state" / "robo_resume" / "data_state.json").is_file()
    # and lerobot-train resumes from a checkpoint robo-resume train wrote
    train([*common, "--steps=4", f"--output_dir={out}", *resume_args(out)], zygote=zygotes[0],
          command="lerobot-train")  # fmt: skip
    assert (ckpt(out, 4) / "pretrained_model" / "model.safetensors").is_file()


@pytest.mark.slow(9)
def test_bad_invocations_get_clear_errors(tmp_path, capsys):
    # In this process: robo_resume.lerobot_train.main is what `robo-resume train` calls (the
    # real command runs in every other test of this file). robo-resume's own flags and
    # --config_path are checked before lerobot is imported.
    from robo_resume.lerobot_train import main

    assert main(["--mix.rootz=a"]) == 2
    text = capsys.readouterr().err
    assert "Unknown flag --mix.rootz" in text and "--mix.roots" in text
    code = main(
        [*TINY_ACT, "--dataset.repo_id=local/a", f"--dataset.root={tmp_path}", "--resume=true",
         f"--config_path={tmp_path}/nowhere/checkpoints/last/pretrained_model/train_config.json"]
    )  # fmt: skip
    text = capsys.readouterr().err
    assert code == 2, text[-2000:]
    assert "Cannot resume" in text and "--config_path=OUTPUT_DIR/checkpoints/last" in text
    # robo-resume audit of a folder without a checkpoint
    from robo_resume.cli import main as cli_main

    assert cli_main(["audit", str(tmp_path)]) == 2
    text = capsys.readouterr().err
    assert "No checkpoint to audit" in text and "--checkpoint STEP" in text, text
    # lerobot's parser refuses a flag it does not know: it exits (argparse), which the command
    # passes on as its exit code; sys.argv is put back either way
    argv = list(sys.argv)
    with pytest.raises(SystemExit) as exit_:
        main([*TINY_ACT, "--dataset.repo_id=local/a", "--no_such_flag=1"])
    text = capsys.readouterr().err
    assert exit_.value.code not in (0, None) and "no_such_flag" in text, text[-2000:]
    assert sys.argv == argv


def run_args(root: Path, out: Path, *extra: str, steps: int = 2) -> list[str]:
    """A tiny ACT run on ``root`` into ``out`` (one worker-less stream, a checkpoint at the end)."""
    return [*TINY_ACT, "--dataset.repo_id=local/x", f"--dataset.root={root}", "--batch_size=4",
            "--num_workers=0", "--seed=5", f"--steps={steps}", f"--save_freq={steps}",
            f"--output_dir={out}", *extra]  # fmt: skip


@pytest.mark.slow(40)
def test_missing_file_refused_before_step_1_then_readable_skip_and_resume_flags(data, zygotes):
    """A dataset copy without one episode's mp4: refused before step 1, naming the file and the
    flags; --dataset.episodes=readable and --data.on_error=skip train; a resume with other
    episodes is refused saying so, and --data.resume_strict=false resumes with the risk told."""
    from robo_resume.format.metadata import load_metadata

    base = data[0]
    root = make_dataset(
        base / "holes", episode_lengths=(10, 12, 8), num_cameras=1, episodes_per_file=1
    ).root
    ep1 = load_metadata(root).episode(1)
    (missing,) = (ref.path for ref in ep1.videos.values())
    (root / missing).unlink()
    lost = set(range(10, 22))  # episode 1's index values
    code, text = train(run_args(root, base / "h0"), ok=False, zygote=zygotes[0])
    assert code == 2, text[-3000:]
    assert f"missing {missing} (episode 1)" in text, text[-3000:]
    assert "--dataset.episodes=readable" in text and "--data.on_error=skip" in text
    assert " step:1 " not in text and "Traceback" not in text
    # readable: the two other episodes, kept in train_config.json for the resume
    _, text = train(run_args(root, base / "h1", "--dataset.episodes=readable"),
                    base / "h1.idx", zygote=zygotes[1])  # fmt: skip
    cfg = json.loads((ckpt(base / "h1", 2) / "pretrained_model/train_config.json").read_text())
    assert cfg["dataset"]["episodes"] == [0, 2]
    assert not lost & {i for _, idx in steps_of(base / "h1.idx") for i in idx}
    # skip: the missing file's chunks are skipped as they are read, each logged
    _, text = train(run_args(root, base / "h2", "--data.on_error=skip", steps=8),
                    base / "h2.idx", zygote=zygotes[0])  # fmt: skip
    assert f"skipping the frames of {root / missing} (episode 1" in text, text[-3000:]
    seen = {i for _, idx in steps_of(base / "h2.idx") for i in idx}
    assert not lost & seen and seen == set(range(30)) - lost
    # a resume with other episodes: refused, saying what differs (not "another run's data")
    resume = ["--steps=3", *resume_args(base / "h1")]
    code, text = train([*run_args(root, base / "h1", "--dataset.episodes=[0]"), *resume],
                       ok=False, zygote=zygotes[1])  # fmt: skip
    assert code == 2, text[-3000:]
    assert "holds the data state of a run on the same dataset with other episodes" in text
    assert "this run vs the checkpoint: episodes 0 vs 0,2" in text
    assert "--data.resume_strict=false" in text and "resume_strict=False" not in text
    lax = run_args(root, base / "h1", "--dataset.episodes=[0]", "--data.resume_strict=false")
    _, text = train([*lax, *resume], zygote=zygotes[0])
    assert "--data.resume_strict=false: the checkpoint's data state is used even" in text
    assert "frames can be trained on twice or never" in text
    assert "resume state check disabled" in text and "at step 2" in text


OPEN50 = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "open50"


@pytest.mark.slow(30)
def test_dataset_with_other_key_names_gets_the_rename_flag_which_trains(tmp_path, zygotes):
    """open50 (keys actions, state, image; 7 mp4s missing): a clear error before the policy is
    built, suggesting --data.features; the suggested flag with --dataset.episodes=readable
    trains (a real dataset, 480x640 video)."""
    assert (OPEN50 / "meta" / "info.json").is_file(), f"{OPEN50} is missing (../shared)"
    import re

    args = [*TINY_ACT, "--dataset.repo_id=local/open50", f"--dataset.root={OPEN50}",
            "--batch_size=2", "--num_workers=0", "--steps=1", "--save_freq=1"]  # fmt: skip
    code, text = train([*args, f"--output_dir={tmp_path / 'a'}"], ok=False, zygote=zygotes[0])
    assert code == 2, text[-3000:]
    assert "The dataset has no feature named 'action', the policy's output" in text
    assert "Found features ['actions', 'state', 'image']" in text
    assert "AttributeError" not in text and "Traceback" not in text
    flag = re.search(r"--data\.features='(\{[^']*\})'", text)
    assert flag is not None, text[-3000:]
    assert json.loads(flag.group(1)) == {
        "actions": "action",
        "state": "observation.state",
        "image": "observation.images.image",
    }
    _, text = train([*args, f"--data.features={flag.group(1)}", "--dataset.episodes=readable",
                     f"--output_dir={tmp_path / 'b'}"], zygote=zygotes[1])  # fmt: skip
    assert " step:1 " in text and "dataset.num_episodes=43" in text
    # the resume keeps --data.features (and the episodes, in the config): no flag needed
    resume = [a for a in args if not a.startswith("--steps")]
    _, text = train([*resume, "--steps=2", f"--output_dir={tmp_path / 'b'}",
                     *resume_args(tmp_path / "b")], zygote=zygotes[0])  # fmt: skip
    assert "Resuming from" in text and " step:2 " in text, text[-3000:]


@pytest.mark.slow(15)
def test_mix_features_map_a_source_and_help_lists_the_flags(data, zygotes):
    """A mix whose second source has a camera more: the mismatch error suggests --mix.features;
    dropping the camera with it trains. --help starts with robo_resume's flags."""
    base, a, _, _ = data
    d = make_dataset(base / "d", episode_lengths=(20, 14), num_cameras=2, height=48, width=64)
    args = [*TINY_ACT, "--dataset.repo_id=local/mix", f"--mix.roots={a},{d.root}",
            "--batch_size=4", "--num_workers=0", "--steps=2", "--save_freq=2"]  # fmt: skip
    code, text = train([*args, f"--output_dir={base / 'mf0'}"], ok=False, zygote=zygotes[0])
    assert code == 2, text[-3000:]
    assert "does not have the mix's features" in text
    assert "extra ['observation.images.cam1']" in text
    assert "--mix.features='[{}, {" in text and "MixSource(" not in text, text[-3000:]
    drop = '--mix.features=[{}, {"observation.images.cam1": null}]'
    _, text = train([*args, drop, f"--output_dir={base / 'mf1'}"], zygote=zygotes[1])
    options = json.loads((ckpt(base / "mf1", 2) / "training_state/robo_resume/options.json")
                         .read_text())  # fmt: skip
    assert options["mix"]["features"] == [{}, {"observation.images.cam1": None}]
    _, text = train(["--help"], zygote=zygotes[0])
    own = text.index("lerobot-train's flags:")
    for flag in (
        "--data.on_error",
        "--data.features",
        "--data.resume_strict",
        "RISK",
        "--dataset.episodes",
        "--mix.features",
        "--stream.order",
        "What is exact",
    ):
        assert flag in text[:own], flag  # fmt: skip
    assert text.index("usage: robo-resume train") > own


def resume_lines(text: str) -> list[str]:
    """The streams' ``resume: stream=...`` lines of a run's log, sorted (workers log them in
    any order)."""
    return sorted(m.group(0) for m in re.finditer(r"resume: stream=.*\)", text))


def plan_of(capsys, *argv: str) -> dict:
    """``robo-resume plan --json ARGV`` in this process (what the command line runs)."""
    from robo_resume.cli import main

    capsys.readouterr()
    code = main(["plan", "--json", *argv])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    return json.loads(out.out)


def logged_progress(text: str) -> dict[int, tuple[str, str, str]]:
    """step -> (smpl, ep, epch) as lerobot's log line shows them."""
    pattern = r" step:(\d+) smpl:(\S+) ep:(\S+) epch:(\S+) "
    return {int(m[0]): m[1:] for m in re.findall(pattern, text)}


@pytest.mark.slow(40)
def test_plan_prints_the_resume_lines_and_the_log_counts_the_samples(data, zygotes, capsys):
    """``robo-resume plan --config_path`` against real resumes of one run (2 workers, batch 4,
    a non-default --stream.* order), at its step-2 checkpoint with the same topology and at
    its step-4 checkpoint with 1 worker and batch 16 (elastic): the plan's ``resume:`` lines
    are the ones each resumed run logged. The elastic run's ``smpl``/``ep``/``epch`` are the
    frames trained, counted from the index log (lerobot's step * batch_size said 16 * step)."""
    from lerobot.utils.utils import format_big_number

    base, root, _, _ = data
    common = [*TINY_ACT, "--dataset.repo_id=local/a", f"--dataset.root={root}", "--seed=5",
              "--dataloader_multiprocessing_context=fork"]  # fmt: skip
    order = ["--stream.order=interleave", "--stream.interleave=3"]
    run, log = base / "planned", base / "planned.idx"
    train([*common, *order, "--batch_size=4", "--num_workers=2", "--steps=4", "--save_freq=2",
           f"--output_dir={run}"], log, zygote=zygotes[0])  # fmt: skip
    # the step-2 checkpoint, resumed as it was saved (a copy, so that `last` names it)
    same = base / "planned_same"
    shutil.copytree(run, same, symlinks=True)
    shutil.rmtree(ckpt(same, 4))
    ckpt(same, "last").unlink()
    ckpt(same, "last").symlink_to("000002")
    cfg = ckpt(same, 2) / "pretrained_model" / "train_config.json"
    plan = plan_of(capsys, f"--config_path={cfg}")
    assert plan["step"] == 2 and plan["stream"] == {"order": "interleave", "interleave": 3}
    assert plan["saved"] == plan["resume"] == {"batch_size": 4, "num_workers": 2, "world_size": 1}
    _, text = train([*common, "--batch_size=4", "--num_workers=2", "--steps=3",
                     f"--output_dir={same}", *resume_args(same)], zygote=zygotes[1])  # fmt: skip
    assert len(resume_lines(text)) == 2, text[-3000:]
    assert sorted(s["line"] for s in plan["streams"]) == resume_lines(text)
    # the plan of the library default order differs (what plan printed for a train run before)
    default = plan_of(capsys, str(root), "--step=2", "--batch_size=4", "--num_workers=2",
                      "--seed=5", "--infinite")  # fmt: skip
    assert sorted(s["line"] for s in default["streams"]) != resume_lines(text)
    # with the run's flags, plan ROOT computes the same lines without the checkpoint
    flags = plan_of(capsys, str(root), "--step=2", "--batch_size=4", "--num_workers=2",
                    "--seed=5", "--infinite", *order)  # fmt: skip
    assert sorted(s["line"] for s in flags["streams"]) == resume_lines(text)

    # the step-4 checkpoint (the output dir's `last`) resumed with 1 worker and batch 16
    plan = plan_of(capsys, f"--config_path={run}", "--num_workers=1", "--batch_size=16")
    assert plan["step"] == 4 and plan["resume"]["batch_size"] == 16
    _, text = train([*common, "--batch_size=16", "--num_workers=1", "--steps=8",
                     "--save_freq=100", f"--output_dir={run}", *resume_args(run)], log,
                    zygote=zygotes[1])  # fmt: skip
    assert "elastic re-partition" in text
    assert [s["line"] for s in plan["streams"]] == resume_lines(text)
    # ground truth: the frames each step trained on, from the index log
    per_step = dict(steps_of(log))  # steps 1..4 of the first run, 5..8 of the resumed one
    assert sorted(per_step) == list(range(1, 9))
    progress = logged_progress(text)
    assert sorted(progress) == [5, 6, 7, 8]
    for step, shown in progress.items():
        samples = sum(len(per_step[s]) for s in range(1, step + 1))
        want = (format_big_number(samples), format_big_number(samples * 4 / 128),
                f"{samples / 128:.2f}")  # fmt: skip
        assert shown == want, (step, shown, want)
    assert progress[8][0] == "80"  # 4 x 4 + 4 x 16, where lerobot counted 8 x 16 = 128
    options = json.loads((ckpt(run, 8) / "training_state/robo_resume/options.json").read_text())
    assert options["samples"] == 80

    # what plan refuses, saying how to fix it on the command line
    from robo_resume.cli import main

    assert main(["plan", f"--config_path={run}", "--step=3"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint of step 3" in err and "checkpoints of steps 2, 4, 8" in err, err
    assert "pass --step with one of those steps" in err
    assert main(["plan", f"--config_path={run}", "--seed=1"]) == 2
    err = capsys.readouterr().err
    assert "--seed with --config_path" in err and "leave them out" in err, err
    assert main(["plan", f"--config_path={base / 'nowhere'}"]) == 2
    err = capsys.readouterr().err
    assert "names no robo-resume train checkpoint" in err and "does not exist" in err, err
