"""Shared by the tools' tests: the command line run in-process, and real exported graphs."""

from mlxgraph.tools.cli import main

_EXPORTS = {}


def run_cli(capsys, *argv):
    """Run ``mlxgraph ARGV`` in this process; returns (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def exported_tiny_llama(tmp_path_factory) -> dict:
    """{'float32': path, 'float16': path}: the built-in tiny-llama exported in each dtype.

    Exported once per test session (several test modules compare the two), into a
    session temporary folder; callers must not modify the files.
    """
    if not _EXPORTS:
        from mlxgraph.exporter import export

        folder = tmp_path_factory.mktemp("exported-tiny-llama")
        for dtype in ("float32", "float16"):
            path = folder / f"tiny-llama-{dtype}.mlxg"
            export("tiny-llama", str(path), dtype=dtype)
            _EXPORTS[dtype] = path
    return dict(_EXPORTS)
