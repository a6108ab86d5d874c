"""The code sandbox's files: a program gets a private, size-limited place to write and nothing else."""

from __future__ import annotations

import glob
import os
import uuid

import pytest

from roll_async.workspaces import sandbox
from roll_async.workspaces.sandbox import SandboxLimits, file_isolation, run_python

LIMITS = SandboxLimits(cpu_s=2, wall_s=20)
#: World-writable places on a Linux host where one program could leave data for the next.
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


@pytest.fixture
def marker():
    name = f"roll_async_sandbox_{uuid.uuid4().hex}"
    yield name
    for directory in SHARED_DIRS:  # whatever the code under test left on the host
        for path in glob.glob(os.path.join(directory, name + "*")):
            os.remove(path)


def test_a_file_one_program_writes_is_gone_for_the_next(marker):
    write = (
        "import os\n"
        f"for d in {SHARED_DIRS!r} + (os.environ.get('TMPDIR', '/tmp'), os.environ.get('HOME', '/tmp'), '.'):\n"
        "    try:\n"
        f"        open(os.path.join(d, {marker!r}), 'w').write('secret')\n"
        "        print('wrote', d)\n"
        "    except OSError as e:\n"
        "        print('refused', d, e)\n"
    )
    first = run_python(write, LIMITS)
    assert first.status == "ok", first.report()
    assert "wrote /tmp" in first.stdout, "a program must have somewhere to write"
    read = (
        "import os\n"
        f"for d in {SHARED_DIRS!r} + (os.environ.get('TMPDIR', '/tmp'), os.environ.get('HOME', '/tmp'), '.'):\n"
        f"    print(d, os.path.exists(os.path.join(d, {marker!r})))\n"
    )
    second = run_python(read, LIMITS)
    assert second.status == "ok", second.report()
    assert " True" not in second.stdout, second.stdout
    assert not [d for d in SHARED_DIRS if os.path.exists(os.path.join(d, marker))], (
        "the host keeps nothing a program wrote"
    )


def test_a_program_cannot_write_past_the_size_limit(marker):
    # 4 KiB files (under the per-file RLIMIT_FSIZE) until the disk says no, at most 64 MiB
    fill = (
        "import os\nwritten = 0\n"
        "try:\n"
        "    for i in range(16384):\n"
        f"        with open(os.path.join('/tmp', {marker!r} + str(i)), 'wb') as f:\n"
        "            f.write(b'x' * 4096)\n"
        "        written += 4096\n"
        "except OSError as e:\n"
        "    print('stopped:', e)\n"
        "print(written)\n"
    )
    result = run_python(fill, LIMITS)
    assert "stopped:" in result.stdout, result.report()
    written = int(result.stdout.split()[-1])
    assert 0 < written <= SandboxLimits().disk_mb * 1024 * 1024
    assert not glob.glob(os.path.join("/tmp", marker + "*"))


def test_the_rest_of_the_filesystem_is_read_only():
    if file_isolation() != "tmpfs":
        pytest.skip("no mount namespace here: only the temp-dir fallback holds")
    probe = (
        "import os\nopen('/tmp/ok', 'w').write('x')\n"
        "for d in ('/', '/usr', '/etc', '/root', '/var', '/run'):\n"
        "    try:\n"
        "        open(os.path.join(d, 'roll_async_probe'), 'w').write('x')\n"
        "        print('WROTE', d)\n"
        "    except OSError:\n"
        "        pass\n"
    )
    result = run_python(probe, LIMITS)
    assert result.status == "ok" and "WROTE" not in result.stdout, result.report()


def test_without_a_mount_namespace_home_and_tmpdir_are_a_temp_dir_deleted_afterwards(
    monkeypatch,
):
    monkeypatch.setattr(sandbox, "file_isolation", lambda: "temp_dir")
    code = (
        "import os\nhome = os.environ['HOME']\n"
        "assert home == os.environ['TMPDIR'] == os.getcwd() != '/tmp'\n"
        "open(os.path.join(home, 'left'), 'w').write('x')\nprint(home)\n"
    )
    result = run_python(code, LIMITS)
    assert result.status == "ok", result.report()
    assert not os.path.exists(result.stdout.strip())
