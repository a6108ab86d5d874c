"""Getting a driver-side directory (the tokenizer's) to every node: a checked shared path, or the object store.

EnvManagerWorkers load the tokenizer from the model directory. On a cluster that
directory is often on the driver's disk only. The driver reads the directory's
small tokenizer files once (``tokenizer_files``), ``ray.put``s them once, and
every worker calls ``local_dir``: if the path exists on its node (a shared
filesystem, or one machine) it is used as is; otherwise the files are written to
a per-content cache directory on that node and that is used. Model WEIGHTS are
not shipped this way (engine replicas read ``model.path`` on their node, which
must then be a shared path; see docs/architecture.md "Placement across nodes").
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping
from pathlib import Path

#: Files a tokenizer may need (transformers' names); weights and other large files are never included.
TOKENIZER_FILE_PATTERNS = (
    "tokenizer*", "special_tokens_map.json", "vocab*", "merges.txt", "added_tokens.json", "chat_template*",
    "config.json", "generation_config.json", "*.model",
)
#: A tokenizer file larger than this is not shipped (a sentencepiece model is a few MB; weights are far larger).
MAX_FILE_BYTES = 64 << 20


def tokenizer_files(directory: str) -> dict[str, bytes]:
    """The tokenizer files of a local model directory (name -> bytes); {} if it is not a local directory."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        return {}
    files: dict[str, bytes] = {}
    for pattern in TOKENIZER_FILE_PATTERNS:
        for path in root.glob(pattern):
            if path.is_file() and path.stat().st_size <= MAX_FILE_BYTES:
                files[path.name] = path.read_bytes()
    return files


def local_dir(directory: str, files: Mapping[str, bytes] | None) -> str:
    """``directory`` if it exists on this node, else ``files`` written to a node-local cache dir (see module doc)."""
    if Path(directory).expanduser().is_dir() or not files:
        return directory  # shared or local path (a hub id or a missing path fails in load_tokenizer, naming it)
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode())
        digest.update(files[name])
    target = Path(tempfile.gettempdir()) / "roll_async_node_files" / digest.hexdigest()[:16]
    if not (target / ".complete").exists():
        target.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (target / name).write_bytes(data)
        (target / ".complete").write_text(directory)
    return str(target)
