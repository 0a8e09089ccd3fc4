"""Train from a remote dataset without downloading it, and resume exactly.

``ChunkedEpisodeDataset(URL)`` takes ``hf://datasets/ORG/NAME`` (with ``revision=``),
``s3://bucket/prefix``, ``gs://bucket/prefix`` or ``https://host/path`` (the ``remote`` extra:
``pip install 'robo_resume[remote]'``). ``meta/`` is fetched once into a local cache; data and
video files are read as byte ranges. The batches and the resume states are the same as for the
local folder: a state saved on one resumes on the other.

    python examples/remote_dataset.py                  # a generated dataset on a loopback server
    python examples/remote_dataset.py hf://datasets/lerobot/pusht --episodes 0-3

Without a URL it writes a tiny dataset, serves it over HTTP on 127.0.0.1 (a Range-capable
server in this file), streams 5 batches, saves the state, and resumes on the remote URL with
another number of workers; it checks the result against the local folder.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import re
import tempfile
import threading
from pathlib import Path

from robo_resume import ChunkedEpisodeDataset, make_dataset


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder with ``Range: bytes=a-b`` support (what a CDN or S3 gateway does)."""

    def send_head(self):
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return None
        data = path.read_bytes()
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if m:
            a, b = int(m[1]), int(m[2]) if m[2] else len(data) - 1
            body = data[a : b + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {a}-{a + len(body) - 1}/{len(data)}")
        else:
            body = data
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{len(data)}-{int(path.stat().st_mtime)}"')
        self.end_headers()
        import io

        return io.BytesIO(body)

    def log_message(self, *args):  # quiet
        pass


def serve(root: Path) -> tuple[str, http.server.ThreadingHTTPServer]:
    """Serve ``root`` on a free loopback port; returns its URL and the server (shut it down)."""
    handler = functools.partial(RangeHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", nargs="?", help="a remote dataset (default: a generated one, served)")
    p.add_argument("--episodes", default=None, help="e.g. 0-3 (default: all)")
    args = p.parse_args()
    episodes = None
    if args.episodes:
        a, _, b = args.episodes.partition("-")
        episodes = list(range(int(a), int(b or a) + 1))
    server = local = None
    url = args.url
    if url is None:
        local = make_dataset(tempfile.mkdtemp() + "/ds", episode_lengths=(31, 44, 27, 35)).root
        url, server = serve(local)
    try:

        def make(root, **kw):
            return ChunkedEpisodeDataset(root, batch_size=8, seed=0, episodes=episodes, **kw)

        ds = make(url)
        tracker = ds.tracker()
        for k, batch in enumerate(ds.dataloader(num_workers=2)):  # forkserver workers
            tracker.consume(batch)  # ... train on it ...
            if k == 4:
                state = tracker.state_dict()  # put this in your checkpoint
                break
        print(f"streamed 5 batches from {url} with 2 workers")
        rest = [
            b["index"].tolist() for b in make(url, resume_state=state).dataloader(num_workers=1)
        ]
        print(f"resumed on 1 worker: {sum(map(len, rest))} frames left of the epoch")
        if local is not None:
            want = make(local, resume_state=state).dataloader(num_workers=1)
            assert rest == [b["index"].tolist() for b in want], "remote and local differ"
            print("the same frames as the local folder, in the same order")
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    main()
