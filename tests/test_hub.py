"""Hub datasets (robo_resume.hub): meta first, then only the selected episodes' files; offline.

There is no network here. Downloads are either a FakeHub (an injected download function that
records the allow_patterns requested and copies the matching files of a factory dataset into a
folder laid out like the huggingface_hub cache, matching patterns with huggingface_hub's own
filter) or the real ``snapshot_download`` in offline mode over such a cache folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from robo_resume import LeRobotReader, MissingFileError, load_metadata
from robo_resume.hub import download_patterns, episode_files, resolve_dataset, resolve_root
from robo_resume.splits import Split, select_episodes

hub_utils = pytest.importorskip("huggingface_hub.utils")

REPO_ID = "owner/name"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
LENGTHS = (6, 9, 5, 7, 4, 8, 6)  # 7 episodes


@pytest.fixture(scope="module")
def v30(factory):
    # One episode per data file and mp4, two files per chunk folder: 4 chunk folders.
    return factory(
        episode_lengths=LENGTHS, num_cameras=2, codec="h264", episodes_per_file=1, files_per_chunk=2
    )


@pytest.fixture(scope="module")
def v21(factory):
    return factory(
        version="v2.1", episode_lengths=LENGTHS, num_cameras=1, codec="h264", files_per_chunk=3
    )


def repo_files(source: Path) -> list[str]:
    return sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file())


def populate_cache(
    source: Path,
    cache: Path,
    files,
    *,
    repo_id: str = REPO_ID,
    commit: str = COMMIT,
    refs=("main",),
) -> Path:
    """Write ``files`` of ``source`` as huggingface_hub does: blobs/<sha256> + snapshot symlinks."""
    storage = cache / ("datasets--" + repo_id.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    (storage / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in files:
        data = (source / f).read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / f
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(os.path.relpath(blob, link.parent))
    (storage / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (storage / "refs" / ref).write_text(commit)
    return snapshot


class FakeHub:
    """``snapshot_download`` of one repo at one commit, from a local source folder."""

    def __init__(self, source: Path, cache: Path, *, drop=()):
        self.source, self.cache, self.drop = source, cache, set(drop)
        self.calls: list[dict] = []

    def __call__(
        self, repo_id, *, revision, allow_patterns, cache_dir, local_dir, local_files_only
    ):
        self.calls.append(
            dict(
                repo_id=repo_id,
                revision=revision,
                allow_patterns=list(allow_patterns),
                local_dir=local_dir,
                local_files_only=local_files_only,
            )
        )
        assert repo_id == REPO_ID and revision in (None, "main", COMMIT)
        chosen = [
            f
            for f in hub_utils.filter_repo_objects(
                repo_files(self.source), allow_patterns=allow_patterns
            )
            if f not in self.drop
        ]
        if local_dir is not None:
            for f in chosen:
                (Path(local_dir) / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.source / f, Path(local_dir) / f)
            return str(local_dir)
        return str(populate_cache(self.source, Path(cache_dir), chosen))

    def matched(self, call: int) -> set[str]:
        pats = self.calls[call]["allow_patterns"]
        return set(hub_utils.filter_repo_objects(repo_files(self.source), allow_patterns=pats))


def no_download(*a, **k):
    raise AssertionError("nothing should be downloaded")


# --------------------------------------------------------------------------- download plan


@pytest.mark.parametrize("which", ["v30", "v21"])
@pytest.mark.parametrize(
    "episodes", [[1, 4], [0], "train[:50%]", Split((0.7, 0.3), index=1, seed=2), None]
)
def test_meta_first_then_only_the_selected_episodes_files(request, tmp_path, which, episodes):
    ds = request.getfixturevalue(which)
    hub = FakeHub(ds.root, tmp_path / "cache")
    root = resolve_root(REPO_ID, episodes=episodes, cache_dir=tmp_path / "cache", _download=hub)

    assert root == tmp_path / "cache" / "datasets--owner--name" / "snapshots" / COMMIT
    assert hub.calls[0]["allow_patterns"] == ["meta/**"] and hub.calls[0]["revision"] is None
    meta = load_metadata(ds.root)
    selected = select_episodes(meta, episodes)
    want = set(episode_files(meta, selected))
    assert len(hub.calls) == 2
    assert hub.calls[1]["revision"] == COMMIT  # pinned to the metadata's commit
    assert hub.matched(1) == want  # exactly the selected episodes' data and video files
    meta_files = {f for f in repo_files(ds.root) if f.startswith("meta/")}
    assert set(repo_files(root)) == meta_files | want
    if episodes is None:
        assert hub.calls[1]["allow_patterns"] == ["data/*", "videos/*"]


def test_items_from_the_hub_snapshot_equal_the_source(tmp_path, v30):
    hub = FakeHub(v30.root, tmp_path / "cache")
    root, meta = resolve_dataset(
        REPO_ID, episodes=[2, 5], cache_dir=tmp_path / "cache", _download=hub
    )
    got = LeRobotReader(root, episodes=[2, 5], meta=meta)
    want = LeRobotReader(v30.root, episodes=[2, 5])
    assert len(got) == len(want) == LENGTHS[2] + LENGTHS[5]
    for i in (0, 4, len(got) - 1):
        a, b = got[i], want[i]
        assert a.keys() == b.keys()
        for k in a:
            if hasattr(a[k], "shape"):
                np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
            else:
                assert a[k] == b[k], k


def test_cached_files_are_not_requested_again(tmp_path, v30):
    hub = FakeHub(v30.root, tmp_path / "cache")
    resolve_root(REPO_ID, episodes=[1, 2], cache_dir=tmp_path / "cache", _download=hub)
    hub.calls.clear()
    resolve_root(REPO_ID, episodes=[2], cache_dir=tmp_path / "cache", _download=hub)
    assert [c["allow_patterns"] for c in hub.calls] == [["meta/**"]]
    resolve_root(REPO_ID, episodes=[2, 3], cache_dir=tmp_path / "cache", _download=hub)
    meta = load_metadata(v30.root)
    assert hub.matched(2) == set(episode_files(meta, [2, 3]))  # requests name the files


def test_download_patterns_collapse_full_folders_and_escape(v30, v21):
    meta = load_metadata(v30.root)  # chunk-000 holds episodes 0 and 1
    assert download_patterns(meta, [0, 1]) == (
        "data/chunk-000/*",
        "videos/observation.images.cam0/chunk-000/*",
        "videos/observation.images.cam1/chunk-000/*",
    )
    assert download_patterns(meta, [0]) == episode_files(meta, [0])
    assert download_patterns(load_metadata(v21.root), range(7)) == ("data/*", "videos/*")
    from robo_resume.hub_patterns import escape

    assert escape("videos/cam[1]/a*b?.mp4") == "videos/cam[[]1]/a[*]b[?].mp4"
    assert (
        hub_utils.filter_repo_objects(
            ["videos/cam[1]/a*b?.mp4", "videos/cam1/axb?.mp4"],
            allow_patterns=[escape("videos/cam[1]/a*b?.mp4")],
        ).__next__()
        == "videos/cam[1]/a*b?.mp4"
    )


def test_many_files_are_fetched_one_by_one(tmp_path, v21, monkeypatch):
    """Past MAX_PATTERNS, hf_hub_download per file (snapshot_download's filter is quadratic)."""
    import huggingface_hub

    import robo_resume.hub

    cache = tmp_path / "cache"
    hub = FakeHub(v21.root, cache)
    fetched = []

    def fake_snapshot_download(repo_id, *, repo_type, **kw):
        assert repo_type == "dataset"
        return hub(repo_id, **kw)

    def fake_hf_hub_download(repo_id, *, filename, repo_type, revision, cache_dir, local_dir):
        assert (repo_type, revision, local_dir) == ("dataset", COMMIT, None)
        fetched.append(filename)
        return str(populate_cache(v21.root, Path(cache_dir), [filename]) / filename)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_hf_hub_download)
    monkeypatch.setattr(robo_resume.hub, "MAX_PATTERNS", 3)
    meta = load_metadata(v21.root)
    resolve_root(REPO_ID, episodes=[0, 1], cache_dir=cache)  # 4 files, 4 patterns
    assert [c["allow_patterns"] for c in hub.calls] == [["meta/**"]]
    assert sorted(fetched) == list(episode_files(meta, [0, 1]))
    fetched.clear()
    root = resolve_root(REPO_ID, episodes=[1, 2], cache_dir=cache)  # only episode 2 is new
    assert sorted(fetched) == list(episode_files(meta, [2]))
    assert LeRobotReader(root, episodes=[0, 1, 2]).num_episodes == 3


