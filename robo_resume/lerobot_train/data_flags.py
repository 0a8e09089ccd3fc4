"""``robo-resume train``'s ``--data.*`` flags and its reading of ``--dataset.episodes``.

The library's data options (``ChunkedEpisodeDataset(on_error=..., resume_strict=...)``,
``DataSource(features=...)``, ``episodes=``) as flags, parsed before lerobot's parser sees
the rest, as the ``--mix.*`` and ``--stream.*`` flags are (:mod:`.options`):

- ``--data.on_error=raise|skip``;
- ``--data.resume_strict=true|false``;
- ``--data.features='{"actions": "action", "depth": null}'`` (JSON: rename, or drop with null);
- ``--dataset.episodes=``: lerobot's own flag, read here first so that it also takes what
  robo_resume's ``episodes=`` takes: ``[0,1,2]`` (lerobot's form), indices and ranges
  (``0-9,12``), a slice string (``train[:90%]``) or ``readable`` (the episodes whose files all
  exist and open). A list of indices is handed on to lerobot's parser (it goes into
  ``train_config.json``); the other forms are resolved once the dataset is known
  (:func:`resolve_episodes`) and the resulting list is put into the config, so a resume of
  the run uses the very same episodes.

:func:`cli_advice` turns the Python advice of the library's messages (``on_error='skip'``,
``episodes=[...]``, ``resume_strict=False``, ``MixSource(keys=...)``) into these flags, for
messages shown by ``robo-resume train``; the library itself keeps its Python advice.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from ..errors import describe
from .options import TrainSetupError, own_flags, parse_features

DATA_PREFIX = "--data."
DATA_FLAGS = ("features", "on_error", "resume_strict")
EPISODES_FLAG = "--dataset.episodes"
READABLE = "readable"
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """The ``--data.*`` flags and a ``--dataset.episodes`` that lerobot's parser cannot take.

    Attributes:
        on_error: ``--data.on_error``: "raise" (default: a missing or broken file stops the
            run, and a file check at start refuses missing files before step 1) or "skip"
            (chunks whose files fail are skipped and logged, the run goes on).
        resume_strict: ``--data.resume_strict``: True (default) refuses a checkpoint whose data
            state was saved for other data or data options; False resumes anyway, with a
            warning per difference (frames may then be replayed or lost).
        features: ``--data.features``: ``{key in the dataset: name in batches}``, None drops
            the feature (it is never opened or decoded); unmapped keys keep their names.
        episodes: ``--dataset.episodes`` given as ``readable`` or a slice string such as
            ``train[:90%]`` (resolved by :func:`resolve_episodes`); None: not given, or given
            as indices, which lerobot's parser then holds.
        given: the ``--data.*`` flags given on the command line (``on_error``,
            ``resume_strict``, ``features``): a resume takes the others from its checkpoint
            (:meth:`resumed`).
    """

    on_error: str = "raise"
    resume_strict: bool = True
    features: dict[str, str | None] | None = None
    episodes: str | None = None
    given: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    SAVED: ClassVar[tuple[str, ...]] = ("on_error", "features")
    """The flags a checkpoint keeps (``resume_strict`` is a decision about one resume)."""

    def to_saved(self) -> dict[str, Any]:
        """What a checkpoint's ``options.json`` keeps of these flags."""
        return {k: getattr(self, k) for k in self.SAVED}

    def resumed(self, saved: Mapping[str, Any] | None) -> tuple[DataOptions, list[str]]:
        """These flags for a resume of a checkpoint whose options held ``saved`` (None: a
        checkpoint written before the flags were kept): flags not given take the saved
        values. Returns the options and one note per flag given with another value than the
        checkpoint's (the flag wins)."""
        if not saved:
            return self, []
        taken: dict[str, Any] = {}
        notes = []
        for key in self.SAVED:
            if key not in saved:
                continue
            if key not in self.given:
                taken[key] = saved[key]
            elif saved[key] != getattr(self, key):
                notes.append(
                    f"--data.{key}={json.dumps(getattr(self, key))} overrides the checkpoint's "
                    f"{json.dumps(saved[key])}"
                )
        return dataclasses.replace(self, **taken), notes

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise TrainSetupError(
                describe(
                    "Unknown --data.on_error",
                    expected="raise or skip",
                    found=self.on_error,
                    fix="--data.on_error=skip to train on without the chunks whose files fail",
                )
            )

    @property
    def readable(self) -> bool:
        """True when ``--dataset.episodes=readable`` was given."""
        return self.episodes == READABLE


