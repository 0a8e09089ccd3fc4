"""Reading LeRobot datasets from hf://, s3://, gs:// and https:// as byte ranges.

:func:`open_store` gives a :class:`Store` (ranges, whole files, listings; retried, pinned,
never short); :func:`fetch_meta` copies ``meta/`` once into a local cache folder that
:func:`robo_resume.format.metadata.load_metadata` reads. Needs the ``remote`` extra
(``pip install robo_resume[remote]``: obstore, huggingface_hub). :class:`~.prefetch.Prefetcher`
fetches a stream's planned byte spans ahead of its reads into a bounded cache.
"""

from .meta import MetaCache, default_cache_dir, fetch_meta
from .open import open_store
from .store import ObjectInfo, RetryPolicy, Store

__all__ = [
    "MetaCache",
    "ObjectInfo",
    "RetryPolicy",
    "Store",
    "default_cache_dir",
    "fetch_meta",
    "open_store",
]
