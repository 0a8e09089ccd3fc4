"""``robo-resume train``'s set-up around lerobot's pieces: flags it cannot honour, the policy's
metadata (stats over a mix), processors, the robo_resume dataset, lerobot's eval split.

A dataset is streamed (read as byte ranges, nothing downloaded but ``meta/``, which the remote
layer caches: :mod:`robo_resume.remote`) when ``--dataset.root`` is a URL (``hf://``,
``s3://``, ``gs://``, ``http(s)://``) or when ``--dataset.streaming=true`` comes without a
root: then ``hf://datasets/REPO_ID`` at ``--dataset.revision`` (:func:`stream_url`). The
policy's metadata is then lerobot's ``LeRobotDatasetMetadata`` read from that cached
``meta/`` folder (:func:`streamed_meta`)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..dataset import ChunkedEpisodeDataset
from ..errors import MissingFileError, RemoteReadError, ResumeStateError, describe, format_ranges
from ..files import check_files
from ..format.metadata import DatasetMeta, load_metadata
from ..hub import resolve_dataset
from ..items.names import renamed
from ..mix import MixedDataset, MixSource
from ..reader import LeRobotReader
from ..remote.files import is_remote, remote_meta
from ..state.fingerprint import ABOUT, in_words
from ..state.resume import ResumeState
from ..stream.tuning import StreamTuning
from .checkpoints import fresh_start
from .data_flags import DataOptions, cli_advice, renamed_features, resolve_episodes
from .features import apply_mapping, check_mapping, check_policy_features
from .options import MixOptions, TrainSetupError


# -- setup helpers ---------------------------------------------------------------------------------
def validate(cfg: Any, mix: MixOptions | None = None) -> None:
    """lerobot's ``cfg.validate()``, its errors made ours, and the flags we cannot honour."""
    try:
        with fresh_start(cfg):  # a live run's directory, or one without a checkpoint
            cfg.validate()
    except TrainSetupError:
        raise  # fresh_start's, complete (it derives from ValueError, wrapped below)
    except FileExistsError as exc:
        raise TrainSetupError(
            describe(
                "The output directory exists and --resume is false",
                found=str(exc).split(" already exists")[0].replace("Output directory ", ""),
                fix="resume it with --resume=true --config_path=OUTPUT_DIR/checkpoints/last/"
                "pretrained_model/train_config.json, or choose a new --output_dir",
            )
        ) from exc
    except (FileNotFoundError, NotADirectoryError, ValueError) as exc:
        if getattr(cfg, "resume", False) or "config_path" in str(exc):
            raise TrainSetupError(
                describe(
                    "Cannot resume: the checkpoint named by --config_path is missing or incomplete",
                    found=f"{type(exc).__name__}: {exc}",
                    fix="pass --config_path=OUTPUT_DIR/checkpoints/last/pretrained_model/"
                    "train_config.json of the run to resume (`ls OUTPUT_DIR/checkpoints`)",
                )
            ) from exc
        raise
    if cfg.resume:
        ckpt = Path(cfg.checkpoint_path)
        if not (ckpt / "training_state").is_dir():
            raise TrainSetupError(
                describe(
                    "Cannot resume: the checkpoint has no training_state folder",
                    expected=f"{ckpt}/training_state (written with every checkpoint)",
                    found="no such folder",
                    fix="point --config_path at a complete checkpoint, e.g. "
                    "OUTPUT_DIR/checkpoints/last/pretrained_model/train_config.json",
                )
            )
    refuse = []
    if getattr(cfg, "is_reward_model_training", False):
        refuse.append(("--reward_model.*", "robo-resume train trains policies"))
    if cfg.dataset.streaming and mix is not None:
        refuse.append(
            (
                "--dataset.streaming=true with --mix.*",
                "give the remote sources as URLs, --mix.roots=hf://datasets/ORG/A,s3://BUCKET/B "
                "(a URL root streams without the flag)",
            )
        )
    if cfg.dataset.streaming and getattr(cfg.dataset, "repo_type", "dataset") != "dataset":
        refuse.append(
            (
                f"--dataset.repo_type={cfg.dataset.repo_type}",
                "stream a dataset repo (--dataset.repo_type=dataset), or an object store URL "
                "as --dataset.root=s3://...",
            )
        )
    url = stream_url(cfg)
    if url is not None and not url.startswith("hf://") and cfg.dataset.revision:
        from ..remote.store import redact_url

        refuse.append(
            (
                f"--dataset.revision={cfg.dataset.revision} with --dataset.root={redact_url(url)}",
                "a revision names a commit of a Hub dataset: drop --dataset.revision (point "
                "--dataset.root at an immutable copy instead)",
            )
        )
    if getattr(cfg.dataset, "eval_split", 0.0) and mix is not None:
        refuse.append(
            (
                f"--dataset.eval_split={cfg.dataset.eval_split} with --mix.*",
                "hold episodes out per source (a seeded split, robo_resume.splits) instead",
            )
        )
    if mix is not None and getattr(cfg.dataset, "episodes", None):
        refuse.append(
            (
                "--dataset.episodes=[...] with --mix.*",
                "a mix trains every episode of each source: drop --dataset.episodes, or pass "
                "--dataset.episodes=readable (each source's readable episodes)",
            )
        )
    if getattr(cfg, "env", None) is not None and getattr(cfg, "env_eval_freq", 0) > 0:
        refuse.append(("--env.*", "evaluate the checkpoints with lerobot-eval"))
    if getattr(cfg, "sample_weighting", None) is not None:
        refuse.append(("--sample_weighting.*", "not wired into robo-resume train yet"))
    if refuse:
        flag, fix = refuse[0]
        raise TrainSetupError(
            describe(
                f"robo-resume train does not support {flag}",
                found=", ".join(f for f, _ in refuse),
                fix=fix,
            )
        )


