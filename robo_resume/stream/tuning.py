"""StreamTuning: the documented knobs of the stream, and the ``on_error`` values.

The knobs: chunk order, interleave, tail, decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BROKEN_DATA_ERRORS, RemoteChangedError, RemoteReadError, describe
from ..format.keyframes import AUTO_FILES as AUTO_FILES  # re-exported (documented here)
from ..format.keyframes import AUTO_KEYFRAME_INTERVAL as AUTO_KEYFRAME_INTERVAL
from ..index.schedule import (
    INTERLEAVE_ORDERS,
    TAILS,
    ScheduleConfig,
)
from ..workers import WORKER_DIED_HINT as WORKER_DIED_HINT  # re-exported (tests, callers)

ORDERS = ("shuffle", "interleave")
"""Values of ``StreamTuning(order=...)``."""

SHUFFLE_CHUNK_FRAMES = 2
"""``chunk_frames`` when it is None and the order is "shuffle": two frames per chunk (one AV1 GOP
as lerobot writes it), so that a shuffle window holds many places of the dataset (longer GOPs
make chunks a GOP long, see ``cut_at_keyframes``)."""

SHUFFLE_CHUNK_FRAMES_TABULAR = 1
"""``chunk_frames`` when it is None, the order is "shuffle" and the stream reads no video (state
and action columns, images stored in the parquet): single frames, so a shuffle window's frames
are a uniform sample of the epoch; nothing is decoded twice without video."""

INTERLEAVE_CHUNK_FRAMES = 64
"""``chunk_frames`` when it is None and the order is "interleave"."""

SHUFFLE_FRAMES = 1024
"""Default ``StreamTuning.shuffle_frames``."""

_INTERLEAVE_DEFAULTS = {"interleave": 4, "interleave_order": "random"}

ON_ERROR = ("raise", "skip")
"""Values of ``ChunkedEpisodeDataset(on_error=...)``."""

SKIP_ERRORS = BROKEN_DATA_ERRORS
"""Errors ``on_error="skip"`` skips a chunk for (anything else is raised)."""

REMOTE_ERRORS = (RemoteReadError, RemoteChangedError)
"""Errors of a remote read that failed for good (after the store's retries, or a file that
changed on the server): raised with the episode and frames being read, never skipped (an outage
or a new version of the dataset is not a broken file; skipping would drop what is readable)."""


@dataclass(frozen=True)
class StreamTuning:
    """Knobs that change the order or the speed of streaming (defaults are sensible).

    Attributes:
        order: how a stream orders its frames. "shuffle" (the default): the stream reads short
            chunks (``chunk_frames`` None: :data:`SHUFFLE_CHUNK_FRAMES` frames, or one GOP of a
            long-GOP video) drawn at random from the whole dataset, in windows of
            ``shuffle_frames`` frames, and emits each window's frames in a uniformly random
            order: a policy trains on it as well as on uniform random sampling over frames
            (docs/training-quality.md). "interleave": the faster order of robo_resume 0.1 (the
            default until then): ``interleave`` chunks of ``chunk_frames`` (None: 64) frames
            open at once, their frames interleaved (``interleave_order``); consecutive batches
            then share their chunks, and the policy learns measurably worse (the same page).
            None: "interleave" when ``interleave`` or ``interleave_order`` is set to something
            other than its default, else "shuffle". See :meth:`fast`.
        shuffle_frames: frames per shuffle window (``order="shuffle"``). The window's chunks are
            decoded when the window first needs them and their frames held, decoded, until
            emitted: a stream holds at most this many decoded frames per camera (YUV 4:2:0, 1.5
            bytes a pixel): 1024 frames are at most 472 MB per camera at 480x640, 14 MB at
            96x96; with 2-frame chunks about a quarter of that at the peak (a chunk is held from
            its first frame's emission to its last's), with long-GOP chunks most of it. Larger
            windows mix more of the dataset into each stretch of batches; smaller ones hold
            less. Part of a resume state's fingerprint.
        interleave: the interleave order's chunks open at once per stream, whose frames are
            interleaved (1 = none). Default 4 (:meth:`fast`): batches of about 4 chunks. More
            open chunks put more episodes into a batch, at a cost in speed and memory (each
            open chunk keeps a video decoder per camera), but consecutive batches still share
            their chunks (docs/interleave-order.md, docs/training-quality.md).
        interleave_order: how the interleave order interleaves the frames of the open chunks.
            "random" (default): a seeded permutation of all their frames, so a chunk may give
            several frames in a row. "rounds": every open chunk gives one frame per round, each
            round in a seeded order, so ``B`` consecutive frames come from ``min(B,
            interleave)`` chunks. "spread": every open chunk's frames are spaced evenly over
            the whole group, so a chunk shorter than the others (an episode's tail) does not
            leave the group's last rounds to a few long chunks. Each chunk's frames stay in
            order with every one of them.
        tail: what happens to the frames that do not divide evenly over the streams (DataLoader
            workers x ranks) each epoch. "drop" (default, training): they are left out (fewer
            than one per stream, a different few every epoch), every stream yields the same
            number. "pad": the streams are filled up by repeating frames from the epoch's
            start. "keep" (evaluation, see :meth:`evaluation`): every frame exactly once; the
            streams get consecutive pieces of the epoch, and on each rank the first workers
            may yield one batch more than the others (the DataLoader's round-robin order and
            the resume arithmetic stay exact). Ranks get the same number of batches whenever
            the frames allow it (always with one rank; with several ranks, 2+ workers and
            batch size 2+ whenever there are at least as many frames as ranks); otherwise the
            first ranks get one batch more, and a DDP collective per batch would wait forever:
            gather each rank's results after the pass instead, or use "pad" (repeats frames).
            Needs ``drop_last=False`` and epoch mode (not ``infinite``).
        shuffle: permute chunks each epoch and per stream (False = episode order, for eval).
        cut_at_keyframes: start every chunk after an episode's first on a keyframe of the first
            camera's video, so that no chunk decodes frames it throws away: a chunk ends at the
            last keyframe within ``chunk_frames`` frames, or, with none in reach (GOP longer
            than ``chunk_frames``), at the next keyframe (chunks up to one GOP long: fewer,
            longer chunks, so batches mix fewer episodes). With a delta window reaching back
            ``L`` frames on that camera the cuts sit ``L`` frames after the keyframes (the
            chunk's first window then starts on one). The keyframes come from each video
            file's mp4 index (``stss``), one small read per file at construction (a file the
            index cannot describe, e.g. fragmented, is demuxed).
            None (default): automatic, on when the first camera's video files exist and a
            keyframe interval of its first :data:`AUTO_FILES` (8) files exceeds
            :data:`AUTO_KEYFRAME_INTERVAL` (2) frames: lerobot's AV1 default (gop 2) keeps the
            even plan and reads only those 8 files; a missing first file turns it off (a
            dataset without its videos: decided without reading anything); an unreadable file
            leaves its episodes cut evenly (the read path reports it).
            True: always (errors raised); False: never, every chunk is ``chunk_frames`` long.
        block_frames: frames read from one chunk at a time (bounds memory per open chunk).
        tolerance_s: video frame time tolerance (lerobot's default 1e-4 s).
        decoder_threads: FFmpeg threads per video decoder (0: FFmpeg's choice). Default 1: the
            DataLoader workers (or the camera threads) keep the cores busy, and PyAV decoders
            with FFmpeg threads were seen to deadlock when garbage-collected.
        camera_threads: threads decoding concurrently in one process: the cameras of a chunk,
            and the chunks of a batch (PyAV decodes and swscale converts without the GIL).
            None (default): in the main process (``num_workers=0``) one for frames smaller
            than 128x128 pixels (a second thread loses more to GIL hand-offs than it gives),
            else one per camera and at least 2 (1 on a single core); 1 in DataLoader workers.
            In the main process they decode in the background, one block ahead of the batch
            being used (with one thread, only while the loop spends at least a fifth of its
            time between batches, e.g. in a training step; else on the calling thread, which
            is then faster); in workers, on the worker's own thread.

    Raises:
        ValueError: a knob is out of range, unknown, or belongs to the other order (e.g.
            ``interleave`` with ``order="shuffle"``); the message names the fix.
    """

    order: str | None = None
    shuffle_frames: int = SHUFFLE_FRAMES
    interleave: int = 4
    interleave_order: str = "random"
    tail: str = "drop"
    shuffle: bool = True
    cut_at_keyframes: bool | None = None
    block_frames: int = 16
    tolerance_s: float = 1e-4
    decoder_threads: int = 1
    camera_threads: int | None = None

    def __post_init__(self) -> None:
        if self.block_frames < 1:
            raise ValueError(describe("block_frames must be >= 1", found=self.block_frames))
        if self.order is not None and self.order not in ORDERS:
            raise ValueError(
                describe(
                    "Unknown order",
                    expected=" or ".join(map(repr, ORDERS)),
                    found=repr(self.order),
                )
            )
        sf = self.shuffle_frames
        if isinstance(sf, bool) or not isinstance(sf, int) or sf < 1:
            raise ValueError(describe("shuffle_frames must be a positive int", found=repr(sf)))
        set_interleave = {
            k: getattr(self, k) for k, v in _INTERLEAVE_DEFAULTS.items() if getattr(self, k) != v
        }
        if self.order == "shuffle" and set_interleave:
            raise ValueError(
                describe(
                    "interleave and interleave_order belong to order='interleave'",
                    expected="order='interleave' with them, or order='shuffle' without them",
                    found=f"order='shuffle' with {set_interleave}",
                    fix="pass order='interleave' to interleave open chunks, or drop "
                    f"{', '.join(set_interleave)} to keep the shuffle order",
                )
            )
        if self.shuffle_frames != SHUFFLE_FRAMES and self.resolved_order == "interleave":
            raise ValueError(
                describe(
                    "shuffle_frames belongs to order='shuffle'",
                    expected="shuffle_frames with order='shuffle' (or order=None)",
                    found=f"shuffle_frames={self.shuffle_frames} with order='interleave'"
                    + (f" (chosen by {set_interleave})" if self.order is None else ""),
                    fix="drop shuffle_frames, or drop the interleave settings",
                )
            )
        if self.interleave_order not in INTERLEAVE_ORDERS:
            raise ValueError(
                describe(
                    "Unknown interleave_order",
                    expected=" or ".join(map(repr, INTERLEAVE_ORDERS)),
                    found=self.interleave_order,
                )
            )
        if self.tail not in TAILS:
            raise ValueError(
                describe("Unknown tail", expected=" or ".join(map(repr, TAILS)), found=self.tail)
            )

    @property
    def resolved_order(self) -> str:
        """The order used: ``order``, or for None the one chosen by the interleave settings."""
        if self.order is not None:
            return self.order
        changed = any(getattr(self, k) != v for k, v in _INTERLEAVE_DEFAULTS.items())
        return "interleave" if changed else "shuffle"

    def chunk_frames(self, chunk_frames: int | None, *, video: bool = True) -> int:
        """The frames per chunk this order uses for a source's ``chunk_frames``.

        Args:
            chunk_frames: the source's value, or None for the order's default.
            video: whether the stream reads a video feature (after ``features`` selection).

        Returns:
            ``chunk_frames`` itself, or for None this order's default: for the shuffle order
            :data:`SHUFFLE_CHUNK_FRAMES` with video, :data:`SHUFFLE_CHUNK_FRAMES_TABULAR`
            without; for the interleave order :data:`INTERLEAVE_CHUNK_FRAMES`.
        """
        if chunk_frames is not None:
            return chunk_frames
        if self.resolved_order == "shuffle":
            return SHUFFLE_CHUNK_FRAMES if video else SHUFFLE_CHUNK_FRAMES_TABULAR
        return INTERLEAVE_CHUNK_FRAMES

    def schedule_config(self, *, seed: int, batch_size: int, drop_last: bool) -> ScheduleConfig:
        """The schedule options of these knobs: what the dataset and ``robo-resume plan`` use.

        Args:
            seed: the dataset's base seed.
            batch_size: the DataLoader's batch size.
            drop_last: whether every stream's epoch is a whole number of batches.

        Returns:
            The :class:`~robo_resume.index.schedule.ScheduleConfig`.
        """
        shuffle_order = self.resolved_order == "shuffle"
        return ScheduleConfig(
            seed=seed,
            batch_size=batch_size,
            drop_last=drop_last,
            tail=self.tail,
            interleave=self.interleave,
            shuffle=self.shuffle,
            interleave_order="shuffle" if shuffle_order else self.interleave_order,
            window=self.shuffle_frames if shuffle_order else 0,
        )

    @classmethod
    def fast(cls, **overrides: Any) -> StreamTuning:
        """The interleave order of robo_resume 0.1, its default until then.

        ``order="interleave"``, 4 open chunks of 64 frames, frames drawn at random among them:
        the most frames per second, especially without DataLoader workers, at a cost in
        training quality: a stream keeps the same 4 chunks for about ``chunk_frames`` batches,
        so consecutive batches are correlated and a policy learns measurably worse than on
        uniform sampling (docs/training-quality.md gives the measured cost).

        Args:
            **overrides: other knobs, e.g.
                ``StreamTuning.fast(interleave=32, interleave_order="spread")``.

        Returns:
            The :class:`StreamTuning`.
        """
        return cls(**{"order": "interleave", **overrides})

    @classmethod
    def evaluation(cls, **overrides: Any) -> StreamTuning:
        """The preset for validation and evaluation: every selected frame exactly once per pass.

        ``shuffle=False``, ``tail="keep"`` and the interleave order (unshuffled, both orders
        give the frames in dataset order; the interleave order reads 64-frame chunks forward):
        with ``num_workers=0`` the frames come in
        dataset order (episode by episode, as selected); with workers, each worker reads a
        consecutive piece of that order, so each worker's frames are in order and the
        DataLoader alternates between the workers batch by batch. Use it with
        ``drop_last=False`` (the default). Under DDP, rank ``r`` gets the ``r``-th
        consecutive part of the frames (see ``tail``); sum or gather the metrics per rank
        after the pass.

        Args:
            **overrides: other knobs, e.g. ``StreamTuning.evaluation(block_frames=32)``.

        Returns:
            The :class:`StreamTuning`.
        """
        return cls(**{"order": "interleave", "shuffle": False, "tail": "keep", **overrides})