def parse_episodes(text: str) -> tuple[str | None, list[int] | None]:
    """``--dataset.episodes``: ``(selection to resolve, None)`` for ``readable`` or a slice
    string, ``(None, indices)`` for ``[0,1,2]`` or ``0-9,12``."""
    text = text.strip()
    if text == READABLE:
        return READABLE, None
    if text.startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, list) and all(type(v) is int and v >= 0 for v in value):
            return None, value
    elif "[" in text and text.endswith("]"):
        return text, None
    else:
        out: list[int] = []
        try:
            for part in text.split(","):
                a, sep, b = part.strip().partition("-")
                out.extend(range(int(a), int(b) + 1) if sep and a else [int(part)])
            if out and min(out) >= 0:
                return None, out
        except ValueError:
            pass
    raise TrainSetupError(
        describe(
            "--dataset.episodes is not an episode selection",
            expected="indices [0,1,2], ranges 0-9,12, a slice string train[:90%] or readable",
            found=repr(text),
            fix="--dataset.episodes=readable (the episodes whose files all exist and open), "
            "or --dataset.episodes=[0,1,2]",
        )
    )


def split_data_args(argv: Sequence[str]) -> tuple[DataOptions, list[str]]:
    """Split ``argv`` into the ``--data.*`` flags (and a ``--dataset.episodes`` lerobot cannot
    parse) and the other flags; a list of indices goes on to lerobot as ``[0,1,...]``."""
    own, rest = own_flags(argv, DATA_PREFIX, DATA_FLAGS)
    kwargs: dict[str, Any] = {}
    if "on_error" in own:
        kwargs["on_error"] = own["on_error"].strip()
    if "resume_strict" in own:
        value = own["resume_strict"].strip().lower()
        if value not in _TRUE + _FALSE:
            raise TrainSetupError(
                describe(
                    "--data.resume_strict takes true or false",
                    found=own["resume_strict"],
                    fix="--data.resume_strict=false",
                )
            )
        kwargs["resume_strict"] = value in _TRUE
    if "features" in own:
        kwargs["features"] = parse_features(own["features"], "--data.features")
    episodes, rest = own_flags(rest, "--dataset.", ("episodes",), only=True)
    if "episodes" in episodes:
        selection, indices = parse_episodes(episodes["episodes"])
        kwargs["episodes"] = selection
        if indices is not None:
            rest.append(f"{EPISODES_FLAG}=[{','.join(map(str, indices))}]")
    return DataOptions(**kwargs, given=tuple(k for k in DATA_FLAGS if k in own)), rest