def stream_url(cfg: Any) -> str | None:
    """The URL ``robo-resume train`` streams its dataset from, or None (a local folder, or a
    Hub snapshot downloaded by :func:`robo_resume.hub.resolve_dataset`).

    ``--dataset.root`` when it is a URL (``hf://``, ``s3://``, ``gs://``, ``http(s)://``), with
    or without ``--dataset.streaming``; else ``hf://datasets/REPO_ID`` when
    ``--dataset.streaming=true`` comes without ``--dataset.root``. A local root with
    ``--dataset.streaming=true`` is read in place (robo_resume streams every dataset).
    """
    root = cfg.dataset.root
    if root is not None:
        return str(root) if is_remote(str(root)) else None
    if cfg.dataset.streaming and isinstance(cfg.dataset.repo_id, str):
        return f"hf://datasets/{cfg.dataset.repo_id}"
    return None


def dataset_root(cfg: Any) -> Any:
    """The root the dataset is opened from: :func:`stream_url`, else ``--dataset.root``
    (None: ``--dataset.repo_id`` is downloaded)."""
    return stream_url(cfg) or cfg.dataset.root


def stream_revision(cfg: Any) -> str | None:
    """The Hub revision of a streamed ``hf://`` dataset (``--dataset.revision``, else one
    written in the URL as ``@REV``); None for other URLs."""
    url = stream_url(cfg)
    if url is None or not url.startswith("hf://"):
        return None
    if cfg.dataset.revision:
        return str(cfg.dataset.revision)
    return url.rstrip("/").partition("@")[2] or None


def streamed_meta(cfg: Any) -> DatasetMeta | None:
    """The metadata of the streamed dataset (:func:`stream_url`; None when it is not streamed):
    ``meta/`` fetched into the remote cache once per version, data and video files served as
    byte ranges (:func:`robo_resume.remote.files.remote_meta`).

    Raises:
        TrainSetupError: the repo, revision or URL cannot be read; the message names the repo,
            the revision and the endpoint (or the URL) and the flags to fix.
    """
    url = stream_url(cfg)
    if url is None:
        return None
    revision = stream_revision(cfg)
    try:
        return remote_meta(url, revision=revision)
    except (RemoteReadError, MissingFileError) as exc:
        raise TrainSetupError(stream_refusal(url, revision, exc)) from exc
    except ValueError as exc:  # an hf:// URL whose repo id is not ORG/NAME
        if "Not a Hub dataset URL" not in str(exc):
            raise
        raise TrainSetupError(stream_refusal(url, revision, exc)) from exc


