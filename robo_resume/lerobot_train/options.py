"""``robo-resume train``'s own flags (``--mix.*``, ``--stream.*``), the checkpoint file names,
and checks made before lerobot is imported (a missing ``--config_path``, lerobot's version)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import RoboResumeError, describe
from ..index.schedule import INTERLEAVE_ORDERS
from ..stream.tuning import ORDERS, SHUFFLE_FRAMES

DATA_DIR = "robo_resume"  # inside a checkpoint's training_state/
DATA_STATE = "data_state.json"
OPTIONS = "options.json"
RNG_RANK = "rng_state_rank{rank}.safetensors"
INDEX_LOG_ENV = "ROBO_RESUME_TRAIN_INDEX_LOG"
MIN_LEROBOT = (0, 6)
_OWN_PREFIX = "--mix."
_STREAM_PREFIX = "--stream."

LEGACY_STREAM = {"order": "interleave", "interleave": 4, "interleave_order": "random"}
"""The stream order of checkpoints written before ``--stream.*`` existed (the library's
``StreamTuning`` defaults then): such a checkpoint's options hold no ``stream`` entry, and it
resumes with this order (its data state was saved with it)."""

_STREAM_FLAGS = ("order", "shuffle_frames", "interleave", "interleave_order")


class TrainSetupError(RoboResumeError, ValueError):
    """A ``robo-resume train`` invocation that cannot run: a flag, a checkpoint or the setup."""


@dataclasses.dataclass(frozen=True)
class MixOptions:
    """The ``--mix.*`` flags: several datasets, drawn by weight (empty: one dataset).

    Attributes:
        roots: dataset folders, one per source.
        repo_ids: Hub ids, one per source (instead of, or beside, ``roots``).
        weights: one positive weight per source (default: all 1).
        features: ``--mix.features``, one feature mapping per source (``{key in the source:
            name in the mix}``, None drops the feature; empty: keep the names), or empty.
        episodes: the episodes of each source, resolved from ``--dataset.episodes=readable``
            (None: all), or empty.
    """

    roots: tuple[str, ...] = ()
    repo_ids: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()
    features: tuple[dict[str, str | None], ...] = ()
    episodes: tuple[list[int] | None, ...] = ()

    def __post_init__(self) -> None:
        n = max(len(self.roots), len(self.repo_ids))
        for name, values in (("roots", self.roots), ("repo_ids", self.repo_ids)):
            if values and len(values) != n:
                raise TrainSetupError(
                    describe(
                        f"--mix.{name} gives {len(values)} sources",
                        expected=f"one entry per source ({n})",
                        found=",".join(values),
                        fix="give --mix.roots and --mix.repo_ids the same number of entries",
                    )
                )
        if self.weights and len(self.weights) != n:
            raise TrainSetupError(
                describe(
                    "--mix.weights needs one weight per source",
                    expected=f"{n} weights",
                    found=",".join(map(str, self.weights)),
                    fix="e.g. --mix.weights=1,3 for two sources",
                )
            )
        if self.features and len(self.features) != n:
            raise TrainSetupError(
                describe(
                    "--mix.features needs one mapping per source",
                    expected=f"a JSON list of {n} objects",
                    found=len(self.features),
                    fix='e.g. --mix.features=\'[{"actions": "action"}, {}]\' for two sources',
                )
            )
        if self.weights and not self.roots and not self.repo_ids:
            raise TrainSetupError(
                describe(
                    "--mix.weights without sources",
                    fix="name the sources with --mix.roots=A,B (or --mix.repo_ids=x/a,y/b)",
                )
            )

    @property
    def enabled(self) -> bool:
        """True when the flags name sources (a mix), False for one dataset."""
        return bool(self.roots or self.repo_ids)

    def sources(self) -> list[dict[str, Any]]:
        """One ``{"root", "repo_id", "weight", "features", "episodes"}`` per source."""
        n = max(len(self.roots), len(self.repo_ids))
        return [
            {
                "root": self.roots[i] if self.roots else None,
                "repo_id": self.repo_ids[i] if self.repo_ids else None,
                "weight": float(self.weights[i]) if self.weights else 1.0,
                "features": dict(self.features[i]) if self.features else {},
                "episodes": self.episodes[i] if self.episodes else None,
            }
            for i in range(n)
        ]

    def to_dict(self) -> dict[str, list]:
        """JSON-safe form (saved in every checkpoint)."""
        return {
            "roots": list(self.roots),
            "repo_ids": list(self.repo_ids),
            "weights": list(self.weights),
            "features": [dict(f) for f in self.features],
            "episodes": list(self.episodes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MixOptions:
        """Inverse of :meth:`to_dict`."""
        return cls(
            roots=tuple(data.get("roots") or ()),
            repo_ids=tuple(data.get("repo_ids") or ()),
            weights=tuple(float(w) for w in data.get("weights") or ()),
            features=tuple(dict(f or {}) for f in data.get("features") or ()),
            episodes=tuple(data.get("episodes") or ()),
        )


def own_flags(
    argv: Sequence[str], prefix: str, names: tuple[str, ...], *, only: bool = False
) -> tuple[dict[str, str], list[str]]:
    """The flags ``PREFIX NAME=VALUE`` (or ``PREFIX NAME VALUE``) of ``argv`` as ``{NAME:
    VALUE}``, and the other arguments in order; a missing value is refused
    (:class:`TrainSetupError`), and so is a name not in ``names`` unless ``only`` (then such
    flags are another parser's, e.g. lerobot's ``--dataset.*``, and stay in the rest)."""
    own: dict[str, str] = {}
    rest: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith(prefix):
            name, eq, value = a[len(prefix) :].partition("=")
            if only and name not in names:
                rest.append(a)
                i += 1
                continue
            if not eq:
                if i + 1 >= len(args):
                    raise TrainSetupError(describe(f"{a} needs a value", fix=f"{a}=VALUE"))
                value, i = args[i + 1], i + 1
            if name not in names:
                flags = [prefix + n for n in names]
                raise TrainSetupError(
                    describe(
                        f"Unknown flag {a.split('=')[0]}",
                        expected=", ".join(flags[:-1]) + " or " + flags[-1],
                        found=a,
                        fix="see `robo-resume train --help` and docs/lerobot-train.md",
                    )
                )
            own[name] = value
        else:
            rest.append(a)
        i += 1
    return own, rest


def split_args(argv: Sequence[str]) -> tuple[MixOptions | None, list[str]]:
    """Split ``argv`` into the ``--mix.*`` flags (None if absent) and lerobot-train's flags."""
    own, rest = own_flags(argv, _OWN_PREFIX, ("roots", "repo_ids", "weights", "features"))
    if not own:
        return None, rest
    features_text = own.pop("features", None)
    items = {k: tuple(x.strip() for x in v.split(",") if x.strip()) for k, v in own.items()}
    try:
        weights = tuple(float(w) for w in items.get("weights", ()))
    except ValueError:
        raise TrainSetupError(
            describe("--mix.weights must be numbers", found=own["weights"], fix="--mix.weights=1,3")
        ) from None
    if any(not w > 0 for w in weights):
        raise TrainSetupError(
            describe(
                "--mix.weights must be positive", found=own["weights"], fix="--mix.weights=1,3"
            )
        )
    features: tuple[dict[str, str | None], ...] = ()
    if features_text is not None:
        n = max(len(items.get("roots", ())), len(items.get("repo_ids", ())))
        features = parse_mix_features(features_text, n)
    return MixOptions(items.get("roots", ()), items.get("repo_ids", ()), weights, features), rest


