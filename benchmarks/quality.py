"""Training quality: does a policy trained on robo_resume's order learn as well as on uniform
random sampling?

Small behaviour-cloning policies are trained for a fixed number of steps under each order, and
their validation loss is compared with that of the same policy trained on uniform random
sampling (what lerobot's ``DataLoader(shuffle=True)`` gives). Seeds are paired: seed ``s``
gives the same model initialisation (``torch.manual_seed(s)`` right before the model is built)
under every order, so only the order differs between the runs of a seed. Each table reports,
per order, the validation MSE as a ratio to uniform sampling (one ratio per seed, then the
mean [min-max] over seeds) at 25%, 50% and 100% of the steps, the absolute validation MSE, the
final training MSE (all training frames) as a ratio, and the median wall time of a run.

Cases (``--cases``):

- ``open50``: ``../shared/datasets/open50`` (LeRobot v3.0, 50 episodes, 30 fps), its camera
  dropped (``features={"image": None}``); an MLP maps ``state`` (34) to the next 16 ``actions``
  (34 each). Skipped, with a message, when the folder is absent.
- ``reach-mlp`` and ``reach-cnn``: a scripted pick-and-place dataset written once into
  ``--data-dir/reach`` with lerobot's own writer (``LeRobotDataset.create`` /
  ``add_frame`` / ``save_episode`` / ``finalize``, AV1 video with lerobot's defaults, streaming
  encoding): 100 episodes of 300-500 frames (seeded; ``--quick``: 8 of 60-100, in
  ``reach-quick``). ``observation.state`` is the arm (xyz, gripper), ``action`` the next arm
  command, ``observation.environment_state`` the object's and the target's xy, and the camera
  ``observation.images.top`` (96x96) renders the scene: the target a green square, the object a
  red one (carried with the arm while gripped), the arm a disc whose size shows its height and
  whose colour its gripper (blue open, yellow closed). ``reach-mlp``: an MLP on the state and
  environment state; ``reach-cnn``: a small CNN (4 strided convolutions of 16-64 channels, an
  MLP head of 256) on the camera and the arm state only, so that the object and the target
  are seen only in the image. Writing the full dataset (40,178 frames) took 242 s on this
  2-core machine while other jobs ran (rendering, lerobot's frame checks and its AV1 encoding
  on a background thread; the time is printed and stored in the JSON as ``write_seconds``),
  the quick one 3 s. lerobot's encoder prints a line per video file on stderr.

Every dataset is split by episode, ``Split((0.88, 0.12), index=0, seed=0)`` for training (the
loader's ``episodes=``) and ``index=1`` for validation.

Orders (rows; ``--orders NAME=JSON`` adds library orders, the JSON holding StreamTuning
keywords and optionally ``"chunk_frames"``, passed to the dataset):

- ``uniform``: a fresh seeded permutation of the training frames every epoch, cut into batches
  of 32 (the short last one kept), what ``DataLoader(shuffle=True)`` gives;
- ``uniform (other permutation)``: the same from another seed: the noise floor (what 1.0x
  looks like);
- ``default``: ``ChunkedEpisodeDataset(root, batch_size=32, seed=s, episodes=train, ...)``
  with the library's default tuning (no ``tuning=``), for each ``--workers`` count;
- ``fast``: ``StreamTuning.fast()`` (``order="interleave"``), the interleave order that was the
  default before the shuffle order.

A library order is read from the pure schedule (``ds.schedule(W).frame_indices(epoch,
stream)``, nothing decoded): with ``W`` workers the DataLoader yields batch ``k`` from worker
``k % W``, each worker's stream cut into batches of 32, epoch after epoch until ``--steps``
batches. It is then checked against the real loader: the first ``--check-batches`` batches
(all of them with ``--quick``) of ``ds.dataloader(num_workers=W)`` (with ``delta_timestamps``
for the 16-step action chunk) must have the same ``index`` values, and their state, action
chunk, ``_is_pad`` mask (and, for the CNN, uint8 image) must equal the in-memory rows the
training's tensors are computed from, exactly (``torch.equal``); any difference stops the
benchmark. The JSON records the batches checked (``loader_check_batches``). Two orders that
give the same batches for a seed (e.g. ``default`` and an ``--orders`` row equal to it) are
trained once; the JSON names the twin (``same_order_as``).

Training data: every frame's columns are read once into memory (pyarrow; for the CNN the camera
decoded once, uint8, through ``StreamTuning.evaluation()``), so every order indexes the same
tensors. Training: AdamW (lr 1e-3, weight decay 1e-4), batch 32, ``--steps`` steps, lr
``constant`` or ``cosine`` (100 linear warm-up steps, then cosine to 0); masked MSE on
normalised actions (mean and std of the training frames; the padded steps past an episode's
end masked out), inputs normalised likewise (images /255). One torch thread per run, ``--jobs``
runs at once in training processes (fresh interpreters running this script with
``--train-worker``, the arrays handed over as ``.npy`` files in a temporary folder, the images
memory-mapped; not forks of this process, which has run DataLoaders and PyAV and pyarrow
threads), each warmed up first (torch's one-time start-up is not counted in a run's time).

Run: ``python benchmarks/quality.py [--cases open50,reach-mlp,reach-cnn] [--seeds 3]
[--steps 3000] [--lr constant,cosine] [--workers 0,2] [--jobs 2] [--orders NAME=JSON ...]
[--json out/quality.json]``. Everything takes about an hour and a half on a 2-core machine
(a 4-layer MLP step at batch 32 is about 6 ms, a step of the CNN about 70 ms while other jobs
ran, and the CNN's evaluation passes over all frames add about a third; reach-cnn is most of
the time); ``--cases open50,reach-mlp --seeds 3 --lr constant,cosine --workers 0,2`` took
6 minutes while other jobs ran. ``--quick``:
the small reach dataset, 40 steps, 1 seed, constant lr, 0 workers, orders uniform/default/fast,
every case, every batch checked against the loader (used by the tests; 33 s here, with the
reach dataset to write and other jobs running).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import describe_machine, machine, print_table, progress, write_json

REPO = Path(__file__).resolve().parents[1]
OPEN50 = REPO.parent / "shared" / "datasets" / "open50"
HORIZON = 16  # action chunk: the frame's action and the next 15
BATCH = 32
CHECKPOINTS = (0.25, 0.5, 1.0)  # fractions of the steps where validation is evaluated
WARMUP = 100  # linear warm-up steps of the cosine schedule
UNIFORM = "uniform"
OTHER = "uniform (other permutation)"
# name -> order spec: uniform permutations (a generator salt) or library tuning keywords
BASE_ORDERS: dict[str, dict[str, Any]] = {
    UNIFORM: {"kind": "uniform", "salt": 1},
    OTHER: {"kind": "uniform", "salt": 2},
    "default": {"kind": "library", "tuning": None},
    "fast": {"kind": "library", "tuning": {"order": "interleave"}},  # StreamTuning.fast()
}
QUICK_ORDERS = (UNIFORM, "default", "fast")
CASES = ("open50", "reach-mlp", "reach-cnn")


class LoaderMismatch(AssertionError):
    """The real loader's batches differ from the order or the rows the training uses."""


