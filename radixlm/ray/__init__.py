"""radixlm on Ray Serve (`pip install radixlm[ray]`): engine replicas behind an
OpenAI-compatible ingress, routed by radixlm's cache-aware policy. See docs/deploy.md.

`serve run radixlm.ray:app` serves the default model with one replica; `radixlm
serve-ray` takes `radixlm serve`'s engine flags and the replicas' (cli.py). `app` is built
on first access, so importing a submodule builds nothing.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        from radixlm.config import ServerArgs
        from radixlm.ray.application import RayServeArgs, build_app

        return build_app(RayServeArgs(), ServerArgs())
    raise AttributeError(name)