def test_root_with_a_dataset_is_used_as_is(v30):
    assert resolve_root(REPO_ID, root=v30.root, _download=no_download) == v30.root
    assert resolve_root(root=v30.root, episodes=[0]) == v30.root
    reader = LeRobotReader(v30.root, repo_id=REPO_ID, episodes=[3])
    assert reader.meta.root == v30.root.resolve() and reader.episodes == (3,)


def test_root_without_a_dataset_is_the_download_folder(tmp_path, v30):
    hub = FakeHub(v30.root, tmp_path / "unused")
    dest = tmp_path / "local_copy"
    got = resolve_root(REPO_ID, root=dest, episodes=[6], _download=hub)
    assert got == dest and hub.calls[1]["local_dir"] == dest
    assert hub.calls[1]["revision"] is None  # local_dir: no commit folder to pin
    assert (dest / "meta" / "info.json").is_file()
    assert set(repo_files(dest)) - {f for f in repo_files(dest) if f.startswith("meta/")} == set(
        episode_files(load_metadata(v30.root), [6])
    )


def test_no_source_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"No dataset to open.*root=.*repo_id='owner/name'"):
        resolve_root()
    with pytest.raises(ValueError, match="No dataset to open"):
        LeRobotReader()
    with pytest.raises(MissingFileError, match=r"holds no LeRobot dataset.*no such folder"):
        resolve_root(root=tmp_path / "nothing")


