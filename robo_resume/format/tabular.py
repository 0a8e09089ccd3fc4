"""Parquet row-range reading with column projection.

:class:`ParquetTable` opens one data file lazily, remembers its row-group layout, and reads a row
range by decoding only the row groups that overlap it. Columns come back as numpy arrays with one
row per frame (vectors as 2-D arrays), the shape the item builder stacks into tensors.

Checks (cheap: once per file, or vectorised over the rows read):

- every requested column holds numbers, booleans or lists of them, or lists of such lists (not
  strings, structs, ...);
  with ``features`` (info.json's), their kind also matches the declared dtype (a float column
  where ``int64`` is declared, or the reverse, is refused: items would silently change dtype);
  a declared ``string`` feature is a string column (returned as an object array of ``str``),
  a declared ``image`` feature a ``{bytes, path}`` struct column with the encoded image in
  ``bytes`` (returned as an object array of ``bytes``; an image stored only as a ``path``,
  outside the parquet, is refused); the language columns (``language_persistent``,
  ``language_events``) are lists of message structs, returned as object arrays of what
  ``LeRobotDataset`` items hold (:mod:`robo_resume.format.language`; null rows are ``None``);
- ``timestamp`` strictly increases inside each episode of the rows read; with ``fps``, it also
  equals ``frame_index / fps`` within ``tolerance_s``, since video frames are looked up at that
  time (a shifted timestamp would return a neighbouring frame, silently).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..errors import (
    CorruptFileError,
    MetadataMismatchError,
    MissingFileError,
    RoboResumeError,
    describe,
)
from .file_access import LOCAL, FileAccess
from .language import is_language_column, is_language_type, language_column
from .parquet_columns import column_to_numpy
from .row_groups import RowGroupCache

__all__ = ["ParquetTable", "RowGroupCache", "column_to_numpy"]


_KINDS = {"float": "f", "int": "iu", "uint": "iu", "bool": "b"}


def _declared_kind(dtype: Any) -> str | None:
    """numpy kinds a LeRobot feature dtype allows (None: not checked, e.g. strings)."""
    d = str(dtype)
    for prefix, kinds in _KINDS.items():
        if d.startswith(prefix):
            return kinds
    return None


def _arrow_kind(t) -> str | None:
    """numpy kind of an arrow column type (lists, lists of lists and ``datasets``' Array2D..5D
    extension types over them: of their values); None when not numeric."""
    import pyarrow as pa

    while True:
        if isinstance(t, pa.ExtensionType):
            t = t.storage_type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
            break
        t = t.value_type
    if pa.types.is_floating(t):
        return "f"
    if pa.types.is_integer(t):
        return "i"
    if pa.types.is_boolean(t):
        return "b"
    return None


def _is_declared_kind(t, feature: Mapping[str, Any]) -> bool:
    """A string column for a ``string`` feature; a struct with binary ``bytes`` for ``image``."""
    import pyarrow as pa

    if feature.get("dtype") == "string":
        return pa.types.is_string(t) or pa.types.is_large_string(t)
    if not pa.types.is_struct(t) or t.get_field_index("bytes") < 0:
        return False
    inner = t.field(t.get_field_index("bytes")).type
    return pa.types.is_binary(inner) or pa.types.is_large_binary(inner)


class ParquetTable:
    """Lazy reader of one parquet file; ``read(start, stop, columns)`` returns numpy columns.

    Args:
        path: the parquet file.
        fps: the dataset's fps; when given, ``timestamp`` must equal ``frame_index / fps``
            within ``tolerance_s`` (pass it when timestamps index video frames).
        tolerance_s: see ``fps`` (lerobot's default 1e-4 s).
        features: info.json's features; when given, column kinds must match their dtypes.
        cache: where decoded row groups are kept for later reads (:class:`RowGroupCache`);
            string, image and language columns, and groups with nulls, are always read anew.

    Thread-safe: a stream's decoding threads share it, and its pyarrow reads (opening the
    file, decoding row groups) take turns, since a ``ParquetFile`` read from two threads at
    once returns garbage or crashes the process; the rest of a read runs concurrently. Cheap
    to construct (the footer is read on first use). Picklable before first use, so it can be
    created in the main process and used in DataLoader workers. See the module docstring for
    the checks.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        fps: float | None = None,
        tolerance_s: float = 1e-4,
        features: Mapping[str, Mapping[str, Any]] | None = None,
        cache: RowGroupCache | None = None,
        files: FileAccess = LOCAL,
    ) -> None:
        self.path = Path(path)
        self.files = files
        self.where = files.where(self.path)  # how messages name the file (its URL if remote)
        self.cache = cache
        self.fps = fps
        self.tolerance_s = tolerance_s
        self.features = features
        self._file: Any = None  # a pyarrow.parquet.ParquetFile once open (pyarrow: untyped)
        self._rg_starts: list[int] = []
        self._typed: set[str] = set()  # columns whose type was checked
        self._shapes_ok: set[tuple] = set()  # (column, value shape) found as declared
        self.num_rows = -1
        self.columns: tuple[str, ...] = ()
        self._lock = threading.Lock()  # one pyarrow read at a time: ParquetFile is not thread-safe

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_file"] = None
        state["_typed"] = set()
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _open(self, episode: int | None = None):
        if self._file is not None:
            return self._file
        with self._lock:
            if self._file is not None:  # another thread opened it meanwhile
                return self._file
            return self._open_locked(episode)

    def _open_locked(self, episode: int | None):
        import pyarrow.parquet as pq

        if not self.files.is_file(self.path):
            raise MissingFileError(
                describe(
                    "A data file is missing",
                    expected="the parquet file that meta/ points to",
                    found="no such file",
                    file=self.where,
                    episode=episode,
                    fix="download the dataset again, or select episodes whose files exist",
                )
            )
        try:
            f = pq.ParquetFile(self.files.open(self.path))
        except RoboResumeError:  # a remote read that failed for good: its own message
            raise
        except Exception as exc:  # ArrowInvalid, OSError, ... for truncated or corrupt footers
            raise CorruptFileError(
                describe(
                    "A data file is not a readable parquet file",
                    expected="a valid parquet file",
                    found=f"{type(exc).__name__}: {exc}",
                    file=self.where,
                    episode=episode,
                    fix="download this file again; it is probably truncated",
                )
            ) from exc
        md = f.metadata
        starts, total = [], 0
        for i in range(md.num_row_groups):
            starts.append(total)
            total += md.row_group(i).num_rows
        self._rg_starts = starts
        self.num_rows = total
        self.columns = tuple(f.schema_arrow.names)
        self._file = f
        return f

    def check_rows(self, needed_stop: int, *, episode: int) -> None:
        """Raise MetadataMismatchError if the file has fewer than ``needed_stop`` rows."""
        self._open(episode)
        if self.num_rows < needed_stop:
            raise MetadataMismatchError(
                describe(
                    "Episode metadata and the data file disagree on the number of rows",
                    expected=f"at least {needed_stop} rows (from meta/episodes lengths)",
                    found=f"{self.num_rows} rows",
                    file=self.where,
                    episode=episode,
                    fix="the dataset is inconsistent; download it again or rebuild its metadata",
                )
            )

    def read(
        self,
        start: int,
        stop: int,
        columns: Sequence[str],
        *,
        episode: int | None = None,
        check: bool = True,
    ) -> dict[str, np.ndarray]:
        """Return ``columns`` for rows ``[start, stop)``, decoding only overlapping row groups.

        ``check`` False leaves out the per-row checks (value shapes, increasing timestamps that
        match ``frame_index / fps``) for rows a checked read already covered; the file's
        columns, types and row count are checked either way."""
        f = self._open(episode)
        missing = [c for c in columns if c not in self.columns]
        if missing:
            raise CorruptFileError(
                describe(
                    "A data file lacks columns that meta/info.json declares",
                    expected=f"columns {list(columns)}",
                    found=f"missing {missing}",
                    file=self.where,
                    episode=episode,
                    fix="the file does not match meta/info.json; download the dataset again",
                )
            )
        unchecked = [c for c in columns if c not in self._typed]
        if unchecked:
            self._check_types(unchecked, episode)
        if stop > self.num_rows or start < 0:
            self.check_rows(stop, episode=episode if episode is not None else -1)
        first = bisect.bisect_right(self._rg_starts, start) - 1
        last = bisect.bisect_left(self._rg_starts, stop) - 1
        groups = list(range(max(first, 0), max(last, first) + 1))
        if self.cache is not None and groups:
            out = self._read_cached(f, self.cache, groups, start, stop, columns)
            if out is not None:
                if check:
                    for c in columns:
                        self._check_shape(c, out[c], episode)
                    if "timestamp" in out:
                        self._check_timestamps(out, episode, start)
                return out
        try:
            # One thread: a chunk's rows are few, and Arrow's thread pool costs more than it
            # saves there; the loader's workers or
            # decoding threads keep the cores busy.
            with self._lock:
                table = f.read_row_groups(groups, columns=list(columns), use_threads=False)
        except Exception as exc:
            raise CorruptFileError(
                describe(
                    "A data file's row groups cannot be decoded",
                    expected="readable row groups",
                    found=f"{type(exc).__name__}: {exc}",
                    file=self.where,
                    episode=episode,
                    fix="download this file again",
                )
            ) from exc
        import pyarrow.compute as pc

        base = self._rg_starts[groups[0]] if groups else 0
        table = table.slice(start - base, stop - start)
        out = {}
        for c in columns:
            column = table.column(c)
            if self._declared(c) == "image":
                column = column.combine_chunks()
                if column.null_count == 0:  # the encoded files (null: an image only named)
                    column = pc.struct_field(column, "bytes")
            if self._declared(c) == "language":  # lists of messages; null: not annotated
                out[c] = language_column(
                    column, name=c, file=self.where, first_row=start, episode=episode
                )
                continue
            if column.null_count:
                self._refuse_nulls(c, column, episode, start)
            out[c] = column_to_numpy(
                column, name=c, file=self.where, first_row=start, episode=episode
            )
            if check:
                self._check_shape(c, out[c], episode)
        if check and "timestamp" in out:
            self._check_timestamps(out, episode, start)
        return out

    def _read_cached(
        self,
        f: Any,
        cache: RowGroupCache,
        groups: list[int],
        start: int,
        stop: int,
        columns: Sequence[str],
    ) -> dict[str, np.ndarray] | None:
        """Rows ``[start, stop)`` of ``columns`` from decoded row groups, the missing ones read
        (together) and kept in :attr:`cache`; None where that cannot be done (string, image or
        language columns; nulls or anything :func:`column_to_numpy` refuses in a group read:
        the plain path then reads the rows asked for and raises what it raises for them)."""
        if any(self._declared(c) in ("string", "image", "language") for c in columns):
            return None
        cols = tuple(columns)
        keys = [(str(self.path), g, cols) for g in groups]
        parts = [cache.get(k) for k in keys]
        missing = [g for g, part in zip(groups, parts, strict=True) if part is None]
        if missing:
            try:
                with self._lock:
                    table = f.read_row_groups(missing, columns=list(cols), use_threads=False)
                decoded = {}
                for c in cols:
                    column = table.column(c)
                    if column.null_count:
                        return None
                    decoded[c] = column_to_numpy(column, name=c, file=self.where)
            except Exception:  # the plain path reads the rows asked for and reports
                return None
            at = 0
            for g in missing:
                n = self._group_rows(g)
                # own copies when several groups were read: a kept group must not hold the others
                part = {c: v[at : at + n] for c, v in decoded.items()}
                if len(missing) > 1:
                    part = {c: v.copy() for c, v in part.items()}
                at += n
                parts[groups.index(g)] = part
                cache.put(keys[groups.index(g)], part)
        held = cast("list[dict[str, np.ndarray]]", parts)  # every group filled above
        base = self._rg_starts[groups[0]]
        if len(held) == 1:
            return {c: held[0][c][start - base : stop - base] for c in cols}
        return {c: np.concatenate([p[c] for p in held])[start - base : stop - base] for c in cols}

    def _group_rows(self, g: int) -> int:
        """Rows in row group ``g``."""
        nxt = self._rg_starts[g + 1] if g + 1 < len(self._rg_starts) else self.num_rows
        return nxt - self._rg_starts[g]

    def _declared(self, c: str) -> str:
        """The dtype info.json declares for column ``c`` ("" if none; "language" for the
        language columns, which lerobot knows by their name)."""
        if is_language_column(c) and self.features and c in self.features:
            return "language"
        return str(((self.features or {}).get(c) or {}).get("dtype", ""))

    def _refuse_nulls(self, c: str, column, episode: int | None, start: int) -> None:
        import pyarrow.compute as pc

        k = int(np.flatnonzero(pc.is_null(column).to_numpy(zero_copy_only=False))[0])
        if self._declared(c) == "image":
            raise CorruptFileError(
                describe(
                    f"A data file's image column '{c}' holds a row without image bytes",
                    expected="the encoded image in the 'bytes' field of every row (lerobot "
                    "embeds the files when it writes a dataset)",
                    found=f"{column.null_count} rows without bytes, the first at row {start + k}",
                    file=self.where,
                    episode=episode,
                    fix="embed the images in the parquet (lerobot's writer does), or download "
                    "the file again; robo_resume reads no image files named by a path",
                )
            )
        raise CorruptFileError(
            describe(
                f"A data file's column '{c}' holds nulls",
                expected="a value in every row (lerobot fails on nulls too)",
                found=f"{column.null_count} null rows, the first at row {start + k}",
                file=self.where,
                episode=episode,
                fix="the file is damaged or was written with missing values; download it again",
            )
        )

    def _check_shape(self, c: str, values: np.ndarray, episode: int | None) -> None:
        """Values per row equal the declared shape's size (lerobot refuses other shapes)."""
        seen = (c, values.shape[1:])
        if seen in self._shapes_ok:
            return
        feature = (self.features or {}).get(c) or {}
        shape = feature.get("shape")
        if _declared_kind(feature.get("dtype")) is None or not isinstance(shape, list | tuple):
            self._shapes_ok.add(seen)
            return
        want = int(np.prod(shape, dtype=np.int64))
        got = int(np.prod(values.shape[1:], dtype=np.int64))
        if got != want:
            raise MetadataMismatchError(
                describe(
                    f"A data file's column '{c}' has another shape than meta/info.json declares",
                    expected=f"{want} values per row (shape {list(shape)})",
                    found=f"{got} values per row (shape {list(values.shape[1:])})",
                    file=self.where,
                    episode=episode,
                    fix=f"set the shape of '{c}' in meta/info.json to the data's, or rewrite "
                    "the column; lerobot refuses this dataset too",
                )
            )
        self._shapes_ok.add(seen)

    def _check_types(self, columns: Sequence[str], episode: int | None) -> None:
        """Refuse non-numeric columns, and kinds that contradict info.json (once per column)."""
        with self._lock:
            schema = self._file.schema_arrow
        for c in columns:
            t = schema.field(c).type
            kind = _arrow_kind(t)
            feature = (self.features or {}).get(c) or {}
            declared = _declared_kind(feature.get("dtype"))
            if self._declared(c) == "language":
                if not is_language_type(t):
                    raise CorruptFileError(
                        describe(
                            f"A data file's language column '{c}' has the wrong type",
                            expected="a list of message structs per row "
                            "(lerobot.datasets.language)",
                            found=f"arrow type {t}",
                            file=self.where,
                            episode=episode,
                            fix="write the column with lerobot-annotate, or remove it with "
                            "lerobot-edit-dataset --operation.type remove_feature",
                        )
                    )
                self._typed.add(c)
                continue
            special = str(feature.get("dtype")) in ("string", "image")
            if special and _is_declared_kind(t, feature):
                self._typed.add(c)
                continue
            if special or kind is None or (declared is not None and kind not in declared):
                dtype = feature.get("dtype")
                raise CorruptFileError(
                    describe(
                        f"A data file's column '{c}' has the wrong type",
                        expected=f"{dtype} values (meta/info.json)"
                        if dtype
                        else "numbers, booleans or lists of them",
                        found=f"arrow type {t}",
                        file=self.where,
                        episode=episode,
                        fix="the file does not match meta/info.json; download it again or "
                        f"rewrite column '{c}' with the declared dtype",
                    )
                )
            self._typed.add(c)

    def _check_timestamps(
        self, out: Mapping[str, np.ndarray], episode: int | None, start: int
    ) -> None:
        """Vectorised: timestamps increase inside each episode (and match frame_index / fps)."""
        ts = np.asarray(out["timestamp"], dtype=np.float64).reshape(len(out["timestamp"]), -1)[:, 0]
        if len(ts) == 0:
            return
        frames = out.get("frame_index")
        eps = out.get("episode_index")
        frame_of = (lambda k: int(np.ravel(frames[k])[0])) if frames is not None else None
        episode_of = (lambda k: int(np.ravel(eps[k])[0])) if eps is not None else lambda k: episode
        same = np.ones(len(ts) - 1, dtype=bool)
        if eps is not None:
            e = np.asarray(eps).reshape(len(ts), -1)[:, 0]
            same = e[1:] == e[:-1]
        bad = np.flatnonzero(same & ~(np.diff(ts) > 0))
        if bad.size:
            k = int(bad[0]) + 1
            raise CorruptFileError(
                describe(
                    "A data file's timestamps do not increase within an episode",
                    expected=f"timestamp > {ts[k - 1]:.6f} (the previous row's)",
                    found=f"timestamp {ts[k]:.6f} at row {start + k}",
                    file=self.where,
                    episode=episode_of(k),
                    frame=frame_of(k) if frame_of else None,
                    fix="the timestamp column is damaged; download the file again or rewrite "
                    "timestamp as frame_index / fps",
                )
            )
        if self.fps and frames is not None:
            fi = np.asarray(frames, dtype=np.float64).reshape(len(ts), -1)[:, 0]
            off = np.abs(ts - fi / self.fps)
            bad = np.flatnonzero(off > self.tolerance_s)
            if bad.size:
                k = int(bad[0])
                raise CorruptFileError(
                    describe(
                        "A data file's timestamp disagrees with frame_index / fps",
                        expected=f"timestamp {fi[k] / self.fps:.6f} "
                        f"(frame_index {int(fi[k])} / fps {self.fps}, within {self.tolerance_s} s)",
                        found=f"timestamp {ts[k]:.6f} at row {start + k}",
                        file=self.where,
                        episode=episode_of(k),
                        frame=int(fi[k]),
                        fix="video frames are looked up at timestamp; rewrite timestamp as "
                        "frame_index / fps, or check the fps in meta/info.json",
                    )
                )