# -- the library's advice as flags ----------------------------------------------------------------
_ADVICE: tuple[tuple[str, str], ...] = (
    (
        r"pass on_error='skip' \(skips are logged and kept in the resume state\)",
        "pass --data.on_error=skip (skips are logged and kept in the checkpoint's data state), "
        "or leave the episodes out with --dataset.episodes=readable",
    ),
    (r"\(on_error='skip' skips its chunks\)", "(--data.on_error=skip skips its chunks)"),
    (r"on_error='skip'", "--data.on_error=skip"),
    (r"episodes=readable_episodes\(root\)", "--dataset.episodes=readable"),
    (
        r"pass the same root and episodes=\[\.\.\.\]",
        "pass the same --dataset.root and --dataset.episodes",
    ),
    (
        r"pass the same episodes= selection \([^)]*\)",
        "pass the same --dataset.episodes (and --dataset.eval_split)",
    ),
    (
        r"with episodes=\[\.\.\.\]",
        "with --dataset.episodes=readable (or --dataset.episodes=[0,1,...])",
    ),
    (r"episodes=\[\.\.\.\]", "--dataset.episodes=[0,1,...]"),
    (
        r"pass resume_strict=False to ChunkedEpisodeDataset \(or MixedDataset\)",
        "pass --data.resume_strict=false",
    ),
    (r"resume_strict=False", "--data.resume_strict=false"),
    (
        r"MixSource\(keys=\{'<its name>': '<mix name>'\}\), or drop a feature with "
        r"keys=\{'<its name>': None\}",
        '--mix.features=\'[{}, {"<its name>": "<mix name>"}]\' (one JSON object per source, '
        'in --mix.roots order), or drop a feature with {"<its name>": null}',
    ),
    (
        r"keys=\{'<its name>': '<mix name>'\}",
        '--mix.features=\'[{}, {"<its name>": "<mix name>"}]\' (one object per source)',
    ),
    (
        r"\(keys=\{'<name>': None\}\)",
        '(--mix.features with {"<name>": null} for every source)',
    ),
    (r"MixSource\(root, keys=\{\.\.\.\}\)", '--data.features=\'{"<its name>": "<new name>"}\''),
    (r"pass the same seed", "pass the same --seed"),
    (r"StreamTuning\(shuffle_frames=\.\.\.\)", "--stream.shuffle_frames"),
    (r"StreamTuning\(interleave_order=\.\.\.\)", "--stream.interleave_order"),
    (r"StreamTuning\(interleave=\.\.\.\)", "--stream.interleave"),
    (
        r"pass the same chunk_frames, episodes and StreamTuning\(cut_at_keyframes=\.\.\.\)",
        "pass the same --dataset.episodes and --stream.* flags",
    ),
    (r"start a new run without resume_state", "start a new run with a new --output_dir"),
    (
        r"pass the root of the dataset the run was trained on",
        "pass the --dataset.root (or --dataset.repo_id) the run was trained on",
    ),
)
_ADVICE_RE = tuple((re.compile(a), b) for a, b in _ADVICE)

PYTHON_ADVICE = (
    "on_error='skip'",
    "episodes=[...]",
    "episodes=readable_episodes",
    "resume_strict=False",
    "MixSource(",
    "keys={",
)
"""Python-only advice of the library's messages that :func:`cli_advice` rewrites."""


def cli_advice(text: str) -> str:
    """``text`` (a library message) with its Python advice as ``robo-resume train`` flags."""
    for pattern, flag in _ADVICE_RE:
        text = pattern.sub(_literal(flag), text)
    return text


def _literal(flag: str) -> Callable[[re.Match[str]], str]:
    """A ``re.sub`` replacement that inserts ``flag`` as it is (no backslash escapes)."""
    return lambda _m: flag


# -- resolving what lerobot's parser does not hold --------------------------------------------
def resolve_episodes(
    data: DataOptions,
    root: Any,
    repo_id: str | None,
    revision: str | None,
    meta: Any = None,
):
    """The episode indices of ``--dataset.episodes=readable`` or a slice string for one dataset
    (None when neither was given). ``root`` may be a remote dataset's URL (its files are
    checked over the network); ``meta``: the dataset's ``DatasetMeta`` when already read."""
    if data.episodes is None:
        return None
    from ..files import readable_episodes
    from ..hub import resolve_dataset
    from ..remote.files import is_remote, remote_meta
    from ..splits import selected_episode_array

    if meta is None and is_remote(root):
        meta = remote_meta(str(root), revision=revision if str(root).startswith("hf://") else None)
    elif meta is None:
        _, meta = resolve_dataset(repo_id if root is None else None, root=root, revision=revision)
    if data.readable:
        return list(readable_episodes(meta))
    try:
        return selected_episode_array(meta, data.episodes).tolist()
    except ValueError as exc:
        raise TrainSetupError(
            describe(
                "--dataset.episodes is not a selection of this dataset",
                found=f"{data.episodes!r}: {exc}",
                file=meta.root,
                fix="--dataset.episodes=train[:90%] (a slice by position), [0,1,2] or readable",
            )
        ) from exc


def renamed_features(features: Mapping[str, Any], mapping: Mapping[str, str | None] | None):
    """``features`` (lerobot's ``{key: feature}``) under ``mapping``'s names, dropped ones left
    out, in their order."""
    mapping = mapping or {}
    out = {}
    for k, v in features.items():
        name = mapping.get(k, k)
        if name is not None:
            out[name] = v
    return out
