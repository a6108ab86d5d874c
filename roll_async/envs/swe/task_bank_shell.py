"""The shipped shell tasks: scripts that print the wrong thing, broken configs, a missing permission, a misnamed file.

Terminal work is more than editing Python, so part of the shipped set asks for what an operator
does in a shell (fix a script's output, repair a config file, ``chmod``, ``mv``); the hidden tests
run the scripts and read the files the way a user would. Same record as :mod:`.task_bank`.
"""

from __future__ import annotations

from roll_async.envs.swe.task_bank import BankTask

_RUN = (
    "import configparser\nimport json\nimport pathlib\nimport subprocess\nimport tomllib\n\n\n"
    "def run(*cmd):\n    return subprocess.run(cmd, capture_output=True, text=True, timeout=20)\n"
)


def shell_task(
    name: str,
    instruction: str,
    files: dict[str, str],
    tests: str,
    fail: tuple[str, ...],
    passing: tuple[str, ...],
    *,
    fixed: dict[str, str] | None = None,
    renames: dict[str, str] | None = None,
    executable: tuple[str, ...] = (),
    modes: dict[str, int] | None = None,
) -> BankTask:
    """A shell task; ``tests`` are test functions that use the ``run`` helper and the imports of ``_RUN``."""
    return BankTask(
        name=name,
        category="shell",
        instruction=instruction,
        files=files,
        fixed=fixed or {},
        renames=renames or {},
        executable=executable,
        tests=_RUN + "\n\n" + tests,
        fail_to_pass=fail,
        pass_to_pass=passing,
        modes=modes or {},
    )


