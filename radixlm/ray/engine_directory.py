"""Where the engines of one Serve application listen: replica id -> engine URL, in the Ray
cluster's key-value store (namespace "radixlm", keys "<app>/<replica id>").

Serve handles reach one replica chosen by the router; the ingress's fan-out endpoints
(/server_info, /flush_cache) need every engine, so each replica registers its engine's URL
when it is up and removes it when it stops. A replica killed without stopping leaves its
key: the ingress drops a key whose engine does not answer (`forget`).
"""

from __future__ import annotations

from ray.experimental.internal_kv import (
    _internal_kv_del, _internal_kv_get, _internal_kv_list, _internal_kv_put,
)

NAMESPACE = "radixlm"


def register(app: str, replica_id: str, url: str) -> None:
    _internal_kv_put(f"{app}/{replica_id}", url, overwrite=True, namespace=NAMESPACE)


def forget(app: str, replica_id: str) -> None:
    _internal_kv_del(f"{app}/{replica_id}", namespace=NAMESPACE)


def engines(app: str) -> dict[str, str]:
    """replica id -> engine URL, for every registered engine of `app`."""
    out: dict[str, str] = {}
    for key in _internal_kv_list(f"{app}/", namespace=NAMESPACE):
        url = _internal_kv_get(key, namespace=NAMESPACE)
        if url is not None:
            out[key.decode().split("/", 1)[1]] = url.decode()
    return out