def test_missing_files_after_download_name_them(tmp_path, v30):
    meta = load_metadata(v30.root)
    lost = episode_files(meta, [4])[1]
    hub = FakeHub(v30.root, tmp_path / "cache", drop={lost})
    with pytest.raises(
        MissingFileError,
        match=rf"1 of the 3 data/video files of the 1 selected episodes of 'owner/name' are "
        rf"missing after download.*missing {lost}.*Hub snapshot lacks files",
    ):
        resolve_root(REPO_ID, episodes=[4], cache_dir=tmp_path / "cache", _download=hub)


def test_offline_env_var_is_read_at_call_time(tmp_path, v30, monkeypatch):
    hub = FakeHub(v30.root, tmp_path / "cache")
    resolve_root(REPO_ID, episodes=[0], cache_dir=tmp_path / "cache", _download=hub)
    assert [c["local_files_only"] for c in hub.calls] == [False, False]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.calls.clear()
    resolve_root(REPO_ID, episodes=[0], cache_dir=tmp_path / "cache", _download=hub)
    assert [c["local_files_only"] for c in hub.calls] == [True]


def hub_http_error(cls: type[Exception]) -> Exception:
    """A huggingface_hub HTTP error as the Hub client raises it: since huggingface_hub 1.0
    (lerobot 0.6) the errors require the httpx response they came with."""
    import httpx

    request = httpx.Request("GET", "https://huggingface.co/api/datasets/owner/name")
    return cls("x", response=httpx.Response(404, request=request))


def test_hub_errors_become_robo_resume_errors(tmp_path):
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    def raising(exc):
        def download(*a, **k):
            raise exc

        return download

    with pytest.raises(MissingFileError, match=r"no revision 'v9\.9'.*version tag such as"):
        resolve_root(
            REPO_ID, revision="v9.9", _download=raising(hub_http_error(RevisionNotFoundError))
        )
    with pytest.raises(MissingFileError, match=r"no dataset repo 'owner/name'.*`hf auth login`"):
        resolve_root(REPO_ID, _download=raising(hub_http_error(RepositoryNotFoundError)))
    with pytest.raises(KeyError, match="other"):  # anything else propagates unchanged
        resolve_root(REPO_ID, _download=raising(KeyError("other")))