def stream_refusal(url: str, revision: str | None, exc: BaseException) -> str:
    """The message of a streamed dataset that cannot be opened: what (the repo and revision on
    the endpoint, or the URL), the remote layer's error, the flags and variables to fix."""
    from ..remote.hub import hub_endpoint
    from ..remote.store import redact_url

    text = str(exc)
    if not url.startswith("hf://"):
        shown = redact_url(url)
        return describe(
            f"Cannot stream the dataset at {shown}",
            expected="a LeRobot dataset root (the folder holding meta/info.json)",
            found=f"{type(exc).__name__}: {text}",
            fix="check --dataset.root (the URL of the dataset's root folder) and the "
            "credentials of its store (docs/remote.md, Credentials: AWS_* or AWS_PROFILE, "
            "AWS_ENDPOINT_URL, GOOGLE_APPLICATION_CREDENTIALS)",
        )
    repo = url.removeprefix("hf://datasets/").rstrip("/").partition("@")[0]
    rev = revision or "main"
    endpoint = hub_endpoint()
    if "RevisionNotFound" in text:
        what = f"The Hub at {endpoint} has no revision {rev!r} of the dataset repo {repo!r}"
    elif "RepositoryNotFound" in text:
        what = (
            f"The Hub at {endpoint} has no dataset repo {repo!r} (revision {rev!r}) that this "
            "account can read"
        )
    else:
        what = f"Cannot stream the dataset repo {repo!r} at revision {rev!r} from {endpoint}"
    return describe(
        what,
        expected="--dataset.repo_id=ORG/NAME of a LeRobot dataset repo on that endpoint and "
        "--dataset.revision a branch, tag or commit of it (default main)",
        found=f"{type(exc).__name__}: {text}",
        fix=f"check --dataset.repo_id={repo} and --dataset.revision={rev} (LeRobot datasets "
        "publish tags such as v3.0); HF_ENDPOINT names the endpoint; a private or gated "
        "dataset needs HF_TOKEN (or `hf auth login`)",
    )


def remote_roots(cfg: Any, mix: MixOptions | None) -> list[str]:
    """The URLs of the datasets this run streams (the dataset's, or each remote mix source's)."""
    if mix is None:
        url = stream_url(cfg)
        return [url] if url else []
    return [str(s["root"]) for s in mix.sources() if s["root"] and is_remote(str(s["root"]))]


def check_worker_context(cfg: Any, mix: MixOptions | None) -> None:
    """Refuse ``--dataloader_multiprocessing_context=fork`` with workers for a streamed
    dataset (the network client of its store does not survive a fork,
    :mod:`robo_resume.workers`) with a :class:`TrainSetupError`, before anything is built.
    lerobot's default, ``spawn``, and ``null`` (robo_resume's forkserver) work."""
    urls = remote_roots(cfg, mix)
    context = cfg.dataloader_multiprocessing_context
    if not urls or cfg.num_workers <= 0 or context != "fork":
        return
    from ..remote.store import redact_url

    raise TrainSetupError(
        describe(
            "--dataloader_multiprocessing_context=fork cannot start the DataLoader workers of "
            "a streamed dataset: the network client of its store (obstore's runtime) does not "
            "survive a fork, and forked workers would hang on their first read",
            expected="--dataloader_multiprocessing_context=spawn (lerobot's default) or "
            "forkserver, or null (robo_resume's forkserver)",
            found=f"--dataloader_multiprocessing_context=fork with --num_workers="
            f"{cfg.num_workers} for {', '.join(redact_url(u) for u in urls)}",
            fix="drop --dataloader_multiprocessing_context (spawn), or pass "
            "--dataloader_multiprocessing_context=forkserver, or --num_workers=0",
        )
    )


def resolve_mix(flags: MixOptions | None, saved: dict[str, Any] | None) -> MixOptions | None:
    saved_mix = MixOptions.from_dict(saved["mix"]) if saved and saved.get("mix") else None
    if flags is None:
        return saved_mix if saved_mix and saved_mix.enabled else None
    return flags if flags.enabled else None