def parse_features(text: str, flag: str) -> dict[str, str | None]:
    """A JSON object of feature renames (``{"old": "new"}``, ``{"old": null}`` drops), checked;
    ``flag`` names the flag in messages."""
    example = '\'{"actions": "action", "state": "observation.state"}\''
    expected = 'a JSON object {"key in the dataset": "new name" or null}'
    return _feature_map(_json_flag(text, flag, expected, example), flag, example)


def _json_flag(text: str, flag: str, expected: str, example: str) -> Any:
    """``text`` parsed as JSON, or a TrainSetupError naming ``flag`` with ``example``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TrainSetupError(
            describe(
                f"{flag} is not valid JSON",
                expected=expected,
                found=f"{text!r} ({exc.msg} at character {exc.pos})",
                fix=f"{flag}={example} (single quotes around it in a shell)",
            )
        ) from None


def _feature_map(value: Any, flag: str, example: str) -> dict[str, str | None]:
    bad = not isinstance(value, dict) or any(
        v is not None and (not isinstance(v, str) or not v) for v in value.values()
    )
    if bad:
        raise TrainSetupError(
            describe(
                f"{flag} maps feature keys to new names",
                expected='a JSON object {"key in the dataset": "new name" or null (drop)}',
                found=json.dumps(value)[:160],
                fix=f"{flag}={example}",
            )
        )
    return dict(value)


def parse_mix_features(text: str, sources: int) -> tuple[dict[str, str | None], ...]:
    """``--mix.features``: a JSON list with one feature mapping (or null) per source."""
    flag = "--mix.features"
    example = '\'[{"actions": "action"}, {}]\''
    expected = "a JSON list with one object per source, in --mix.roots order"
    value = _json_flag(text, flag, expected, example)
    if not isinstance(value, list) or len(value) != sources:
        raise TrainSetupError(
            describe(
                f"{flag} needs one mapping per source",
                expected=f"a JSON list of {sources} objects (null or {{}}: keep the names)",
                found=json.dumps(value)[:160],
                fix=f"{flag}={example} for two sources",
            )
        )
    return tuple(
        _feature_map(v or {}, f"{flag} (source {i})", example) for i, v in enumerate(value)
    )


@dataclasses.dataclass(frozen=True)
class StreamOptions:
    """The ``--stream.*`` flags: how a stream orders its frames (None: not given).

    Attributes:
        interleave: ``--stream.interleave=N``, chunks open at once per stream
            (``StreamTuning.interleave``, the interleave order).
        interleave_order: ``--stream.interleave_order=spread|rounds|random``
            (``StreamTuning.interleave_order``).
        order: ``--stream.order=shuffle|interleave`` (``StreamTuning.order``).
        shuffle_frames: ``--stream.shuffle_frames=N``, frames per shuffle window
            (``StreamTuning.shuffle_frames``).
    """

    interleave: int | None = None
    interleave_order: str | None = None
    order: str | None = None
    shuffle_frames: int | None = None

    def __post_init__(self) -> None:
        if self.order is not None and self.order not in ORDERS:
            raise TrainSetupError(
                describe(
                    "Unknown --stream.order",
                    expected=" or ".join(ORDERS),
                    found=self.order,
                    fix="--stream.order=shuffle (the default) or --stream.order=interleave",
                )
            )
        if self.shuffle_frames is not None and self.shuffle_frames < 1:
            raise TrainSetupError(
                describe(
                    "--stream.shuffle_frames must be at least 1",
                    found=self.shuffle_frames,
                    fix="--stream.shuffle_frames=1024",
                )
            )
        if self.interleave is not None and self.interleave < 1:
            raise TrainSetupError(
                describe(
                    "--stream.interleave must be at least 1",
                    found=self.interleave,
                    fix="--stream.interleave=32 (1: no interleave, consecutive frames)",
                )
            )
        if self.interleave_order is not None and self.interleave_order not in INTERLEAVE_ORDERS:
            raise TrainSetupError(
                describe(
                    "Unknown --stream.interleave_order",
                    expected=" or ".join(INTERLEAVE_ORDERS),
                    found=self.interleave_order,
                    fix="--stream.interleave_order=spread",
                )
            )

    def given(self) -> dict[str, Any]:
        """The flags that were given, as ``StreamTuning`` keyword arguments."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def split_stream_args(argv: Sequence[str]) -> tuple[StreamOptions | None, list[str]]:
    """Split ``argv`` into the ``--stream.*`` flags (None if absent) and the other flags."""
    own, rest = own_flags(argv, _STREAM_PREFIX, _STREAM_FLAGS)
    if not own:
        return None, rest
    own = {k: v.strip() for k, v in own.items()}
    numbers: dict[str, int] = {}
    for name, example in (("interleave", 32), ("shuffle_frames", 1024)):
        if name in own:
            try:
                numbers[name] = int(own[name])
            except ValueError:
                raise TrainSetupError(
                    describe(
                        f"--stream.{name} must be a whole number",
                        found=own[name],
                        fix=f"--stream.{name}={example}",
                    )
                ) from None
    return (
        StreamOptions(
            interleave=numbers.get("interleave"),
            interleave_order=own.get("interleave_order"),
            order=own.get("order"),
            shuffle_frames=numbers.get("shuffle_frames"),
        ),
        rest,
    )


