"""Two processes building the same tiny model at once: the model in place is never deleted under a reader."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from roll_async.model.tiny_build import write_model_dir


class _Part:
    def __init__(self, text: str) -> None:
        self.text = text

    def save_pretrained(self, directory: Path) -> None:
        (Path(directory) / "weights.txt").write_text(self.text)


def test_a_current_build_in_place_is_kept(tmp_path):
    out = tmp_path / "tiny"
    write_model_dir(out, {"v": 1}, _Part("first"))
    inode = (out / "weights.txt").stat().st_ino
    write_model_dir(out, {"v": 1}, _Part("second"))
    assert (out / "weights.txt").stat().st_ino == inode  # a reader's files stay put
    write_model_dir(out, {"v": 2}, _Part("new version"))
    assert (out / "weights.txt").read_text() == "new version"


def test_concurrent_builds_leave_one_whole_model(tmp_path):
    out = tmp_path / "tiny"
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: write_model_dir(out, {"v": 1}, _Part("w")), range(8)))
    assert sorted(p.name for p in out.iterdir()) == [
        "roll_async_build.json",
        "weights.txt",
    ]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tiny.")] == [
        ".tiny.lock"
    ]