RESUME_STRICT_RISK = (
    "--data.resume_strict=false: the checkpoint's data state is used even where it was saved "
    "for another dataset, other episodes, another seed or other --stream.* options; its "
    "cursors then point into other data, so frames can be trained on twice or never, "
    "silently (each difference found is logged below)"
)


def resolve_data(
    cfg: Any,
    mix: MixOptions | None,
    data: DataOptions,
    log: logging.Logger | None,
    source_meta: DatasetMeta | None = None,
) -> MixOptions | None:
    """Apply the ``--data.*`` flags that change the config or the mix: a ``--dataset.episodes``
    of ``readable`` or a slice string resolved to indices (into ``cfg.dataset.episodes``,
    which ``train_config.json`` keeps for the resume; in a mix, ``readable`` per source into
    the mix options, which the checkpoint keeps), and the ``--data.resume_strict=false``
    warning (``log``: None on the other ranks). ``source_meta``: the streamed dataset's
    metadata (:func:`streamed_meta`; None: read here when needed). Returns the mix options."""
    if mix is not None and data.features:
        raise TrainSetupError(
            describe(
                "--data.features renames the features of one dataset, and this is a mix",
                found=f"--data.features with {len(mix.sources())} sources",
                fix="give one mapping per source with --mix.features='[{...}, {...}]' (in "
                "--mix.roots order)",
            )
        )
    if not data.resume_strict and log is not None:
        log.warning(
            RESUME_STRICT_RISK
            if cfg.resume
            else "--data.resume_strict=false has no effect "
            "on a new run (it only applies to --resume=true)"
        )
    if data.episodes is None:
        return mix
    if mix is None:
        chosen = resolve_episodes(
            data, dataset_root(cfg), cfg.dataset.repo_id, cfg.dataset.revision, source_meta
        )
        cfg.dataset.episodes = chosen
        if log is not None:
            log.info(
                "--dataset.episodes=%s: %d episodes (%s)",
                data.episodes,
                len(chosen),
                format_ranges(chosen, limit=120),
            )
        return None
    if not data.readable:
        raise TrainSetupError(
            describe(
                f"--dataset.episodes={data.episodes} with --mix.*",
                expected="--dataset.episodes=readable (each source's readable episodes), or no "
                "--dataset.episodes (every episode of each source)",
                found=data.episodes,
                fix="--dataset.episodes=readable, or drop --dataset.episodes",
            )
        )
    episodes = []
    for s in mix.sources():
        chosen = resolve_episodes(data, s["root"], s["repo_id"], None)
        episodes.append(chosen)
        if log is not None:
            log.info(
                "--dataset.episodes=readable: %d episodes of %s (%s)",
                len(chosen),
                s["root"] or s["repo_id"],
                format_ranges(chosen, limit=120),
            )
    return dataclasses.replace(mix, episodes=tuple(episodes))