def test_huggingface_hub_is_optional(tmp_path, v30, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    with pytest.raises(ImportError, match=r"needs huggingface_hub.*pip install huggingface_hub"):
        resolve_root(REPO_ID, cache_dir=tmp_path)
    assert len(LeRobotReader(v30.root, episodes=[0])) == LENGTHS[0]  # local roots need no hub


# --------------------------------------------------------------------------- real, offline


@pytest.fixture
def offline(monkeypatch):
    """HF_HUB_OFFLINE=1, also in huggingface_hub's import-time constant (no request leaves)."""
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return constants


def test_offline_resolves_from_the_cache(tmp_path, v30, offline, monkeypatch):
    cache = tmp_path / "cache"
    snap = populate_cache(v30.root, cache, repo_files(v30.root), refs=("main", "v3.0"))
    assert resolve_root(REPO_ID, episodes=[0, 1], cache_dir=cache) == snap
    assert resolve_root(REPO_ID, revision="v3.0", cache_dir=cache) == snap
    assert resolve_root(REPO_ID, revision=COMMIT, cache_dir=cache) == snap
    monkeypatch.setattr(offline, "HF_HUB_CACHE", str(cache))  # snapshot_download's default
    reader = LeRobotReader(repo_id=REPO_ID, episodes="train[-2:]")
    assert reader.meta.root == snap and reader.episodes == (5, 6)
    assert int(reader[0]["episode_index"]) == 5 and "repo_id='owner/name'" in repr(reader)


def test_offline_missing_file_is_a_clear_error(tmp_path, v30, offline):
    cache = tmp_path / "cache"
    meta = load_metadata(v30.root)
    files = [f for f in repo_files(v30.root) if f not in episode_files(meta, [3])]
    populate_cache(v30.root, cache, files)  # episode 3 was never downloaded
    assert resolve_root(REPO_ID, episodes=[2, 4], cache_dir=cache).is_dir()
    with pytest.raises(
        MissingFileError,
        match=r"3 of the 6 data/video files of the 2 selected episodes of 'owner/name' are "
        r"missing from the local cache \(offline mode is on\).*"
        r"missing data/chunk-001/file-001\.parquet.*"
        r"Fix: offline mode is on .*unset HF_HUB_OFFLINE.*`hf download owner/name",
    ):
        resolve_root(REPO_ID, episodes=[2, 3], cache_dir=cache)


def test_offline_broken_blob_counts_as_missing(tmp_path, v21, offline):
    cache = tmp_path / "cache"
    snap = populate_cache(v21.root, cache, repo_files(v21.root))
    video = episode_files(load_metadata(v21.root), [1])[-1]
    (snap / video).resolve().unlink()  # the symlink stays, its blob is gone
    with pytest.raises(MissingFileError, match=rf"offline mode is on.*missing {video}"):
        resolve_root(REPO_ID, episodes=[1], cache_dir=cache)


def test_offline_without_a_cached_snapshot(tmp_path, offline):
    with pytest.raises(
        MissingFileError,
        match=r"'owner/name' \(revision 'main'\) is not in the local Hugging Face cache and "
        r"offline mode is on.*datasets--owner--name.*unset HF_HUB_OFFLINE",
    ):
        resolve_root(REPO_ID, cache_dir=tmp_path / "empty")


OFFLINE_SCRIPT = """
import json, sys
import huggingface_hub.constants as c
from robo_resume import LeRobotReader
r = LeRobotReader(repo_id="owner/name", episodes="train[:50%]")
print(json.dumps({"offline": c.HF_HUB_OFFLINE, "root": str(r.meta.root),
                  "episodes": list(r.episodes), "frames": len(r),
                  "last": int(r[len(r) - 1]["index"])}))
"""


def test_offline_end_to_end_in_a_fresh_process(tmp_path, v30):
    """HF_HUB_OFFLINE=1 set before huggingface_hub is imported, as a user would."""
    cache = tmp_path / "cache"
    snap = populate_cache(v30.root, cache, repo_files(v30.root))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    out = subprocess.run(
        [sys.executable, "-c", OFFLINE_SCRIPT], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert (
        got
        == {
            "offline": True,
            "root": str(snap),
            "episodes": [0, 1, 2, 3],  # round(3.5) = 4 (ties to even)
            "frames": sum(LENGTHS[:4]),
            "last": sum(LENGTHS[:4]) - 1,
        }
    )
