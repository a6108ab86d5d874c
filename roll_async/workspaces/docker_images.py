"""The image a workspace container starts from: the spec's image, or its Dockerfile built once.

A spec with a ``dockerfile`` is built from the Dockerfile's folder (its build context) and tagged
``roll-async/context:<hash>``, the content hash of that context, so a changed task rebuilds and an
unchanged one never does, even across runs; the spec's own ``image`` name is tagged too. Builds never
pull (no registry needs to be reachable: ``FROM`` names a local image such as the base image that
scripts/docker_setup.sh builds). Concurrent starts of one context wait for one build.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

from roll_async.errors import WorkspaceError
from roll_async.workspaces.interface import WorkspaceSpec

CONTEXT_REPO = "roll-async/context"
LABEL_CONTEXT = "roll-async.context-hash"
SETUP_FIX = "run scripts/docker_setup.sh (it builds roll-async/swe-base:1) or roll-async build-image"

_build_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def context_hash(dockerfile: Path) -> str:
    """sha256 of the build context (the Dockerfile's folder): every file's relative path, mode and bytes."""
    root = dockerfile.parent
    digest = hashlib.sha256(dockerfile.name.encode())
    for folder, subfolders, files in os.walk(root):
        subfolders.sort()
        for name in sorted(files):
            path = Path(folder) / name
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(oct(path.stat().st_mode & 0o777).encode() + b"\0")
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            digest.update(b"\0")
    return digest.hexdigest()


def _exists(api: Any, ref: str) -> bool:
    import docker.errors

    try:
        api.inspect_image(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


def _lock(key: str) -> threading.Lock:
    with _locks_guard:
        return _build_locks.setdefault(key, threading.Lock())


def ensure_image(api: Any, spec: WorkspaceSpec) -> str:
    """The image reference to start ``spec``'s containers from, building its Dockerfile when missing."""
    if spec.dockerfile is None:
        if not _exists(api, spec.image):
            raise WorkspaceError(
                f"docker image {spec.image!r} is missing on this daemon: {SETUP_FIX}, "
                "or give the spec a dockerfile"
            )
        return spec.image
    dockerfile = Path(spec.dockerfile)
    if not dockerfile.is_file():
        raise WorkspaceError(
            f"dockerfile {dockerfile} of image {spec.image!r} does not exist: fix the task's dockerfile path"
        )
    digest = context_hash(dockerfile)
    ref = f"{CONTEXT_REPO}:{digest[:24]}"
    with _lock(ref):
        if not _exists(api, ref):
            _build(api, dockerfile, ref, digest)
        api.tag(ref, *_split(spec.image))
    return ref


def _split(image: str) -> tuple[str, str]:
    """``repo[:tag]`` -> (repo, tag); a ':' inside a registry's host:port is not a tag."""
    repo, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return image, "latest"
    return repo, tag


def _build(api: Any, dockerfile: Path, ref: str, digest: str) -> None:
    import docker.errors

    log: list[str] = []
    try:
        for entry in api.build(
            path=str(dockerfile.parent),
            dockerfile=dockerfile.name,
            tag=ref,
            labels={LABEL_CONTEXT: digest},
            pull=False,
            rm=True,
            forcerm=True,
            decode=True,
        ):
            if "stream" in entry:
                log.extend(
                    line for line in entry["stream"].splitlines() if line.strip()
                )
            if "error" in entry:
                raise WorkspaceError(
                    f"building image from {dockerfile} failed: {str(entry['error']).strip()} "
                    f"(last step: {_last_step(log)}); fix the Dockerfile, whose FROM must be a local "
                    f"image ({SETUP_FIX})"
                )
    except docker.errors.APIError as exc:
        raise WorkspaceError(
            f"building image from {dockerfile} failed: {exc.explanation or exc}; fix the Dockerfile"
        ) from exc
    if not _exists(api, ref):
        raise WorkspaceError(
            f"building image from {dockerfile} ended without the image {ref} (last step: "
            f"{_last_step(log)}); fix the Dockerfile"
        )


def _last_step(log: list[str]) -> str:
    steps = [line for line in log if line.startswith("Step ")]
    return steps[-1] if steps else (log[-1] if log else "none")
