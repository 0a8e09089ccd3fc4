"""``robo-resume train`` streaming its dataset from the Hub or a URL, nothing downloaded but meta/.

A factory dataset is served on loopback by tests/remote_servers.py (a Hub endpoint as
``HF_ENDPOINT``, and a plain HTTP server for ``--dataset.root=http://...``). Every streamed run
is compared with the same run on the local folder: the per-step frame indices (the index log)
and the final ``model.safetensors``, byte for byte (the local runs are deterministic on CPU,
tests/test_lerobot_train.py proves it), and a streamed resume with the local resume. The runs
are forked from tests/train_zygote.py's pre-imported parents, through the helpers of
tests/test_lerobot_train.py.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from remote_servers import COMMIT, FolderServer, HubServer
from test_lerobot_train import (
    TINY_ACT,
    audit,
    ckpt,
    resume_args,
    steps_of,
    train,
    zygotes,  # noqa: F401 - the module-scoped fixture of the two pre-imported parents
)

from robo_resume.testing import make_dataset

LENGTHS = (12, 9, 11)  # 32 frames: 8 steps of 4 per epoch, one stream
REPO_ID = "org/ds"
FINAL = "pretrained_model/model.safetensors"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The dataset's folder, and the Hub and HTTP servers serving it (stopped at the end)."""
    base = tmp_path_factory.mktemp("streaming")
    root = make_dataset(
        base / "ds", episode_lengths=LENGTHS, num_cameras=1, height=48, width=64
    ).root
    started = []
    try:
        for server in (HubServer(root, repo_id=REPO_ID), FolderServer(root)):
            started.append(server.start())
        yield root, started[0], started[1]
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def env(monkeypatch, served, tmp_path):
    """The runs' environment (tests/test_lerobot_train.py's env_for reads os.environ): the
    loopback Hub as HF_ENDPOINT, and every cache in ``tmp_path`` to see what lands on disk."""
    _, hub, http = served
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("ROBO_RESUME_CACHE", str(tmp_path / "rr-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "lerobot-home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    for server in (hub, http):
        server.faults.clear()
    return tmp_path


def args(out: Path, *extra: str, steps: int = 8, workers: int = 0) -> list[str]:
    return [*TINY_ACT, f"--dataset.repo_id={REPO_ID}", "--batch_size=4", f"--steps={steps}",
            "--save_freq=4", f"--num_workers={workers}", "--seed=7", f"--output_dir={out}",
            *extra]  # fmt: skip


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def only_meta_on_disk(cache: Path) -> None:
    """What the runs left in the caches: robo_resume's copy of meta/ (and its manifest), no
    data or video file, no Hub snapshot, nothing in lerobot's home."""
    files = files_under(cache / "rr-cache")
    assert files and all(
        f.split("/", 3)[3].startswith(("meta/", "robo_resume_files/"))  # the file ledger
        or f.endswith("robo_resume_manifest.json")
        for f in files
    ), files
    assert any(f.endswith("meta/info.json") for f in files), files
    for other in ("hf-home", "lerobot-home"):
        assert not [f for f in files_under(cache / other) if "/data/" in f or "/videos/" in f]
        assert not [f for f in files_under(cache / other) if f.endswith((".parquet", ".mp4"))]


def once_per_epoch(steps: list[tuple[int, list[int]]], frames: int) -> None:
    flat = [i for _, idx in steps for i in idx]
    assert Counter(flat[:frames]) == Counter(range(frames)), flat[:frames]


@pytest.mark.slow(55)
def test_streamed_run_equals_the_local_run_and_resumes_exactly(served, env, zygotes):  # noqa: F811
    """--dataset.streaming=true (hf:// at the endpoint's commit): the same frames per step and
    the same weights as --dataset.root=<local>; a copy stopped after step 4 resumes streaming,
    exactly once over the epoch, the same steps and weights as the uninterrupted runs."""
    root, hub, _ = served
    local, streamed, resumed = env / "local", env / "streamed", env / "resumed"
    train(args(local, f"--dataset.root={root}", steps=10), env / "local.idx", zygote=zygotes[0])
    streaming = args(streamed, "--dataset.streaming=true", steps=10)
    _, text = train(streaming, env / "streamed.idx", zygote=zygotes[1])
    assert f"streaming hf://datasets/{REPO_ID} at commit {COMMIT}" in text, text[-3000:]
    assert "nothing else is downloaded" in text
    ref = steps_of(env / "local.idx")
    assert [s for s, _ in ref] == list(range(1, 11))
    once_per_epoch(ref, sum(LENGTHS))  # epoch 0 is steps 1..8
    assert steps_of(env / "streamed.idx") == ref
    for step in (4, 8, 10):
        weights = (ckpt(streamed, step) / FINAL).read_bytes()
        assert weights == (ckpt(local, step) / FINAL).read_bytes(), step
    # the data and video files came over the wire as byte ranges, only meta/ is on disk
    assert hub.faults.count("GET", ".mp4") > 0 and hub.faults.count("GET", ".parquet") > 0
    only_meta_on_disk(env)
    cfg = json.loads((ckpt(streamed, 10) / "pretrained_model/train_config.json").read_text())
    assert cfg["dataset"]["streaming"] is True and cfg["dataset"]["root"] is None
    # stopped after step 4 (the files such a run leaves), resumed from its config: streaming
    shutil.copytree(streamed, resumed, symlinks=True)
    for step in (8, 10):
        shutil.rmtree(ckpt(resumed, step))
    ckpt(resumed, "last").unlink()
    ckpt(resumed, "last").symlink_to("000004")
    _, text = train(args(resumed, *resume_args(resumed), steps=10), env / "resumed.idx",
                    zygote=zygotes[0])  # fmt: skip
    assert "Resuming from" in text and "at step 4" in text, text[-3000:]
    assert f"streaming hf://datasets/{REPO_ID}" in text
    assert steps_of(env / "resumed.idx") == ref[4:]
    assert (ckpt(resumed, 10) / FINAL).read_bytes() == (ckpt(local, 10) / FINAL).read_bytes()
    # the audit reads the record and plans the streamed dataset again: exactly once
    code, report = audit(resumed, f"--index-log={env / 'resumed.idx'}", zygote=zygotes[1])
    assert code == 0, report
    assert "epoch 0 (complete): 32 frames, 32 trained once, 0 replayed, 0 lost" in report, report
    assert report.rstrip().endswith("robo_resume: exactly once")


@pytest.mark.slow(25)
def test_url_root_with_spawned_workers_equals_the_local_run(served, env, zygotes):  # noqa: F811
    """--dataset.root=http://... streams without the flag, with 2 workers started by lerobot's
    default start method (spawn) and held-out episodes evaluated (read from the URL too): the
    same frames per step, eval losses and weights as the local folder read with forked
    workers."""
    root, _, http = served
    local, streamed = env / "local", env / "streamed"
    fork = "--dataloader_multiprocessing_context=fork"
    held_out = ["--dataset.eval_split=0.5", "--eval_steps=4"]  # episode 0 trains, 1 and 2 don't
    _, local_text = train(args(local, f"--dataset.root={root}", fork, *held_out, workers=2),
                          env / "l.idx", zygote=zygotes[0])  # fmt: skip
    _, text = train(args(streamed, f"--dataset.root={http.url}", *held_out, workers=2),
                    env / "s.idx", zygote=zygotes[1])  # fmt: skip
    assert f"streaming {http.url}:" in text, text[-3000:]
    assert "Train/eval split: 1 train, 2 eval" in text and text.count("eval_loss=") == 2
    assert all(max(idx) < LENGTHS[0] for _, idx in steps_of(env / "s.idx"))
    assert steps_of(env / "s.idx") == steps_of(env / "l.idx")
    assert (ckpt(streamed, 8) / FINAL).read_bytes() == (ckpt(local, 8) / FINAL).read_bytes()
    assert re.findall(r"eval_loss=\S+", text) == re.findall(r"eval_loss=\S+", local_text)
    assert http.faults.count("GET", ".mp4") > 0
    only_meta_on_disk(env)


@pytest.mark.slow(25)
def test_fork_workers_wrong_repo_or_revision_and_mixing_are_refused(served, env, zygotes):  # noqa: F811
    """Refused before the policy is built, exit code 2, each message naming what and the fix."""
    root, hub, http = served
    out = env / "refused"

    def refused(*extra: str) -> str:
        code, text = train(args(out, *extra), ok=False, zygote=zygotes[0])
        assert code == 2, text[-3000:]
        assert "Traceback" not in text and "Start offline training" not in text, text[-3000:]
        assert not (out / "checkpoints").exists()
        return text

    text = refused("--dataset.streaming=true", "--num_workers=1",
                   "--dataloader_multiprocessing_context=fork")  # fmt: skip
    assert (
        "--dataloader_multiprocessing_context=fork cannot start the DataLoader workers of a "
        "streamed dataset" in text
    ), text[-3000:]
    assert f"with --num_workers=1 for hf://datasets/{REPO_ID}" in text
    assert "drop --dataloader_multiprocessing_context (spawn), or pass " in text
    assert "--dataloader_multiprocessing_context=forkserver, or --num_workers=0" in text
    text = refused(f"--dataset.root={http.url}", "--num_workers=2",
                   "--dataloader_multiprocessing_context=fork")  # fmt: skip
    assert f"for {http.url}" in text
    # a wrong repo, a wrong revision: named with the endpoint and the flags
    text = refused("--dataset.streaming=true", "--dataset.repo_id=org/nope")
    assert f"The Hub at {hub.url} has no dataset repo 'org/nope' (revision 'main')" in text, text
    assert "check --dataset.repo_id=org/nope and --dataset.revision=main" in text
    assert "HF_ENDPOINT names the endpoint" in text and "HF_TOKEN" in text
    text = refused("--dataset.streaming=true", "--dataset.revision=v9.9")
    assert f"The Hub at {hub.url} has no revision 'v9.9' of the dataset repo '{REPO_ID}'" in text
    assert f"check --dataset.repo_id={REPO_ID} and --dataset.revision=v9.9" in text
    text = refused(f"--dataset.root={http.url}/nowhere")
    assert f"Cannot stream the dataset at {http.url}/nowhere" in text, text[-3000:]
    assert f"{http.url}/nowhere/meta/info.json" in text
    assert "check --dataset.root (the URL of the dataset's root folder)" in text
    # a revision for a URL that is not the Hub's
    text = refused(f"--dataset.root={http.url}", "--dataset.revision=v3.0")
    assert f"does not support --dataset.revision=v3.0 with --dataset.root={http.url}" in text
    # --dataset.streaming with --mix.*: the sources are given as URLs instead
    text = refused("--dataset.streaming=true", f"--mix.roots={root},{root}")
    assert "robo-resume train does not support --dataset.streaming=true with --mix.*" in text
    assert "--mix.roots=hf://datasets/ORG/A,s3://BUCKET/B" in text


@pytest.mark.slow(20)
def test_a_mix_of_url_sources_equals_the_mix_of_local_folders(served, env, zygotes):  # noqa: F811
    """--mix.roots with URLs (the Hub and plain HTTP): the same frames per step and weights as
    the same mix of local folders (stats aggregated from the remote meta/, nothing else
    downloaded)."""
    root, hub, http = served
    local, streamed = env / "local", env / "streamed"
    weights = "--mix.weights=1,3"
    train(args(local, f"--mix.roots={root},{root}", weights, steps=6), env / "l.idx",
          zygote=zygotes[0])  # fmt: skip
    remote = f"--mix.roots=hf://datasets/{REPO_ID},{http.url}"
    _, text = train(args(streamed, remote, weights, steps=6), env / "s.idx", zygote=zygotes[1])
    assert "mix of 2 datasets" in text, text[-3000:]
    assert steps_of(env / "s.idx") == steps_of(env / "l.idx")
    assert (ckpt(streamed, 6) / FINAL).read_bytes() == (ckpt(local, 6) / FINAL).read_bytes()
    assert hub.faults.count("GET", ".mp4") > 0 and http.faults.count("GET", ".mp4") > 0
    only_meta_on_disk(env)
