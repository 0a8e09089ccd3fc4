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

import pytest
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
    assert "holds the data state of another run's data" in text
    assert "Traceback" not in text


@pytest.mark.slow(55)
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
    # step written again, or before its new `last` link replaced the old): the next save
    # removes them all
    planted = (".000008.partial-1", ".000008.old-2")
    for name in planted:
        (run / "checkpoints" / name / "pretrained_model").mkdir(parents=True)
    (run / "checkpoints" / ".last.3").symlink_to("000004")
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
        # gloo. accelerate's --cpu launcher would start a single process.
        str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes=2", "--num_machines=1",
        "--mixed_precision=no", "--dynamo_backend=no", "-m", "robo_resume.cli", "train",
        *common, "--batch_size=4", "--num_workers=2", "--steps=5", "--save_freq=5",
        f"--output_dir={out}",
    ]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, env=env_for(log), timeout=300)
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
    # robo-resume plan names each source's line (a source logs it when first drawn)
    cfg = ckpt(run, 4) / "pretrained_model" / "train_config.json"
    plan = plan_of(capsys, f"--config_path={cfg}")
    assert [s["source"] for s in plan["streams"]] == [0, 1]
    assert resume_lines(text) and set(resume_lines(text)) <= {s["line"] for s in plan["streams"]}
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
    # lerobot's parser refuses a flag it does not know: it exits (argparse), which the command
    # passes on as its exit code; sys.argv is put back either way
    argv = list(sys.argv)
    with pytest.raises(SystemExit) as exit_:
        main([*TINY_ACT, "--dataset.repo_id=local/a", "--no_such_flag=1"])
    text = capsys.readouterr().err
    assert exit_.value.code not in (0, None) and "no_such_flag" in text, text[-2000:]
    assert sys.argv == argv


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