def resolve_stream(
    flags: StreamOptions | None, saved: dict[str, Any] | None, batch_size: int
) -> dict[str, Any]:
    """The ``StreamTuning`` keyword arguments (order, window, interleave) of a ``robo-resume
    train`` run.

    ``saved``: the options of the checkpoint resumed from (None: a new run, or a checkpoint of
    plain lerobot-train, whose data starts anew). A checkpoint's own order is kept (its data
    state was saved with it; one written before ``--stream.*`` existed has
    :data:`LEGACY_STREAM`, one written before ``--stream.order`` existed the interleave order
    with its interleave settings). A new run gets the library's default, the shuffle order,
    which trains close to lerobot's shuffled sampler (docs/training-quality.md). Flags given
    replace those values (an interleave flag alone chooses the interleave order, as in
    ``StreamTuning``); on a resume, other values than the checkpoint's are refused by the data
    state's fingerprint. ``batch_size`` is not used (kept for callers).
    """
    del batch_size
    if saved is not None:
        base = dict(saved.get("stream") or LEGACY_STREAM)
        base.setdefault("order", "interleave")  # written before the shuffle order existed
    else:  # the window is written down: a later default must not change a saved run's order
        base = {"order": "shuffle", "shuffle_frames": SHUFFLE_FRAMES}
    if flags is not None:
        given = flags.given()
        if "order" not in given and {"interleave", "interleave_order"} & set(given):
            given["order"] = "interleave"
        if given.get("order", base.get("order")) == "interleave":
            base.pop("shuffle_frames", None)
        else:
            base.pop("interleave", None)
            base.pop("interleave_order", None)
        base.update(given)
    return base


