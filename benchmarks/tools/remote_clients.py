"""Client cost per ranged GET: obstore vs s3fs vs boto3 (S3, moto) and obstore vs fsspec (HTTP).

The servers (tests/remote_servers.py: moto's ThreadedMotoServer and the Range-capable folder
server, no faults) run in a child process, so this process's CPU time is the client's alone.
Each client reads ``--requests`` ranges of 64 KiB and of 1 MiB at random offsets of a 16 MiB
file; the table gives client CPU and wall time per request. Every read is checked against the
file's bytes. The choice of obstore in robo_resume.remote rests on it. s3fs is not a
dependency of robo_resume: without it (``pip install s3fs``) its rows are left out, with a note.

    python benchmarks/tools/remote_clients.py [--requests 200] [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # remote_servers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules

from _common import describe_machine, print_table, write_json

SIZE = 16 << 20
BUCKET = "bench"


def _serve(root: str, ready, stop) -> None:
    """Child process: the HTTP folder server and moto, until ``stop`` is set."""
    from remote_servers import FolderServer, S3Server

    http = FolderServer(Path(root)).start()
    s3 = S3Server().start()
    s3.upload(Path(root), BUCKET)
    ready.put((http.url, s3.moto_url))
    stop.wait()
    http.stop()
    s3.stop()


def _clients(http_url: str, s3_url: str) -> dict:
    import boto3
    import fsspec

    from robo_resume.remote import open_store

    try:
        import s3fs
    except ImportError:
        s3fs = None
        print("s3fs is not installed (pip install s3fs): its rows are left out", file=sys.stderr)

    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_REGION="us-east-1",
        AWS_ENDPOINT_URL=s3_url,
    )
    ob_s3 = open_store(f"s3://{BUCKET}")
    ob_http = open_store(http_url)
    fs3 = (
        s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={"endpoint_url": s3_url})
        if s3fs
        else None
    )
    fhttp = fsspec.filesystem("http")
    b3 = boto3.client("s3", endpoint_url=s3_url, region_name="us-east-1")

    def boto(start: int, end: int) -> bytes:
        r = b3.get_object(Bucket=BUCKET, Key="blob.bin", Range=f"bytes={start}-{end - 1}")
        return r["Body"].read()

    def s3fs_open(start: int, end: int) -> bytes:  # how a reader uses a file object
        with fs3.open(f"{BUCKET}/blob.bin", "rb", block_size=end - start) as f:
            f.seek(start)
            return f.read(end - start)

    s3fs_rows = {
        ("S3", "s3fs cat_file"): lambda s, e: fs3.cat_file(f"{BUCKET}/blob.bin", start=s, end=e),
        ("S3", "s3fs open+read"): s3fs_open,
    }
    return {
        ("S3", "obstore (robo_resume)"): lambda s, e: ob_s3.get_range("blob.bin", s, e),
        **(s3fs_rows if fs3 is not None else {}),
        ("S3", "boto3 get_object"): boto,
        ("HTTP", "obstore (robo_resume)"): lambda s, e: ob_http.get_range("blob.bin", s, e),
        ("HTTP", "fsspec cat_file"): lambda s, e: fhttp.cat_file(
            f"{http_url}/blob.bin", start=s, end=e
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="10 requests a row (the test)")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests = 10
    print(describe_machine())
    blob = random.Random(0).randbytes(SIZE)
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "blob.bin").write_bytes(blob)
        ctx = mp.get_context("spawn")
        ready, stop = ctx.Queue(), ctx.Event()
        server = ctx.Process(target=_serve, args=(root, ready, stop), daemon=True)
        server.start()
        try:
            http_url, s3_url = ready.get(timeout=60)
            rows = []
            for (proto, name), read in _clients(http_url, s3_url).items():
                for size in (64 << 10, 1 << 20):
                    rng = random.Random(size)
                    offsets = [rng.randrange(0, SIZE - size) for _ in range(args.requests)]
                    read(0, size)  # connections and clients warm
                    cpu, wall = time.process_time(), time.perf_counter()
                    for start in offsets:
                        data = read(start, start + size)
                        assert data == blob[start : start + size], (name, start)
                    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                    rows.append(
                        [
                            proto,
                            name,
                            size >> 10,
                            round(cpu / args.requests * 1e3, 3),
                            round(wall / args.requests * 1e3, 3),
                        ]
                    )
        finally:
            stop.set()
            server.join(30)
            if server.is_alive():
                server.terminate()
    print(f"{args.requests} ranged reads per row; client CPU and wall time per read, in ms")
    print_table(
        ["store", "client", "range", "CPU ms", "wall ms"],
        [[p, n, f"{k} KiB", f"{c:.2f}", f"{w:.2f}"] for p, n, k, c, w in rows],
    )
    if args.json:
        keys = ["store", "client", "range_kib", "cpu_ms", "wall_ms"]
        write_json(
            args.json,
            {
                "benchmark": "remote_clients",
                "requests": args.requests,
                "rows": [dict(zip(keys, r, strict=True)) for r in rows],
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
