"""Write requirements.lock from a pip resolution report (`pip install --dry-run --report`).

`make lock` resolves every extra the Makefile installs (runtime, export, dev, serve, bench)
plus the build requirements in a clean virtual environment, then calls this script. The
lock holds one exact version per package; `make venv` installs with it as a pip constraint
file, so a release made after the lock changes nothing until `make lock` is run on purpose.
"""

import json
import platform
import re
import sys
from datetime import date
from pathlib import Path


def canonical_name(name: str) -> str:
    """PEP 503's normalised project name (the form pip compares)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_lines(report: dict, skip: set[str]) -> list[str]:
    """`name==version` for every package the report installs, sorted, local labels dropped
    (torch's `+cpu` wheel satisfies `torch==2.13.0`; the label is where it came from)."""
    pins = {}
    for item in report["install"]:
        meta = item["metadata"]
        name = canonical_name(meta["name"])
        if name in skip:
            continue
        pins[name] = meta["version"].split("+")[0]
    return [f"{name}=={pins[name]}" for name in sorted(pins)]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: write_lock.py REPORT.json OUT.lock", file=sys.stderr)
        return 2
    report = json.loads(Path(argv[1]).read_text())
    lines = locked_lines(report, skip={"mlxgraph"})
    env = report.get("environment", {})
    header = [
        "# The exact versions that make venv, make test, .ci/run, make demo and make bench",
        "# install (pip constraints). Regenerate on purpose with `make lock`, commit the result.",
        f"# Resolved {date.today().isoformat()} for Python {env.get('python_full_version', '?')}"
        f" on {env.get('sys_platform', sys.platform)} {platform.machine()}.",
    ]
    Path(argv[2]).write_text("\n".join(header + lines) + "\n")
    print(f"{argv[2]}: {len(lines)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