def stream_line(tuning: dict[str, Any]) -> str:
    """The log line that says which order a run's streams use (``tuning``: from
    :func:`resolve_stream`)."""
    from ..stream.tuning import StreamTuning

    t = StreamTuning(**tuning)
    if t.resolved_order == "shuffle":
        return (
            f"streams shuffle windows of {t.shuffle_frames} frames of short chunks drawn from the "
            "whole dataset: trains close to lerobot's shuffled sampler "
            "(robo_resume docs/training-quality.md)"
        )
    return (
        f"streams interleave {t.interleave} open chunks ({t.interleave_order}): faster, but "
        "consecutive batches share their chunks and a policy learns measurably worse than on "
        "lerobot's shuffled sampler (robo_resume docs/training-quality.md); --stream.order="
        "shuffle for the default"
    )


def check_config_path(args: Sequence[str]) -> None:
    """A local ``--config_path`` that does not exist: our error before lerobot's traceback."""
    value = None
    for i, a in enumerate(args):
        if a.startswith("--config_path="):
            value = a.split("=", 1)[1]
        elif a == "--config_path" and i + 1 < len(args):
            value = args[i + 1]
    if not value:
        return
    path = Path(value)
    local = path.is_absolute() or value.startswith(".") or value.endswith((".json", ".yaml"))
    if local and not path.exists():
        hint = ""
        for parent in path.parents:
            if parent.name == "checkpoints" and parent.is_dir():
                names = sorted(p.name for p in parent.iterdir() if not p.name.startswith("."))
                hint = f" ({parent} holds: {', '.join(names) or 'nothing'})"
                if not names:
                    no_checkpoint_yet(path, parent)
                break
        raise TrainSetupError(
            describe(
                "Cannot resume: the checkpoint named by --config_path is missing",
                found=f"no file {path}{hint}",
                fix="pass --config_path=OUTPUT_DIR/checkpoints/last/pretrained_model/"
                "train_config.json of the run to resume (`ls OUTPUT_DIR/checkpoints`)",
            )
        )


def no_checkpoint_yet(path: Path, checkpoints: Path) -> None:
    """Raise for a resume from ``checkpoints``, a folder without any complete checkpoint (the
    run was stopped before or during its first save), with the way forward: a fresh start."""
    partial = sorted(p.name for p in checkpoints.iterdir() if ".partial-" in p.name)
    found = f"no file {path}: {checkpoints} holds no complete checkpoint"
    if partial:
        found += f", only {', '.join(partial)} (a save that was interrupted)"
    raise TrainSetupError(
        describe(
            "Cannot resume: the run has no complete checkpoint yet",
            found=found,
            fix="start the run fresh: the command that started it (the same flags and "
            f"--output_dir={checkpoints.parent}), without --resume and --config_path. An output "
            "directory without a complete checkpoint is accepted, and the partial folder is "
            "removed",
        )
    )


def require_lerobot() -> None:
    try:
        import lerobot
        import lerobot.datasets  # needs lerobot[dataset]
    except ImportError as exc:
        raise TrainSetupError(
            describe(
                "robo-resume train needs lerobot 0.6 with its dataset and training extras",
                found=f"ImportError: {exc}",
                fix='pip install "robo_resume[lerobot]" (lerobot[dataset,training]>=0.6.1,<0.7)',
            )
        ) from exc
    version = tuple(int(x) for x in lerobot.__version__.split(".")[:2] if x.isdigit())
    if version < MIN_LEROBOT:
        raise TrainSetupError(
            describe(
                "robo-resume train drives lerobot 0.6's trainer pieces",
                expected="lerobot >= 0.6",
                found=f"lerobot {lerobot.__version__}",
                fix='pip install "robo_resume[lerobot]"',
            )
        )
