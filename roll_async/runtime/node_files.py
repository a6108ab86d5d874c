"""Getting a driver-side directory to every node: a checked shared path, or the object store.

Workers load the tokenizer and engines the whole model from a directory that,
on a cluster, is often on the driver's disk only; the driver ``ray.put``s the
files once and a process on another node uses the path where it exists there,
or a per-content cache of the files where it does not.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

#: Files a tokenizer may need (transformers' names); weights and other large files are never included.
TOKENIZER_FILE_PATTERNS = (
    "tokenizer*",
    "special_tokens_map.json",
    "vocab*",
    "merges.txt",
    "added_tokens.json",
    "chat_template*",
    "config.json",
    "generation_config.json",
    "*.model",
)
#: A tokenizer file larger than this is not shipped (a sentencepiece model is a few MB; weights are far larger).
MAX_FILE_BYTES = 64 << 20


def directory_files(
    directory: str,
    patterns: Iterable[str] = ("**/*",),
    max_file_bytes: int | None = None,
) -> dict[str, bytes]:
    """Files of a local directory matching ``patterns`` (relative path -> bytes); {} if it is not a local directory."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        return {}
    files: dict[str, bytes] = {}
    for pattern in patterns:
        for path in root.glob(pattern):
            if path.is_file() and (
                max_file_bytes is None or path.stat().st_size <= max_file_bytes
            ):
                files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def tokenizer_files(directory: str) -> dict[str, bytes]:
    """The tokenizer files of a local model directory (name -> bytes); {} if it is not a local directory."""
    return directory_files(directory, TOKENIZER_FILE_PATTERNS, MAX_FILE_BYTES)


def model_files(directory: str) -> dict[str, bytes]:
    """Every file of a local model directory (weights included: heavy for a large model); {} if not local."""
    return directory_files(directory)


def path_is_on_this_node(directory: str) -> bool:
    """True if ``directory`` exists here, or is no local path at all (a hub id: nothing to ship)."""
    return Path(directory).expanduser().is_dir() or not directory.startswith(
        ("/", ".", "~")
    )


def local_dir(directory: str, files: Mapping[str, bytes] | None) -> str:
    """``directory`` if it exists on this node, else ``files`` written to a node-local cache dir (see module doc).

    EnvManagerWorkers load the tokenizer from the model directory; engine replicas
    load the whole model from it. On a cluster that directory is often on the
    driver's disk only. The driver reads the directory's files once
    (``tokenizer_files`` for workers: the small tokenizer files; ``model_files`` for
    engines: every file), ``ray.put``s them once, and the process on the other node
    calls ``local_dir``: if the path exists on its node (a shared filesystem, or one
    machine) it is used as is; otherwise the files are written to a per-content
    cache directory on that node and that is used. Model weights go through the
    object store only to an engine whose node lacks the path
    (``engine_actor.launch_engines`` asks each replica first): for a large model a
    shared path is far cheaper (see docs/architecture.md "Placement across nodes").
    """
    if Path(directory).expanduser().is_dir() or not files:
        return directory  # shared or local path (a hub id or a missing path fails in load_tokenizer, naming it)
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode())
        digest.update(files[name])
    target = (
        Path(tempfile.gettempdir()) / "roll_async_node_files" / digest.hexdigest()[:16]
    )
    if not (target / ".complete").exists():
        # Written aside and renamed into place: replicas on one node may materialise the same files at once.
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
        for name, data in files.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes(data)
        (staging / ".complete").write_text(directory)
        try:
            staging.rename(target)
        except OSError:  # another process put it there first (or an old incomplete copy): use or replace it
            if not (target / ".complete").exists():
                shutil.rmtree(target, ignore_errors=True)
                staging.rename(target)
            else:
                shutil.rmtree(staging, ignore_errors=True)
    return str(target)