SHELL_TASKS: tuple[BankTask, ...] = (
    shell_task(
        "greet_script",
        "Make `greet.sh` print exactly `Hello, World!` (with the comma and the exclamation mark) when run with `bash greet.sh`.",
        {"greet.sh": '#!/bin/bash\necho "Hello World"\n'},
        "def test_output():\n    assert run('bash', 'greet.sh').stdout == 'Hello, World!\\n'\n\n\n"
        "def test_runs():\n    assert run('bash', 'greet.sh').returncode == 0\n",
        ("test_output",),
        ("test_runs",),
        fixed={"greet.sh": '#!/bin/bash\necho "Hello, World!"\n'},
    ),
    shell_task(
        "sum_numbers",
        "`bash sum.sh` should print the sum of the numbers in `numbers.txt` (one per line), but it prints how many there are. Fix the script.",
        {
            "sum.sh": '#!/bin/bash\ntotal=0\nwhile read -r line; do\n  total=$((total + 1))\ndone < numbers.txt\necho "$total"\n',
            "numbers.txt": "4\n8\n15\n16\n23\n42\n",
        },
        "def test_sum():\n    assert run('bash', 'sum.sh').stdout.strip() == '108'\n\n\n"
        "def test_data_untouched():\n    assert pathlib.Path('numbers.txt').read_text() == '4\\n8\\n15\\n16\\n23\\n42\\n'\n",
        ("test_sum",),
        ("test_data_untouched",),
        fixed={
            "sum.sh": '#!/bin/bash\ntotal=0\nwhile read -r line; do\n  total=$((total + line))\ndone < numbers.txt\necho "$total"\n'
        },
    ),
    shell_task(
        "count_lines",
        "`bash count.sh` should print the number of lines in `data.txt`; it prints the number of words instead.",
        {
            "count.sh": "#!/bin/bash\nwc -w < data.txt\n",
            "data.txt": "alpha beta\ngamma\ndelta epsilon zeta\n",
        },
        "def test_lines():\n    assert run('bash', 'count.sh').stdout.strip() == '3'\n\n\n"
        "def test_exit():\n    assert run('bash', 'count.sh').returncode == 0\n",
        ("test_lines",),
        ("test_exit",),
        fixed={"count.sh": "#!/bin/bash\nwc -l < data.txt\n"},
    ),
    shell_task(
        "json_config",
        "`python3 app.py` crashes while reading `config.json`. Fix the config file (not the program) so that it prints `localhost:8080`.",
        {
            "app.py": "import json\n\nconfig = json.load(open('config.json'))\nprint(f\"{config['host']}:{config['port']}\")\n",
            "config.json": '{\n  "host": "localhost",\n  "port": 8080,\n}\n',
        },
        "def test_app():\n    assert run('python3', 'app.py').stdout.strip() == 'localhost:8080'\n\n\n"
        "def test_program_unchanged():\n    assert 'json.load' in pathlib.Path('app.py').read_text()\n",
        ("test_app",),
        ("test_program_unchanged",),
        fixed={"config.json": '{\n  "host": "localhost",\n  "port": 8080\n}\n'},
    ),
    shell_task(
        "env_debug",
        "The service reads `settings.env`. It must run with debugging turned off (`DEBUG=false`); keep the other settings as they are.",
        {"settings.env": "DEBUG=true\nWORKERS=4\nLOG_LEVEL=info\n"},
        "def settings():\n    lines = pathlib.Path('settings.env').read_text().split()\n"
        "    return dict(line.split('=', 1) for line in lines)\n\n\n"
        "def test_debug_off():\n    assert settings()['DEBUG'] == 'false'\n\n\n"
        "def test_others_kept():\n    s = settings()\n    assert s['WORKERS'] == '4' and s['LOG_LEVEL'] == 'info'\n",
        ("test_debug_off",),
        ("test_others_kept",),
        fixed={"settings.env": "DEBUG=false\nWORKERS=4\nLOG_LEVEL=info\n"},
    ),
    shell_task(
        "make_executable",
        "Running `./run.sh` fails with 'Permission denied'. Make it runnable as `./run.sh` without changing what it prints.",
        {"run.sh": "#!/bin/bash\necho ok\n"},
        "def test_direct():\n    assert run('./run.sh').stdout == 'ok\\n'\n\n\n"
        "def test_with_bash():\n    assert run('bash', 'run.sh').stdout == 'ok\\n'\n",
        ("test_direct",),
        ("test_with_bash",),
        executable=("run.sh",),
    ),
    shell_task(
        "rename_input",
        "`python3 process.py` fails: it reads `data/input.csv`, but the file was saved under another name in `data/`. Put the file where the program expects it.",
        {
            "process.py": "rows = open('data/input.csv').read().splitlines()\nprint(f'{len(rows)} rows')\n",
            "data/input.txt": "a,1\nb,2\nc,3\n",
        },
        "def test_process():\n    assert run('python3', 'process.py').stdout.strip() == '3 rows'\n\n\n"
        "def test_program_present():\n    assert pathlib.Path('process.py').is_file()\n",
        ("test_process",),
        ("test_program_present",),
        renames={"data/input.txt": "data/input.csv"},
    ),
    shell_task(
        "reverse_args",
        "`bash rev.sh a b c` should print its arguments in reverse order, space-separated (`c b a`); it prints them in the given order.",
        {"rev.sh": '#!/bin/bash\necho "$@"\n'},
        "def test_reverse():\n    assert run('bash', 'rev.sh', 'a', 'b', 'c').stdout.strip() == 'c b a'\n\n\n"
        "def test_single():\n    assert run('bash', 'rev.sh', 'x').stdout.strip() == 'x'\n",
        ("test_reverse",),
        ("test_single",),
        fixed={
            "rev.sh": '#!/bin/bash\nout=()\nfor arg in "$@"; do\n  out=("$arg" "${out[@]}")\ndone\necho "${out[@]}"\n'
        },
    ),
    shell_task(
        "ini_port",
        "The server must listen on port 8080, but `server.ini` says otherwise. Fix the config; keep its host setting.",
        {"server.ini": "[server]\nhost = 0.0.0.0\nport = 80\n"},
        "def config():\n    parser = configparser.ConfigParser()\n    parser.read('server.ini')\n    return parser['server']\n\n\n"
        "def test_port():\n    assert config().getint('port') == 8080\n\n\n"
        "def test_host():\n    assert config()['host'] == '0.0.0.0'\n",
        ("test_port",),
        ("test_host",),
        fixed={"server.ini": "[server]\nhost = 0.0.0.0\nport = 8080\n"},
    ),
    shell_task(
        "upper_file",
        "`bash upper.sh` should write the contents of `input.txt` in upper case to `output.txt`; it writes lower case.",
        {
            "upper.sh": "#!/bin/bash\ntr 'A-Z' 'a-z' < input.txt > output.txt\n",
            "input.txt": "Shell Tasks Are Fun\n",
        },
        "def test_upper():\n    run('bash', 'upper.sh')\n    assert pathlib.Path('output.txt').read_text() == 'SHELL TASKS ARE FUN\\n'\n\n\n"
        "def test_input_kept():\n    assert pathlib.Path('input.txt').read_text() == 'Shell Tasks Are Fun\\n'\n",
        ("test_upper",),
        ("test_input_kept",),
        fixed={"upper.sh": "#!/bin/bash\ntr 'a-z' 'A-Z' < input.txt > output.txt\n"},
    ),
    shell_task(
        "toml_timeout",
        "`config.toml` must give `timeout` as the integer 30 (the loader rejects text); it is written as a string. Keep `retries`.",
        {"config.toml": 'timeout = "30"\nretries = 3\n'},
        "def test_timeout_int():\n    assert tomllib.loads(pathlib.Path('config.toml').read_text())['timeout'] == 30\n\n\n"
        "def test_retries():\n    assert tomllib.loads(pathlib.Path('config.toml').read_text())['retries'] == 3\n",
        ("test_timeout_int",),
        ("test_retries",),
        fixed={"config.toml": "timeout = 30\nretries = 3\n"},
    ),
)
