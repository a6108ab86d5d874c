"""Families x checks: run ``check-model``'s checks on every zoo family and write the table.

    PYTHONPATH=. python benchmarks/model_families.py [--families qwen3,llama3] [--out benchmarks/results/model_families.md]

One engine per family (started once); checks at T=1 and at T=0.7/top_p=0.9 on the same engine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time
from pathlib import Path


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _cell(rows, prefix: str) -> str:
    found = [r for r in rows if r.check.startswith(prefix)]
    if not found:
        return "not run"
    row = found[0]
    text = row.detail.split(" (tolerance")[0].replace("|", "\\|")
    return f"{row.status}: {text}" if row.status != "info" else text


async def _run(families: list[str]) -> list[tuple[str, float, list]]:
    from roll_async.model.check import CheckSettings, run_checks
    from roll_async.model.families import build_family_model

    results = []
    for name in families:
        path = build_family_model(name)
        started = time.perf_counter()
        rows = await run_checks(
            str(path),
            CheckSettings(),
            also_sampling=[CheckSettings(temperature=0.7, top_p=0.9)],
        )
        results.append((name, time.perf_counter() - started, rows))
        print(
            name, "FAIL" if any(r.status == "FAIL" for r in rows) else "ok", flush=True
        )
    return results


def main(argv: list[str] | None = None) -> int:
    from roll_async.model.check import (
        LOGPROB_MAX_ABS_TOLERANCE,
        LOGPROB_MEAN_ABS_TOLERANCE,
    )
    from roll_async.model.families import FAMILIES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--out", default="benchmarks/results/model_families.md")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="update an existing --out file (rows of families not re-run are kept); default: refuse",
    )
    args = parser.parse_args(argv)
    from benchmarks.common import ResultFiles

    out_file = Path(args.out)
    ResultFiles.claim(
        out_file.stem,
        [out_file.suffix],
        overwrite=args.overwrite,
        results_dir=out_file.parent,
    )
    families = [f for f in args.families.split(",") if f]
    results = asyncio.run(_run(families))
    load = os.getloadavg()
    lines = [
        "# Model families x checks",
        "",
        "Every zoo family (`roll-async make-tiny-model --family NAME`) through `roll-async check-model`'s checks:",
        "template behaviour, token-in/token-out over a sampled 3-turn conversation, a fresh render of its text,",
        f"engine vs trainer logprobs on the generated tokens (tolerance max {LOGPROB_MAX_ABS_TOLERANCE}, mean",
        f"{LOGPROB_MEAN_ABS_TOLERANCE}; float32 on both sides, the trainer scoring under the engine's sampling transform),",
        "and a weight-sync round trip (perturb the trainer's weights, sync, the engine's greedy output changes and its",
        "logprobs on the prefix-cached prompt match the trainer's).",
        "",
        f"Command: `PYTHONPATH=. python benchmarks/model_families.py --families {','.join(families)}`",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, shared with other jobs (load average at the end "
        f"{load[0]:.1f}); vLLM CPU backend, float32, `enforce_eager`.",
        "",
        'Reading it: "fresh render" is information, not a check: a fresh render of the sampled conversation\'s text',
        "differs from the ids the model saw when the template re-renders history (Qwen3 strips/inserts `<think>`,",
        "Mistral moves the system prompt, Llama-3 and Gemma trim whitespace the random model generated at the ends of",
        'a reply). The ids trained on are always the ones the model saw (token-in/token-out). "seconds" includes the',
        "engine start on the loaded machine.",
        "",
        "| family | summary | append-only | template notes | token-in/token-out | fresh render | logprobs T=1 | logprobs T=0.7, top_p=0.9 | weight sync | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, seconds, rows in results:
        append = _cell(rows, "template append-only")
        verdict = "yes" if append.startswith("yes") else "no"
        notes = append.split(": ", 1)[1] if ": " in append else ""
        lines.append(
            f"| {name} | {_escape(FAMILIES[name].summary)} | {verdict} | {_escape(notes)} | {_cell(rows, 'token-in/token-out')} | "
            f"{_cell(rows, 'fresh render')} | {_cell(rows, 'engine vs trainer logprobs (T=1.0')} | "
            f"{_cell(rows, 'engine vs trainer logprobs (T=0.7')} | {_cell(rows, 'weight sync')} | {seconds:.0f} |"
        )
        failed = [r for r in rows if r.status == "FAIL"]
        if failed:
            lines.append(
                f"| {name} failures | "
                + "; ".join(f"{r.check}: {r.detail} (fix: {r.fix})" for r in failed)
                + " |||||||||"
            )
    out = Path(args.out)
    if out.is_file():  # keep the rows of families not re-run now (a re-run of one family updates its row)
        rerun = {name for name, _, _ in results}
        kept = [
            line
            for line in out.read_text().splitlines()
            if line.startswith("| ")
            and not line.startswith("| family")
            and line.split(" | ")[0][2:].split(" ")[0] in set(FAMILIES) - rerun
        ]
        lines += kept
        lines[9] = (
            lines[9]
            + f" (rows of {', '.join(sorted(set(FAMILIES) - rerun))} from an earlier run of the same command)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 1 if any(r.status == "FAIL" for _, _, rows in results for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
