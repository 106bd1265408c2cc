"""The one S3 server of the tests: moto's, on 127.0.0.1, and uploads into it."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def moto_s3(bucket: str | None = None) -> Iterator[dict]:
    """A real S3 API on 127.0.0.1 (moto's server); yields s3fs storage_options.

    Every server starts empty: moto keeps its buckets in process-wide state, so the previous server's
    buckets are dropped first. With `bucket`, that bucket is created before the options are handed out.
    """
    import urllib.request

    import s3fs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    opts = {"endpoint_url": f"http://{host}:{port}", "key": "testing", "secret": "testing", "anon": False,
            "client_kwargs": {"region_name": "us-west-2"}}
    try:
        urllib.request.urlopen(urllib.request.Request(f"{opts['endpoint_url']}/moto-api/reset", method="POST"),
                               timeout=30).close()
        s3fs.S3FileSystem.clear_instance_cache()  # no filesystem cached for an earlier server's endpoint
        if bucket is not None:
            s3fs.S3FileSystem(skip_instance_cache=True, **opts).mkdir(bucket)
        yield opts
    finally:
        server.stop()


def upload_dir(local: Path, bucket: str, prefix: str, opts: dict) -> str:
    """Copy a dataset directory into s3://bucket/prefix (bucket created); returns the URL."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
    fs.mkdir(bucket)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            fs.pipe_file(f"{bucket}/{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())
    return f"s3://{bucket}/{prefix}"
