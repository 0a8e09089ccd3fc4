"""``robo-resume train``'s own flags (``--mix.*``), the checkpoint file names, and checks made
before lerobot is imported (a missing ``--config_path``, lerobot's version)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import RoboResumeError, describe

DATA_DIR = "robo_resume"  # inside a checkpoint's training_state/
DATA_STATE = "data_state.json"
OPTIONS = "options.json"
RNG_RANK = "rng_state_rank{rank}.safetensors"
INDEX_LOG_ENV = "ROBO_RESUME_TRAIN_INDEX_LOG"
MIN_LEROBOT = (0, 6)
_OWN_PREFIX = "--mix."


class TrainSetupError(RoboResumeError, ValueError):
    """A ``robo-resume train`` invocation that cannot run: a flag, a checkpoint or the setup."""


@dataclasses.dataclass(frozen=True)
class MixOptions:
    """The ``--mix.*`` flags: several datasets, drawn by weight (empty: one dataset).

    Attributes:
        roots: dataset folders, one per source.
        repo_ids: Hub ids, one per source (instead of, or beside, ``roots``).
        weights: one positive weight per source (default: all 1).
    """

    roots: tuple[str, ...] = ()
    repo_ids: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()

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
        """One ``{"root", "repo_id", "weight"}`` per source."""
        n = max(len(self.roots), len(self.repo_ids))
        return [
            {
                "root": self.roots[i] if self.roots else None,
                "repo_id": self.repo_ids[i] if self.repo_ids else None,
                "weight": float(self.weights[i]) if self.weights else 1.0,
            }
            for i in range(n)
        ]

    def to_dict(self) -> dict[str, list]:
        """JSON-safe form (saved in every checkpoint)."""
        return {
            "roots": list(self.roots),
            "repo_ids": list(self.repo_ids),
            "weights": list(self.weights),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MixOptions:
        """Inverse of :meth:`to_dict`."""
        return cls(
            roots=tuple(data.get("roots") or ()),
            repo_ids=tuple(data.get("repo_ids") or ()),
            weights=tuple(float(w) for w in data.get("weights") or ()),
        )


def split_args(argv: Sequence[str]) -> tuple[MixOptions | None, list[str]]:
    """Split ``argv`` into the ``--mix.*`` flags (None if absent) and lerobot-train's flags."""
    own: dict[str, str] = {}
    rest: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith(_OWN_PREFIX):
            name, eq, value = a[len(_OWN_PREFIX) :].partition("=")
            if not eq:
                if i + 1 >= len(args):
                    raise TrainSetupError(describe(f"{a} needs a value", fix=f"{a}=VALUE"))
                value, i = args[i + 1], i + 1
            if name not in ("roots", "repo_ids", "weights"):
                raise TrainSetupError(
                    describe(
                        f"Unknown flag {a.split('=')[0]}",
                        expected="--mix.roots, --mix.repo_ids or --mix.weights",
                        found=a,
                        fix="see `robo-resume train --help` and the README's lerobot section",
                    )
                )
            own[name] = value
        else:
            rest.append(a)
        i += 1
    if not own:
        return None, rest
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
    return MixOptions(items.get("roots", ()), items.get("repo_ids", ()), weights), rest


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
                break
        raise TrainSetupError(
            describe(
                "Cannot resume: the checkpoint named by --config_path is missing",
                found=f"no file {path}{hint}",
                fix="pass --config_path=OUTPUT_DIR/checkpoints/last/pretrained_model/"
                "train_config.json of the run to resume (`ls OUTPUT_DIR/checkpoints`)",
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