def policy_metadata(
    cfg: Any,
    mix: MixOptions | None,
    data: DataOptions | None = None,
    source_meta: DatasetMeta | None = None,
) -> Any:
    """lerobot's ``LeRobotDatasetMetadata`` the policy is built from (stats over a mix), its
    features renamed by ``--data.features`` (or the first source's ``--mix.features``) and
    checked against what the policy reads (:func:`~.features.check_policy_features`).

    A streamed dataset's (:func:`stream_url`; ``source_meta``, else fetched here) is read from
    the remote cache's copy of its ``meta/`` (features, stats, fps, episodes): nothing of
    ``data/`` or ``videos/`` is fetched, and lerobot downloads nothing."""
    from lerobot.datasets import LeRobotDatasetMetadata
    from lerobot.utils.constants import IMAGENET_STATS

    if mix is not None:
        first = mix.sources()[0]
        if cfg.dataset.root is None and first["root"] is not None:
            cfg.dataset.root = first["root"]
    root = dataset_root(cfg)
    meta_root = root
    if root is not None and is_remote(str(root)):
        streamed = source_meta or streamed_meta(cfg)
        assert streamed is not None
        meta_root = streamed.root  # the cached meta/ folder: lerobot reads it, fetches nothing
    try:
        meta = LeRobotDatasetMetadata(
            cfg.dataset.repo_id, root=meta_root, revision=cfg.dataset.revision
        )
    except Exception as exc:
        if type(exc).__name__ == "BackwardCompatibilityError":
            raise TrainSetupError(
                describe(
                    "lerobot 0.6 builds the policy from v3.0 metadata only, and this dataset "
                    "is in an older format",
                    found=str(exc).strip().splitlines()[0],
                    file=root,
                    fix="convert it (python -m lerobot.scripts.convert_dataset_v21_to_v30), or, "
                    "in a mix, name a v3.0 dataset first in --mix.roots (the other sources may "
                    "be v2.1)",
                )
            ) from exc
        raise TrainSetupError(
            describe(
                "lerobot could not read the dataset's metadata",
                found=f"{type(exc).__name__}: {exc}",
                file=root,
                fix="check --dataset.repo_id and --dataset.root (a folder holding meta/info.json, "
                "or its URL)",
            )
        ) from exc
    if mix is not None:
        sources = mix.sources()
        mapping, flag = sources[0]["features"], "--mix.features"
        others = [s["features"] for s in sources[1:]]
    else:
        mapping, flag, others = (data.features if data else None) or {}, "--data.features", None
    original = dict(meta.features)
    check_mapping(original, mapping, flag, meta_root)
    apply_mapping(meta, mapping)
    check_policy_features(cfg, meta, mapping, original, flag, others)
    if mix is not None and len(mix.sources()) > 1:
        from lerobot.datasets.compute_stats import aggregate_stats

        stats = [meta.stats]
        for s in mix.sources()[1:]:  # robo_resume reads v2.1 sources too, lerobot 0.6 does not
            if s["root"] is not None and is_remote(str(s["root"])):
                other = remote_meta(str(s["root"]))  # meta/ only, cached
            elif s["root"] is not None and (Path(s["root"]) / "meta").is_dir():
                other = load_metadata(s["root"])
            else:
                other = resolve_dataset(s["repo_id"], root=s["root"])[1]
            stats.append(stats_arrays(renamed_features(other.stats, s["features"])))
        meta.stats = aggregate_stats(stats)
    if cfg.dataset.use_imagenet_stats:
        depth = set(getattr(meta, "depth_keys", ()) or ())
        for key in meta.camera_keys:
            if key in depth:
                continue
            for name, value in IMAGENET_STATS.items():
                meta.stats[key][name] = torch.tensor(value, dtype=torch.float32)
    return meta