# -- the reach dataset: a scripted pick and place, written with lerobot's writer -----------------
REACH_CAMERA = "observation.images.top"
REACH_SIZE = 96
REACH_FEATURES = {
    "observation.state": {"dtype": "float32", "shape": (4,), "names": ["x", "y", "z", "grip"]},
    "observation.environment_state": {
        "dtype": "float32",
        "shape": (4,),
        "names": ["object_x", "object_y", "target_x", "target_y"],
    },
    "action": {"dtype": "float32", "shape": (4,), "names": ["x", "y", "z", "grip"]},
    REACH_CAMERA: {
        "dtype": "video",
        "shape": (REACH_SIZE, REACH_SIZE, 3),
        "names": ["height", "width", "channels"],
    },
}


def _minjerk(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    t = np.linspace(0, 1, n)[:, None]
    s = 10 * t**3 - 15 * t**4 + 6 * t**5
    return a + (b - a) * s


def reach_episode(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """One scripted episode of ``n`` frames: the arm goes from home above the object, down,
    carries it (gripper closed) above the target, down, and back home, along minimum-jerk
    segments of random lengths with a small random-walk wobble (an operator's hand).

    Returns ``state`` (n, 4: arm xyz, gripper), ``action`` (n, 4: the next arm state, noisy),
    ``env`` (n, 4: the object's xy, carried while gripped, and the target's xy)."""
    home = rng.uniform(-0.2, 0.2, 3) + np.array([0, 0, 0.4])
    obj = np.r_[rng.uniform(-0.5, 0.5, 2), 0.05]
    tgt = np.r_[rng.uniform(-0.5, 0.5, 2), 0.05]
    cuts = np.sort(rng.choice(np.arange(20, n - 20), 4, replace=False))
    up = np.array([0, 0, 0.15])
    segments = [(home, obj + up), (obj + up, obj), (obj, tgt + up), (tgt + up, tgt), (tgt, home)]
    bounds = np.r_[0, cuts, n]
    pos = np.concatenate(
        [_minjerk(a, b, bounds[i + 1] - bounds[i]) for i, (a, b) in enumerate(segments)]
    )
    pos += np.cumsum(rng.normal(0, 0.002, pos.shape), 0)
    grip = np.zeros(n)
    grip[bounds[2] : bounds[4]] = 1.0
    grip = np.convolve(grip, np.ones(9) / 9, mode="same")
    arm = np.c_[pos, grip]
    action = np.r_[arm[1:], arm[-1:]] + rng.normal(0, 0.003, arm.shape)
    held = np.tile(obj[:2], (n, 1))  # where the object is: picked at bounds[2], left at bounds[4]
    held[bounds[2] : bounds[4]] = pos[bounds[2] : bounds[4], :2]
    held[bounds[4] :] = pos[bounds[4] - 1, :2]
    env = np.c_[held, np.tile(tgt[:2], (n, 1))]
    f32 = np.float32
    return {"state": arm.astype(f32), "action": action.astype(f32), "env": env.astype(f32)}


def _pixel(xy: np.ndarray) -> np.ndarray:
    """Workspace xy in [-0.6, 0.6] to (row, column) pixel coordinates."""
    scale = (REACH_SIZE - 1) / 1.2
    return np.array([(0.6 - xy[1]) * scale, (xy[0] + 0.6) * scale])


_YY, _XX = np.mgrid[0:REACH_SIZE, 0:REACH_SIZE]


def render(state: np.ndarray, env: np.ndarray) -> np.ndarray:
    """The camera's view of one frame, (96, 96, 3) uint8: dark floor, the target a green square
    (11 px), the object a red one (7 px), the arm a translucent disc of radius 3 + 14 * height
    px, blue with the gripper open, yellow closed."""
    img = np.full((REACH_SIZE, REACH_SIZE, 3), 40, dtype=np.float32)
    for xy, half, colour in ((env[2:4], 5, (40, 200, 60)), (env[0:2], 3, (230, 40, 40))):
        r, c = np.round(_pixel(xy)).astype(int)
        img[max(r - half, 0) : r + half + 1, max(c - half, 0) : c + half + 1] = colour
    r, c = _pixel(state[:2])
    radius = 3 + 14 * max(float(state[2]), 0.0)
    disc = (_YY - r) ** 2 + (_XX - c) ** 2 <= radius**2
    g = float(np.clip(state[3], 0, 1))
    colour = np.array([60, 120, 255]) * (1 - g) + np.array([255, 220, 0]) * g
    img[disc] = 0.4 * img[disc] + 0.6 * colour
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


@contextlib.contextmanager
def _own_scheduling():
    """Keep this thread's CPU policy across lerobot's encoding: SVT-AV1, run as root, switches
    the thread driving it to SCHED_FIFO 99, which every process forked later (the training
    runs, DataLoader workers) would inherit (robo_resume.testing.video does the same)."""
    if not hasattr(os, "sched_getscheduler"):
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:
        if os.sched_getscheduler(0) != policy or os.sched_getparam(0) != param:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(0, policy, param)


def write_reach(root: Path, episodes: int, lengths: tuple[int, int], seed: int = 0) -> float:
    """Write the reach dataset into ``root`` with lerobot's writer (into ``root.partial``
    first, renamed when finalized); returns the seconds it took."""
    import logging

    import av
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its configuration otherwise
    with contextlib.suppress(Exception):  # the "Map" progress bars of HF datasets
        import datasets

        datasets.disable_progress_bars()
    tmp = root.with_name(root.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    level, av_level = logging.root.level, av.logging.get_level()
    logging.root.setLevel(logging.WARNING)
    av.logging.set_level(av.logging.ERROR)  # the mp4 muxer's "Starting second pass" per file
    try:
        with _own_scheduling():
            ds = LeRobotDataset.create(
                repo_id="local/reach",
                root=tmp,
                fps=30,
                features=REACH_FEATURES,
                use_videos=True,
                streaming_encoding=True,
            )
            for e in range(episodes):
                ep = reach_episode(rng, int(rng.integers(*lengths)))
                for s, a, env in zip(ep["state"], ep["action"], ep["env"], strict=True):
                    frame = {
                        "observation.state": s,
                        "observation.environment_state": env,
                        "action": a,
                        REACH_CAMERA: render(s, env),
                        "task": "pick and place",
                    }
                    ds.add_frame(frame)
                ds.save_episode()
                if (e + 1) % 20 == 0:
                    progress(f"reach: {e + 1}/{episodes} episodes written")
            ds.finalize()
    finally:
        logging.root.setLevel(level)
        av.logging.set_level(av_level)
    tmp.rename(root)
    return time.perf_counter() - t0


def reach_root(data_dir: Path, quick: bool) -> tuple[Path, float | None]:
    """The reach dataset (written on first use): its root, and the seconds writing it took
    (None: it was there)."""
    root = data_dir / ("reach-quick" if quick else "reach")
    if (root / "meta" / "info.json").is_file():
        return root, None
    progress(f"writing the reach dataset to {root} with lerobot's writer")
    episodes, lengths = (8, (60, 100)) if quick else (100, (300, 501))
    seconds = write_reach(root, episodes, lengths)
    progress(f"reach dataset written in {seconds:.0f} s")
    return root, seconds


# -- cases: the dataset, its in-memory frames, the model -----------------------------------------
class Case:
    """One dataset and model: which columns the policy sees and predicts. (A plain class, not
    a dataclass: the tests load this script under a name that is not in ``sys.modules``.)"""

    def __init__(
        self,
        name: str,
        root: Path,
        model: str,
        inputs: tuple[str, ...],
        action: str,
        *,
        camera: str | None = None,
        drop: tuple[str, ...] = (),
        write_seconds: float | None = None,
    ) -> None:
        self.name, self.root, self.model = name, Path(root), model  # model: "mlp" or "cnn"
        self.inputs = inputs  # vector features concatenated as the model's input
        self.action = action
        self.camera = camera  # the CNN's image
        self.drop = drop  # features dropped from the loader (cameras of MLP cases)
        self.write_seconds = write_seconds
        self.fps = 30  # the dataset's (read by load_frames): the action window's spacing
        self.train_episodes: tuple[int, ...] = ()
        self.val_episodes: tuple[int, ...] = ()
        self.data: dict[str, Any] = {}  # the in-memory frames (load_frames)

    def features(self) -> dict[str, None] | None:
        return {k: None for k in self.drop} or None

    def delta_timestamps(self) -> dict[str, list[float]]:
        return {self.action: [k / self.fps for k in range(HORIZON)]}

    def describe(self) -> str:
        sees = " + ".join(([self.camera] if self.camera else []) + list(self.inputs))
        return f"{self.model}: {sees} -> {HORIZON} x {self.action}"


def make_case(name: str, data_dir: Path, quick: bool) -> Case | None:
    """The case ``name``; None (with a printed message) when its dataset is absent."""
    if name == "open50":
        if not (OPEN50 / "meta" / "info.json").is_file():
            print(f"\nskipping open50: {OPEN50} is absent (no ../shared/datasets beside the repo)")
            return None
        return Case("open50", OPEN50, "mlp", ("state",), "actions", drop=("image",))
    if name not in ("reach-mlp", "reach-cnn"):
        raise SystemExit(f"unknown case {name!r}; choose from {', '.join(CASES)}")
    root, seconds = reach_root(data_dir, quick)
    if name == "reach-mlp":
        inputs = ("observation.state", "observation.environment_state")
        return Case(
            name, root, "mlp", inputs, "action", drop=(REACH_CAMERA,), write_seconds=seconds
        )
    return Case(
        name,
        root,
        "cnn",
        ("observation.state",),
        "action",
        camera=REACH_CAMERA,
        drop=("observation.environment_state",),
        write_seconds=seconds,
    )


def _vectors(table, key: str) -> np.ndarray:
    """A parquet column of float vectors (list or fixed-size list) as an (n, d) float32 array."""
    col = table.column(key).combine_chunks()
    flat = col.flatten().to_numpy(zero_copy_only=False)
    return flat.reshape(len(col), -1).astype(np.float32, copy=False)


def chunk_targets(episode: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every frame, the rows of its action chunk (the frame and the next ``HORIZON - 1``,
    past the episode's end its last frame, as lerobot pads) and the padding mask (True: past
    the end), both (n, HORIZON). ``episode``: each row's episode, rows grouped by episode."""
    n = len(episode)
    ends = np.flatnonzero(np.r_[episode[1:] != episode[:-1], True])  # last row of each episode
    last = np.repeat(ends, np.diff(np.r_[-1, ends]))
    rows = np.arange(n)[:, None] + np.arange(HORIZON)[None]
    pad = rows > last[:, None]
    return np.minimum(rows, last[:, None]), pad


def load_frames(case: Case) -> None:
    """Read every frame of the case's dataset into memory (``case.data``) and resolve the split."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from robo_resume import ChunkedEpisodeDataset, Split

    parts = [
        ChunkedEpisodeDataset(
            case.root,
            batch_size=BATCH,
            episodes=Split((0.88, 0.12), index=i, seed=0),
            features=case.features(),
        ).episodes
        for i in (0, 1)
    ]
    case.train_episodes, case.val_episodes = parts
    case.fps = json.loads((case.root / "meta" / "info.json").read_text())["fps"]
    files = sorted((case.root / "data").glob("*/*.parquet"))
    columns = ["index", "episode_index", *case.inputs, case.action]
    table = pa.concat_tables([pq.read_table(f, columns=columns) for f in files])
    table = table.sort_by("index")
    index = table.column("index").to_numpy()
    if not np.array_equal(index, np.arange(len(index))):
        raise RuntimeError(f"{case.root}: the index column is not 0..{len(index) - 1}")
    episode = table.column("episode_index").to_numpy()
    raw = {k: _vectors(table, k) for k in (*case.inputs, case.action)}
    rows, pad = chunk_targets(episode)
    train = np.isin(episode, case.train_episodes)
    val = np.isin(episode, case.val_episodes)
    train_idx, val_idx = np.flatnonzero(train), np.flatnonzero(val)
    x = np.concatenate([raw[k] for k in case.inputs], axis=1)
    a = raw[case.action]
    x_mu, x_sd = x[train].mean(0), x[train].std(0) + 1e-6
    a_mu, a_sd = a[train].mean(0), a[train].std(0) + 1e-6
    xn = ((x - x_mu) / x_sd).astype(np.float32)
    an = ((a - a_mu) / a_sd).astype(np.float32)
    case.data = {
        "raw": raw,
        "rows": rows,
        "pad": pad,
        "episode": episode,
        "train_idx": train_idx,
        "val_idx": val_idx,
        "x": xn,
        "y": an[rows].reshape(len(an), -1),  # (n, HORIZON * action dims)
        "mask": np.repeat(~pad, a.shape[1], axis=1).astype(np.float32),
    }
    if case.camera:
        case.data["image"] = decode_camera(case, len(index))


def decode_camera(case: Case, n: int) -> np.ndarray:
    """Every frame of the case's camera, decoded once: (n, 3, H, W) uint8, by dataset index."""
    from robo_resume import ChunkedEpisodeDataset, StreamTuning

    t0 = time.perf_counter()
    ds = ChunkedEpisodeDataset(
        case.root,
        batch_size=256,
        features={k: None for k in (*case.inputs, case.action)},  # the camera and the index
        image_dtype="uint8",
        tuning=StreamTuning.evaluation(),
    )
    out: np.ndarray | None = None
    seen = np.zeros(n, dtype=bool)
    for batch in ds.dataloader(num_workers=0):
        idx = batch["index"].numpy()
        img = batch[case.camera].numpy()
        if out is None:
            out = np.zeros((n, *img.shape[1:]), dtype=np.uint8)
        out[idx] = img
        seen[idx] = True
    if out is None or not seen.all():
        raise RuntimeError(f"{case.root}: the camera pass missed {int((~seen).sum())} frames")
    progress(
        f"{case.name}: {n} frames of {case.camera} decoded in {time.perf_counter() - t0:.0f} s"
    )
    return out


# -- orders -------------------------------------------------------------------------------------
def uniform_order(train_idx: np.ndarray, seed: int, salt: int, steps: int) -> list[np.ndarray]:
    """``steps`` batches of uniform sampling without replacement: a fresh permutation of the
    training frames every epoch (generator seeded with (seed, salt)), cut into batches of
    ``BATCH``, the short last one kept (``DataLoader(shuffle=True)``)."""
    rng = np.random.default_rng([seed, salt])
    out: list[np.ndarray] = []
    while len(out) < steps:
        p = train_idx[rng.permutation(len(train_idx))]
        out += [p[i : i + BATCH] for i in range(0, len(p), BATCH)]
    return out[:steps]


def library_dataset(case: Case, spec: dict[str, Any], seed: int):
    """The dataset of a library order: the case's training episodes and features, the action
    window, uint8 images, the spec's tuning (None: the default) and chunk_frames."""
    from robo_resume import ChunkedEpisodeDataset, StreamTuning

    tuning = dict(spec["tuning"]) if spec["tuning"] is not None else None
    chunk_frames = tuning.pop("chunk_frames", None) if tuning else None
    kwargs: dict[str, Any] = {} if tuning is None else {"tuning": StreamTuning(**tuning)}
    return ChunkedEpisodeDataset(
        case.root,
        batch_size=BATCH,
        seed=seed,
        episodes=list(case.train_episodes),
        features=case.features(),
        chunk_frames=chunk_frames,
        delta_timestamps=case.delta_timestamps(),
        image_dtype="uint8",
        **kwargs,
    )


def schedule_order(ds, workers: int, steps: int) -> list[np.ndarray]:
    """The first ``steps`` batches of ``ds.dataloader(num_workers=workers)``, epoch after
    epoch, from the pure schedule: each stream (one per worker, one without) cut into batches
    of the batch size (the short last one kept unless drop_last), the DataLoader taking whole
    batches from its workers in turn (an exhausted worker is skipped)."""
    sched = ds.schedule(workers)
    streams = max(workers, 1)
    b = ds.batch_size
    out: list[np.ndarray] = []
    epoch = 0
    while len(out) < steps:
        per_stream = []
        for s in range(streams):
            idx = sched.frame_indices(epoch, s)
            cut = len(idx) // b * b if ds.drop_last else len(idx)
            per_stream.append([idx[i : i + b] for i in range(0, cut, b)])
        if not any(per_stream):
            raise RuntimeError(f"epoch {epoch} of the schedule has no batch")
        for k in range(max(map(len, per_stream))):
            out += [p[k] for p in per_stream if k < len(p)]
        epoch += 1
    return out[:steps]


def check_batches(case: Case, batches, expected: list[np.ndarray]) -> int:
    """Compare the loader's ``batches`` with the ``expected`` index batches and the in-memory
    rows: same ``index`` values, and state, action chunk, ``_is_pad`` and image equal exactly
    (``torch.equal``). Stops after ``len(expected)`` batches; returns how many it compared.
    Raises :class:`LoaderMismatch` naming the batch and what differs."""
    import torch

    d = case.data
    checked = 0
    for k, batch in enumerate(batches):
        if k == len(expected):
            break
        idx = batch["index"]
        want = torch.from_numpy(np.asarray(expected[k], dtype=np.int64))
        if not torch.equal(idx, want):
            raise LoaderMismatch(
                f"{case.name}: batch {k}: the loader's index {idx[:8].tolist()}... differs from "
                f"the schedule's {want[:8].tolist()}... ({len(idx)} vs {len(want)} frames)"
            )
        rows = idx.numpy()
        pad_key = f"{case.action}_is_pad"
        pairs = [(key, d["raw"][key][rows]) for key in case.inputs]
        pairs.append((case.action, d["raw"][case.action][d["rows"][rows]]))
        pairs.append((pad_key, d["pad"][rows]))
        if case.camera:
            pairs.append((case.camera, d["image"][rows]))
        for key, mine in pairs:
            theirs = batch[key]
            if not torch.equal(theirs, torch.from_numpy(np.ascontiguousarray(mine))):
                raise LoaderMismatch(
                    f"{case.name}: batch {k}: the loader's {key!r} ({tuple(theirs.shape)}, "
                    f"{theirs.dtype}) differs from the in-memory rows the training uses"
                )
        checked += 1
    if checked < len(expected):
        raise LoaderMismatch(
            f"{case.name}: the loader gave {checked} batches, the schedule {len(expected)}"
        )
    return checked


def check_loader(case: Case, ds, workers: int, expected: list[np.ndarray]) -> int:
    """:func:`check_batches` on the real ``ds.dataloader(num_workers=workers)``, epoch after
    epoch (each ``iter()`` is one) until ``len(expected)`` batches."""

    def batches():
        loader = ds.dataloader(num_workers=workers)
        while True:
            n = 0
            for batch in loader:
                n += 1
                yield batch
            if n == 0:
                return

    gen = batches()
    try:
        return check_batches(case, gen, expected)
    finally:
        gen.close()  # ends the loader's workers


def order_digest(batches: list[np.ndarray]) -> str:
    """A digest of the batches (their lengths and frames): equal orders, equal digests."""
    h = hashlib.sha256()
    for b in batches:
        h.update(np.int64(len(b)).tobytes())
        h.update(np.ascontiguousarray(b, dtype=np.int64).tobytes())
    return h.hexdigest()


# -- training -----------------------------------------------------------------------------------
TRAIN_KEYS = ("x", "y", "mask", "train_idx", "val_idx")  # and "image" for a CNN


def build_model(kind: str, data: dict[str, Any]):
    """The policy: ``"mlp"`` (3 hidden layers of 256) or ``"cnn"`` (a small CNN and an MLP
    head on its features and the state), for the shapes of ``data``."""
    import torch
    from torch import nn

    din, dout = data["x"].shape[1], data["y"].shape[1]
    if kind == "mlp":
        return nn.Sequential(
            nn.Linear(din, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, dout),
        )

    class ImagePolicy(nn.Module):
        """4 strided convolutions (16-64 channels), flattened (the positions matter), joined
        by the state, then 2 hidden layers of 256."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Sequential(
                nn.Conv2d(3, 16, 5, stride=2, padding=2),
                nn.ReLU(),
                nn.Conv2d(16, 32, 3, stride=2, padding=1),
                nn.ReLU(),
                nn.Conv2d(32, 64, 3, stride=2, padding=1),
                nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=2, padding=1),
                nn.ReLU(),
                nn.Flatten(),
            )
            h, w = data["image"].shape[2:]
            with torch.no_grad():
                flat = self.conv(torch.zeros(1, 3, h, w)).shape[1]
            self.head = nn.Sequential(
                nn.Linear(flat + din, 256),
                nn.ReLU(),
                nn.Linear(256, 256),
                nn.ReLU(),
                nn.Linear(256, dout),
            )

        def forward(self, image, x):
            f = self.conv(image.float() / 255)
            return self.head(torch.cat([f, x], dim=1))

    return ImagePolicy()


def lr_factor(schedule: str, steps: int):
    """The learning-rate multiplier of step ``s`` (``LambdaLR``)."""
    if schedule == "constant":
        return lambda s: 1.0
    warm = min(WARMUP, steps // 2)

    def cosine(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (s - warm) / max(steps - warm, 1)))

    return cosine


def train_run(
    data: dict[str, Any], kind: str, batches: list[np.ndarray], seed: int, schedule: str
) -> dict:
    """Train the ``kind`` policy on ``batches`` (rows of ``data``) from the init of ``seed``:
    the validation MSE at each checkpoint, the final training MSE, the wall time."""
    import torch

    t0 = time.perf_counter()
    x, y, m = (torch.from_numpy(np.ascontiguousarray(data[k])) for k in ("x", "y", "mask"))
    image = data.get("image")  # numpy (maybe memory-mapped): indexed there, per batch
    torch.manual_seed(seed)
    net = build_model(kind, data)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(schedule, len(batches)))

    def predict(rows: np.ndarray):
        r = torch.from_numpy(rows)
        if image is None:
            return net(x[r])
        return net(torch.from_numpy(image[rows]), x[r])

    def mse(rows: np.ndarray) -> float:
        net.eval()
        total, weight = 0.0, 0.0
        step = 256 if image is not None else 4096
        with torch.no_grad():
            for i in range(0, len(rows), step):
                part = rows[i : i + step]
                r = torch.from_numpy(part)
                total += float((((predict(part) - y[r]) ** 2) * m[r]).sum())
                weight += float(m[r].sum())
        net.train()
        return total / weight

    marks = {max(1, round(f * len(batches))) for f in CHECKPOINTS}
    val = []
    for s, b in enumerate(batches):
        r = torch.from_numpy(b)
        mr = m[r]
        loss = (((predict(b) - y[r]) ** 2) * mr).sum() / mr.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if s + 1 in marks:
            val.append(mse(np.asarray(data["val_idx"])))
    train = mse(np.asarray(data["train_idx"]))
    return {"val": val, "train": train, "seconds": time.perf_counter() - t0}


def warm_up() -> None:
    """A few steps of both policies on tiny random data: the first run in a process pays torch's
    one-time start-up (about 2.5 s here), which would otherwise count in its wall time."""
    rng = np.random.default_rng(0)
    n = 8
    data = {
        "x": rng.normal(size=(n, 4)).astype(np.float32),
        "y": rng.normal(size=(n, 8)).astype(np.float32),
        "mask": np.ones((n, 8), dtype=np.float32),
        "train_idx": np.arange(n),
        "val_idx": np.arange(n),
    }
    batches = [np.arange(4)] * 4
    train_run(data, "mlp", batches, 0, "cosine")
    data["image"] = rng.integers(0, 255, size=(n, 3, 32, 32), dtype=np.uint8)
    train_run(data, "cnn", batches, 0, "cosine")


# -- training processes: fresh interpreters, the frames memory-mapped from .npy files -----------
REPLY = "@quality-result "  # a worker's reply line on its stdout (other lines go to stderr)


def save_training_data(case: Case, folder: Path) -> Path:
    """The arrays the training needs, as ``.npy`` files in ``folder`` (for the workers)."""
    folder.mkdir(parents=True, exist_ok=True)
    for key in (*TRAIN_KEYS, *(("image",) if case.camera else ())):
        np.save(folder / f"{key}.npy", case.data[key])
    return folder


def load_training_data(folder: Path) -> dict[str, Any]:
    """:func:`save_training_data`'s arrays (the images memory-mapped, read as needed)."""
    data = {k: np.load(folder / f"{k}.npy") for k in TRAIN_KEYS}
    if (folder / "image.npy").is_file():
        data["image"] = np.load(folder / "image.npy", mmap_mode="r")
    return data


def save_batches(path: Path, batches: list[np.ndarray]) -> Path:
    lengths = np.array([len(b) for b in batches], dtype=np.int64)
    np.savez(path, flat=np.concatenate(batches).astype(np.int64), lengths=lengths)
    return path


def load_batches(path: Path) -> list[np.ndarray]:
    with np.load(path) as f:
        return np.split(f["flat"], np.cumsum(f["lengths"])[:-1])


def train_worker() -> int:
    """``--train-worker``: run the jobs given as JSON lines on stdin, one reply line each."""
    import torch

    torch.set_num_threads(1)
    warm_up()
    cache: dict[str, dict[str, Any]] = {}
    out = sys.stdout
    sys.stdout = sys.stderr  # anything a library prints stays off the reply channel
    for line in sys.stdin:
        job = json.loads(line)
        try:
            if job["data"] not in cache:
                cache.clear()
                cache[job["data"]] = load_training_data(Path(job["data"]))
            batches = load_batches(Path(job["batches"]))
            res = train_run(cache[job["data"]], job["kind"], batches, job["seed"], job["lr"])
            reply = {"id": job["id"], "result": res}
        except Exception:
            reply = {"id": job["id"], "error": traceback.format_exc()}
        out.write(REPLY + json.dumps(reply) + "\n")
        out.flush()
    return 0


class TrainPool:
    """``processes`` training processes (``python quality.py --train-worker``, one torch thread
    each), started at once (they import torch and warm up while this process loads the data)
    and kept for every case; ``close()`` ends them. A fresh
    interpreter, not a fork of this process: this one has run DataLoaders, PyAV and pyarrow
    threads (a fork of a multi-threaded process may deadlock)."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self.procs: list = []
        self._start()

    def _start(self) -> None:
        import subprocess

        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for _ in range(self.processes):
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, str(Path(__file__).resolve()), "--train-worker"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=env,
                    cwd=REPO,
                )
            )

    def run(self, data_dir: Path, kind: str, jobs: list[tuple], done) -> list[dict]:
        """Every job ``(batches file, seed, lr)`` on the data in ``data_dir``; ``done(i,
        result)`` as each finishes. Returns the results in job order."""
        import selectors

        results: list[dict | None] = [None] * len(jobs)
        pending = list(range(len(jobs)))[::-1]
        sel = selectors.DefaultSelector()
        busy = 0

        def give(proc) -> bool:
            if not pending:
                return False
            i = pending.pop()
            path, seed, lr = jobs[i]
            job = {"id": i, "data": str(data_dir), "batches": str(path), "kind": kind}
            proc.stdin.write(json.dumps({**job, "seed": seed, "lr": lr}) + "\n")
            proc.stdin.flush()
            return True

        try:
            for proc in self.procs:
                sel.register(proc.stdout, selectors.EVENT_READ, proc)
                busy += give(proc)
            while busy:
                for key, _ in sel.select():
                    proc = key.data
                    line = proc.stdout.readline()
                    if not line:
                        raise RuntimeError(f"training process {proc.pid} died ({proc.poll()})")
                    if not line.startswith(REPLY):
                        sys.stderr.write(line)
                        continue
                    reply = json.loads(line[len(REPLY) :])
                    if "error" in reply:
                        raise RuntimeError(f"training run {reply['id']} failed:\n{reply['error']}")
                    results[reply["id"]] = reply["result"]
                    done(reply["id"], reply["result"])
                    busy -= 1
                    busy += give(proc)
        except BaseException:
            self.close()
            raise
        finally:
            sel.close()
        return results  # type: ignore[return-value]

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except Exception:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        self.procs = []


# -- the benchmark ------------------------------------------------------------------------------
def parse_orders(items: list[str]) -> dict[str, dict[str, Any]]:
    """``NAME=JSON`` items as library order specs."""
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--orders takes NAME=JSON; found {item!r}")
        try:
            kw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"--orders {name}: not JSON ({exc}): {text!r}") from None
        if not isinstance(kw, dict):
            raise SystemExit(f"--orders {name}: the JSON must be an object; found {text!r}")
        out[name] = {"kind": "library", "tuning": kw}
    return out


def _ratio_cell(r: list[float]) -> str:
    return f"{statistics.fmean(r):.3f} [{min(r):.3f}-{max(r):.3f}]"


def run_case(case: Case, args, orders: dict[str, dict[str, Any]], pool, tmp: Path) -> dict:
    """Every order's runs on one case; prints its tables, returns its JSON part."""
    t0 = time.perf_counter()
    load_frames(case)
    d = case.data
    progress(
        f"{case.name}: {len(d['train_idx'])} training frames ({len(case.train_episodes)} "
        f"episodes), {len(d['val_idx'])} validation ({len(case.val_episodes)}), loaded in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    seeds = range(args.seeds)
    # (order name, workers or None) -> seed -> batches; the loader check on the way
    rows: list[tuple[str, int | None]] = []
    batches: dict[tuple[str, int | None, int], list[np.ndarray]] = {}
    checks: dict[str, dict[str, int]] = {}
    for name, spec in orders.items():
        if spec["kind"] == "uniform":
            rows.append((name, None))
            for s in seeds:
                batches[name, None, s] = uniform_order(d["train_idx"], s, spec["salt"], args.steps)
            continue
        for w in args.workers:
            rows.append((name, w))
            checked = 0
            for s in seeds:
                ds = library_dataset(case, spec, s)
                order = schedule_order(ds, w, args.steps)
                n = len(order) if args.check_batches < 0 else min(args.check_batches, len(order))
                checked += check_loader(case, ds, w, order[:n])
                batches[name, w, s] = order
            checks.setdefault(name, {})[f"w{w}"] = checked
            progress(f"{case.name}: {name}, {w} workers: {checked} loader batches equal")
    # one run per distinct (order, seed, lr schedule)
    jobs, keys, twins = [], [], {}
    first: dict[tuple[str, int, str], tuple[str, int | None]] = {}
    for lr in args.lr:
        for name, w in rows:
            for s in seeds:
                digest = order_digest(batches[name, w, s])
                if (digest, s, lr) in first:
                    twins[name, w, s, lr] = first[digest, s, lr]
                    continue
                first[digest, s, lr] = (name, w)
                keys.append((name, w, s, lr))
                jobs.append((batches[name, w, s], s, lr))
    progress(f"{case.name}: {len(jobs)} training runs of {args.steps} steps, {args.jobs} at once")
    started, finished = time.perf_counter(), []

    def done(i: int, res: dict) -> None:
        name, w, s, lr = keys[i]
        finished.append(i)
        where = "" if w is None else f", {w} workers"
        progress(
            f"{case.name}: {name}{where}, lr {lr}, seed {s}: val MSE {res['val'][-1]:.4g} "
            f"({res['seconds']:.0f} s) [{len(finished)}/{len(jobs)} runs, "
            f"{time.perf_counter() - started:.0f} s]"
        )

    if pool is None:  # in this process, one torch thread
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            warm_up()
            out = []
            for i, (order, s, lr) in enumerate(jobs):
                out.append(train_run(d, case.model, order, s, lr))
                done(i, out[-1])
        finally:
            torch.set_num_threads(threads)
    else:
        folder = save_training_data(case, tmp / case.name)
        files = [
            (save_batches(folder / f"batches{i}.npz", order), s, lr)
            for i, (order, s, lr) in enumerate(jobs)
        ]
        out = pool.run(folder, case.model, files, done)
        shutil.rmtree(folder, ignore_errors=True)
    results = dict(zip(keys, out, strict=True))
    for key, (name, w) in twins.items():
        results[key] = {**results[name, w, key[2], key[3]], "same_order_as": _label(name, w)}
    tables = []
    for lr in args.lr:
        for w in args.workers:
            tables.append(table(case, args, rows, results, lr, w))
    return {
        "case": case.name,
        "root": case.root,
        "model": case.describe(),
        "train_episodes": case.train_episodes,
        "val_episodes": case.val_episodes,
        "train_frames": len(d["train_idx"]),
        "val_frames": len(d["val_idx"]),
        "write_seconds": case.write_seconds,
        "loader_check_batches": checks,
        "tables": tables,
    }


def _label(name: str, w: int | None) -> str:
    return name if w is None else f"{name}, {w} workers"


def table(case: Case, args, rows, results, lr: str, workers: int) -> dict:
    """Print and return the table of one lr schedule and worker count."""
    seeds = range(args.seeds)
    base = [results[UNIFORM, None, s, lr] for s in seeds]
    out: dict[str, Any] = {"lr": lr, "workers": workers, "orders": {}}
    printed = []
    for name, w in rows:
        if w is not None and w != workers:
            continue
        runs = [results[name, w, s, lr] for s in seeds]
        pairs = list(zip(runs, base, strict=True))  # (this order's run, uniform's) per seed
        ratios = {
            f"{round(f * 100)}%": [r["val"][i] / b["val"][i] for r, b in pairs]
            for i, f in enumerate(CHECKPOINTS)
        }
        train_ratio = [r["train"] / b["train"] for r, b in pairs]
        entry = {
            "val": [r["val"] for r in runs],
            "train": [r["train"] for r in runs],
            "seconds": [r["seconds"] for r in runs],
            "ratio": {
                k: {"mean": statistics.fmean(v), "min": min(v), "max": max(v), "per_seed": v}
                for k, v in ratios.items()
            },
            "train_ratio": train_ratio,
            "same_order_as": [r.get("same_order_as") for r in runs],
        }
        out["orders"][name] = entry
        twin = {t for t in entry["same_order_as"] if t}
        printed.append(
            [
                name + (f" (= {', '.join(sorted(twin))})" if twin else ""),
                *(_ratio_cell(v) for v in ratios.values()),
                f"{statistics.fmean(r['val'][-1] for r in runs):.4g}",
                _ratio_cell(train_ratio),
                f"{statistics.median(entry['seconds']):.1f}",
            ]
        )
    base_val = [statistics.fmean(b["val"][i] for b in base) for i in range(len(CHECKPOINTS))]
    print(
        f"\n## {case.name} ({case.describe()}): lr {lr}, {workers} workers, "
        f"{args.steps} steps, {args.seeds} seed{'s' if args.seeds > 1 else ''}"
    )
    print(
        "validation MSE / uniform's, paired by seed, mean [min-max]; uniform's validation MSE "
        "at 25/50/100%: " + ", ".join(f"{v:.4g}" for v in base_val)
    )
    headers = ["order", "val 25%", "val 50%", "val 100%", "val MSE 100%", "train MSE", "s/run"]
    print_table(headers, printed)
    out["uniform_val"] = base_val
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--lr", default="constant,cosine", help="constant, cosine or both")
    p.add_argument("--workers", default="0,2", help="DataLoader workers of the library orders")
    p.add_argument("--jobs", type=int, default=2, help="training runs at once")
    p.add_argument(
        "--orders",
        nargs="*",
        default=[],
        metavar="NAME=JSON",
        help='more library orders, e.g. spread32=\'{"interleave": 32, "interleave_order": '
        '"spread"}\' (StreamTuning keywords; "chunk_frames" goes to the dataset)',
    )
    p.add_argument(
        "--skip",
        default="",
        metavar="NAMES",
        help="orders left out, comma-separated, e.g. fast (uniform is the reference: kept)",
    )
    p.add_argument(
        "--check-batches",
        type=int,
        default=20,
        help="batches of each library order compared with the real loader (-1: all)",
    )
    p.add_argument("--data-dir", default=str(REPO / "out" / "bench_data"))
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--train-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.train_worker:
        return train_worker()
    args.lr = [s for s in args.lr.split(",") if s]
    args.workers = [int(w) for w in args.workers.split(",") if w != ""]
    bad = set(args.lr) - {"constant", "cosine"}
    if bad or not args.lr:
        raise SystemExit(f"--lr takes constant and/or cosine; found {args.lr}")
    orders = {**BASE_ORDERS, **parse_orders(args.orders)}
    if args.quick:
        args.steps, args.seeds, args.lr, args.workers = 40, 1, ["constant"], [0]
        args.check_batches = -1
        orders = {k: v for k, v in orders.items() if k in QUICK_ORDERS or k not in BASE_ORDERS}
    skip = {n for n in args.skip.split(",") if n}
    if skip - set(orders) or UNIFORM in skip:
        raise SystemExit(
            f"--skip takes order names other than {UNIFORM!r}: {sorted(orders)}; found "
            f"{sorted(skip)}"
        )
    orders = {k: v for k, v in orders.items() if k not in skip}
    if args.steps < 1 or args.seeds < 1 or not args.workers:
        raise SystemExit("--steps and --seeds must be >= 1, --workers must name a count")
    import logging

    logging.getLogger("robo_resume").setLevel(logging.WARNING)
    print(describe_machine())
    results: dict[str, Any] = {
        "machine": machine(),
        "args": {
            "cases": args.cases,
            "seeds": args.seeds,
            "steps": args.steps,
            "lr": args.lr,
            "workers": args.workers,
            "check_batches": args.check_batches,
            "skip": sorted(skip),
            "quick": args.quick,
        },
        "orders": orders,
        "cases": [],
    }
    t0 = time.perf_counter()
    pool = TrainPool(args.jobs) if args.jobs > 1 else None
    try:
        with tempfile.TemporaryDirectory(prefix="robo-resume-quality-") as tmp:
            for name in args.cases.split(","):
                case = make_case(name, Path(args.data_dir), args.quick)
                if case is not None:
                    results["cases"].append(run_case(case, args, orders, pool, Path(tmp)))
    finally:
        if pool is not None:
            pool.close()
    results["seconds"] = time.perf_counter() - t0
    progress(f"done in {results['seconds']:.0f} s")
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