def stats_arrays(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """stats.json values (nested lists) as numpy arrays, as lerobot's metadata holds them."""
    import numpy as np

    return {k: {n: np.asarray(v) for n, v in d.items()} for k, d in stats.items()}


def processors(cfg: Any, policy: Any, meta: Any, device: torch.device):
    """lerobot-train's processor set-up (fresh, from a pretrained policy, or on resume)."""
    from lerobot.policies import make_pre_post_processors

    active = cfg.trainable_config
    path = active.pretrained_path
    kwargs: dict[str, Any] = {}
    if (path and not cfg.resume) or not path:
        kwargs["dataset_stats"] = meta.stats
    if path is not None:
        pre = {
            "device_processor": {"device": device.type},
            "normalizer_processor": {
                "features": {**policy.config.input_features, **policy.config.output_features},
                "norm_map": policy.config.normalization_mapping,
            },
            "rename_observations_processor": {"rename_map": cfg.rename_map},
        }
        post = {
            "unnormalizer_processor": {
                "features": policy.config.output_features,
                "norm_map": policy.config.normalization_mapping,
            },
        }
        if not cfg.resume:
            pre["normalizer_processor"]["stats"] = meta.stats
            post["unnormalizer_processor"]["stats"] = meta.stats
        kwargs["preprocessor_overrides"] = pre
        kwargs["postprocessor_overrides"] = post
    return make_pre_post_processors(
        policy_cfg=cfg.policy,
        pretrained_path=path,
        pretrained_revision=getattr(cfg.policy, "pretrained_revision", None),
        **kwargs,
    )


def image_transforms(cfg: Any) -> Callable | None:
    if not cfg.dataset.image_transforms.enable:
        return None
    from lerobot.transforms import ImageTransforms

    return ImageTransforms(cfg.dataset.image_transforms)


def build_dataset(
    cfg: Any,
    mix: MixOptions | None,
    meta: Any,
    state: dict[str, Any] | None,
    resume_dir: Path | None,
    episodes: list[int] | None = None,
    tuning: dict[str, Any] | None = None,
    data: DataOptions | None = None,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    source_meta: DatasetMeta | None = None,
) -> tuple[Any, str | None]:
    """The robo_resume dataset for ``cfg`` and, on resume, a note on what is not exact.

    ``tuning``: ``StreamTuning`` keyword arguments (:func:`~robo_resume.lerobot_train.options.
    resolve_stream`; None: the library's defaults). ``data``: the ``--data.*`` flags (on_error,
    resume_strict, features; None: the defaults). A checkpoint whose data state does not fit
    is refused with a :class:`~robo_resume.errors.ResumeStateError` that says what differs
    (:func:`refusal`). ``rank``, ``world_size``: the dataset's place in the run (None: from
    ``torch.distributed``, as training does; ``robo-resume plan`` builds each rank's).
    ``source_meta``: the streamed dataset's metadata (:func:`streamed_meta`), so that the data
    is read at the commit the policy's metadata came from (None: opened here)."""
    from lerobot.datasets.factory import resolve_delta_timestamps

    data = data or DataOptions()
    delta = resolve_delta_timestamps(cfg.trainable_config, meta)
    common: dict[str, Any] = {
        "batch_size": cfg.batch_size,
        "seed": cfg.seed or 0,
        "delta_timestamps": delta,
        "image_transforms": image_transforms(cfg),
        "image_dtype": "uint8",  # lerobot's trainer: return_uint8=True, converted per batch
        "tuning": StreamTuning(**tuning) if tuning else None,
        "on_error": data.on_error,
        "rank": rank,
        "world_size": world_size,
    }
    note = None
    if resume_dir is not None and state is None:
        note = (
            f"the checkpoint {resume_dir} has no robo_resume data state (written by plain "
            "lerobot-train, or before robo-resume train): the policy, optimizer, scheduler, step "
            "and RNG state resume exactly, but the data starts a new robo_resume epoch 0, so "
            "frames that the interrupted run already trained on in its last epoch can be seen "
            "again, and others only in the next epoch. Checkpoints written from now on resume "
            "the data exactly."
        )
    ds: ChunkedEpisodeDataset | MixedDataset
    if mix is None:
        # built without the state, which is then checked: a refusal can say what differs
        root = dataset_root(cfg)
        ds = ChunkedEpisodeDataset(
            root,
            repo_id=None if root else cfg.dataset.repo_id,
            revision=stream_revision(cfg) if is_remote(root) else cfg.dataset.revision,
            meta=source_meta if is_remote(root) else None,
            episodes=episodes if episodes is not None else cfg.dataset.episodes,
            features=data.features or None,
            infinite=True,
            **common,
        )
        try:
            ds.use_resume_state(state, strict=data.resume_strict)
        except ResumeStateError as exc:
            raise ResumeStateError(refusal(exc, resume_dir, state, ds.fingerprint)) from exc
        return ds, note
    sources = [
        MixSource(
            root=s["root"],
            repo_id=s["repo_id"],
            weight=s["weight"],
            features=s["features"] or None,
            episodes=s["episodes"],
        )
        for s in mix.sources()
    ]
    try:
        ds = MixedDataset(
            sources,
            exhausted="cycle",
            resume_state=state,
            resume_strict=data.resume_strict,
            **common,
        )
    except ResumeStateError as exc:
        raise ResumeStateError(refusal(exc, resume_dir, None, None)) from exc
    return ds, note


_DIFFERS = {
    "dataset": "another dataset (--dataset.root / --dataset.repo_id)",
    "total_frames": "other episodes (--dataset.episodes, --dataset.eval_split)",
    "episodes": "other episodes (--dataset.episodes, --dataset.eval_split)",
    "plan": "other chunks (they follow the episodes and the --stream.* order)",
    "seed": "another --seed",
    "order": "another --stream.order",
    "shuffle_frames": "another --stream.shuffle_frames",
    "interleave": "another --stream.interleave",
    "interleave_order": "another --stream.interleave_order",
    "weights": "other --mix.weights",
    "sources": "other --mix.roots / --mix.repo_ids",
    "keys": "other --mix.features",
}


def refusal(
    exc: ResumeStateError,
    resume_dir: Path | None,
    state: dict[str, Any] | None,
    fingerprint: dict[str, Any] | None,
) -> str:
    """The message of a refused resume under ``robo-resume train``: what differs between this
    run and the checkpoint's (in words, from the fingerprints' readable ``about`` part when
    ``state`` and ``fingerprint`` are given, else from the library's message), the library's
    message with its advice as flags, and the fixes."""
    diff: list[str] = []
    words = ""
    if state is not None and fingerprint is not None:
        try:
            saved = ResumeState.from_dict(state)
        except ResumeStateError:
            saved = None
        if saved is not None:
            expected = dict(fingerprint)
            if saved.batch_size is not None:  # elastic: another batch size is fine
                expected["batch_size"] = saved.batch_size
            diff = saved.mismatches(expected)
            words = in_words(diff, expected, saved.fingerprint) if ABOUT in expected else ""
    if not diff:
        diff = [k for k in _DIFFERS if f"different '{k}'" in str(exc)]
    what = []
    causes = {"episodes", "order", "interleave", "shuffle_frames"} & set(diff)
    for key in [k for k in diff if not (causes and k in ("plan", "total_frames"))]:
        text = _DIFFERS.get(key, f"another {key}")
        if text not in what:
            what.append(text)
    if "dataset" not in diff and diff:
        head = f"the same dataset with {' and '.join(what)}"
    else:
        head = " and ".join(what) or "other data or data options"
    return describe(
        f"Cannot resume: the checkpoint {resume_dir} holds the data state of a run on {head}",
        expected="this run's dataset, episodes, seed and --stream.* / --mix.* options, as the "
        "checkpoint saved them",
        found=f"this run vs the checkpoint: {words}" if words else None,
        fix="resume with the checkpoint's values (its pretrained_model/train_config.json holds "
        "--dataset.*, --seed and the rest; its --stream.* and --mix.* values are in "
        "training_state/robo_resume/options.json, used when no --stream.* flag is given), or "
        "start a new run "
        "with a new --output_dir; or pass --data.resume_strict=false to resume anyway, "
        "accepting that frames may be replayed or lost",
    ) + ("" if words else f" The data state's own check: {cli_advice(str(exc))}")


def check_files_at_start(dataset: ChunkedEpisodeDataset | MixedDataset) -> None:
    """Before step 1: every file the selected episodes need exists and opens
    (:func:`~robo_resume.files.check_files`, nothing decoded), else a :class:`TrainSetupError`
    naming the files and the flags that train on anyway."""
    parts = getattr(dataset, "datasets", None) or [dataset]
    mixed = len(parts) > 1 or hasattr(dataset, "datasets")
    for i, ds in enumerate(parts):
        result = check_files(ds.meta, ds.episodes)
        if not result.problems:
            continue
        listed = "; ".join(
            f"{p.problem} {p.path} (episode{'s' if len(p.episodes) > 1 else ''} "
            f"{format_ranges(p.episodes, limit=40)})"
            for p in result.problems[:8]
        )
        more = len(result.problems) - 8
        raise TrainSetupError(
            describe(
                f"{len(result.problems)} file(s) that the training episodes need are missing or "
                f"unreadable" + (f" in source {i} of the mix" if mixed else ""),
                expected="every data and video file that meta/ points to",
                found=listed
                + (f"; and {more} more" if more > 0 else "")
                + f" ({result.summary()})",
                file=ds.meta.root,
                fix=f"train on the {len(result.readable)} readable episodes with "
                "--dataset.episodes=readable, or skip the chunks of the failing files as they "
                "are read with --data.on_error=skip (each skip is logged), or download the "
                "missing files",
            )
        )


def eval_split(cfg: Any, meta: Any) -> tuple[list[int] | None, list[int] | None]:
    """lerobot-train's ``--dataset.eval_split``: the last ceil(n * split) episodes per task."""
    import math

    split = float(getattr(cfg.dataset, "eval_split", 0.0) or 0.0)
    if split == 0.0:
        return None, None
    base = cfg.dataset.episodes or list(range(meta.total_episodes))
    tasks = meta.episodes["tasks"]
    by_task: dict[str, list[int]] = {}
    for e in base:
        by_task.setdefault(tasks[e][0] if tasks[e] else "", []).append(e)
    train_eps: list[int] = []
    eval_eps: list[int] = []
    for eps in by_task.values():
        n_eval = math.ceil(len(eps) * split)
        train_eps += eps[: len(eps) - n_eval]
        eval_eps += eps[len(eps) - n_eval :]
    if not train_eps:
        raise TrainSetupError(
            describe(
                f"--dataset.eval_split={split} leaves no training episode",
                found=f"{len(base)} episodes in {len(by_task)} tasks",
                fix="use a smaller --dataset.eval_split",
            )
        )
    return sorted(train_eps), sorted(eval_eps)


def eval_loader(
    cfg: Any,
    meta: Any,
    episodes: list[int],
    rank: int,
    world: int,
    source_meta: DatasetMeta | None = None,
) -> Any:
    """Every held-out frame once per evaluation (this rank's share under DDP), uint8 images;
    a streamed dataset's (``source_meta``, else fetched here) read as byte ranges too."""
    from lerobot.datasets.factory import resolve_delta_timestamps

    root = dataset_root(cfg)
    streamed = (source_meta or streamed_meta(cfg)) if is_remote(root) else None
    reader = LeRobotReader(
        None if streamed is not None else root,
        repo_id=None if root else cfg.dataset.repo_id,
        revision=cfg.dataset.revision,
        meta=streamed,
        episodes=episodes,
        delta_timestamps=resolve_delta_timestamps(cfg.trainable_config, meta),
        image_dtype="uint8",
    )
    part = torch.utils.data.Subset(reader, range(rank, len(reader), world))
    return torch.utils.data.DataLoader(
        part, batch_size=cfg.batch_size, shuffle=False, num_workers=0, drop_last=False
    )


def evaluate(policy: Any, loader: Any, preprocessor: Any, cameras: Sequence[str], acc: Any):
    """lerobot-train's eval pass: mean loss over the held-out frames, reduced over ranks.

    The torch RNG state is put back afterwards, so that turning evaluation on or changing
    ``--eval_steps`` does not change the random draws of the training steps.
    """
    rng = torch.get_rng_state()
    policy.eval()
    total, n = 0.0, 0
    with torch.no_grad(), acc.autocast():
        for batch in loader:
            for key in cameras:
                if key in batch and batch[key].dtype == torch.uint8:
                    batch[key] = batch[key].to(dtype=torch.float32) / 255.0
            loss, _ = policy.forward(preprocessor(batch))
            total += loss.item()
            n += 1
    policy.train()
    torch.set_rng_state(rng)
    value = torch.tensor(total / max(n, 1), device=acc.device)
    return acc.reduce(value, reduction="mean").item()


def counts(dataset: ChunkedEpisodeDataset | MixedDataset) -> tuple[int, int]:
    parts = getattr(dataset, "datasets", None) or [dataset]
    frames = sum(int(d.fingerprint["total_frames"]) for d in parts)
    episodes = sum(len(d.episodes) for d in parts)
    return frames, episodes


def camera_keys(dataset: Any) -> Sequence[str]:
    """Keys of the batch's uint8 images to convert to float (lerobot's ``camera_keys``: video
    and ``dtype: image`` features); a mix knows its own."""
    keys = getattr(dataset, "camera_keys", None)
    if keys is not None:
        return keys
    return renamed(dataset.meta.visual_keys, getattr(dataset, "renames", {}))


def worker_logging(worker_id: int) -> None:
    """DataLoader worker start: lerobot's log format where the worker has no handler (spawn)."""
    if not logging.getLogger().handlers:
        from lerobot.utils.utils import init_logging

        init_logging()


def log_indices(path: str, step: int, rank: int, batch: dict[str, Any]) -> None:
    line = json.dumps({"step": step, "rank": rank, "index": batch["index"].tolist()})
    with open(f"{path}.rank{rank}", "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
