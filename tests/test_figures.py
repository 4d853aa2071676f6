"""`make figures`: every benchmark it runs exists, takes --json, and has a printer that
prints its document (the printers split out of the benchmarks' main, checked on small
hand-made documents shaped as the benchmarks write them)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import figures  # noqa: E402

_STAT = {"min_ms": 1.0, "median_ms": 2.0}
DOCS = {
    "quantize_export": {
        "cpu": "x86", "cpus": 2, "size": "small", "parameters": 155730944, "runs": 1,
        "folder_bytes": 622932176, "load_start": 4.0, "load_end": 4.5,
        "rows": [{"mode": "q4", "engine": e, "seconds": 9.0, "peak_rss_bytes": 2**30,
                  "out_bytes": 88_000_000, "load_before": 4.0, "load_after": 4.2,
                  "steps": {"torch.export": 2.0} if e == "mlxgraph" else None}
                 for e in ("mlxgraph", "mlx-lm")],
        "ratios": {"q4": {"time": 1.0, "memory": 1.0}},
    },
    "session_state": {
        "graph": "/x/small.mlxg", "blas": "openblas", "context": 4096,
        "fork": {"fork_seconds": 1e-4, "copy_all_buffers_seconds": 0.1, "copy_over_fork": 1e3,
                 "first_step_after_fork_seconds": 0.05, "decode_step_seconds": 0.04},
        "save_restore": {"save_seconds": 0.5, "file_bytes": 2**27, "restore_seconds": 0.2,
                         "prefill_seconds": 9.0, "prefill_over_restore": 45.0},
        "quantized_kv": {"float32": {"bytes_per_token": 65536, "bytes_vs_float32": 1.0,
                                     "logits_error_over_range": 0.0, "greedy_agreement": 1.0}},
    },
    "pipeline": {
        "size": "small", "config": {"num_hidden_layers": 8, "hidden_size": 1024}, "cores": 2,
        "prompt_tokens": 128, "new_tokens": 64, "load_average": 0.5,
        "rows": [{"ranks": "1 (plain)", "weight_bytes": [None], "peak_memory_bytes": [2**30],
                  "prefill_tps": 900.0, "decode_tps": 40.0, "decode_ratio": 1.0,
                  "same_tokens": True}],
    },
    "norm_rope": {
        "kernel": "avx512", "ops": {"rmsnorm": {"native": _STAT, "mlx": _STAT}},
        "prefill_in_turns": {"native": _STAT, "mlx": _STAT},
        "prefill_processes": {"on": _STAT, "off": _STAT},
    },
    "tile": {"load_average": [0.3, 0.2, 0.1], "threads": {"1": {"blas": "openblas", "shapes": {
        "32x1024x1024": {"tile": [1e-3, 2e-3], "sgemm": [2e-3, 3e-3], "torch": [2e-3, 3e-3],
                         "picks_tile": True}}}}},
    "step_build": {
        "steps": 64, "prompt": 128, "device": "Device(cpu, 0)", "load_average": [0.4, 0.3, 0.2],
        "mlxgraph": {"build_ms": 1.5, "build_ms_best": 1.2, "eval_ms": 20.0, "eval_ms_best": 19.0},
        "mlx-lm": {"build_ms": 1.0, "build_ms_best": 0.9, "eval_ms": 40.0, "eval_ms_best": 38.0},
    },
    "state": {
        "prompt": 256, "new_tokens": 48, "runs": 2, "load": [0.5, 0.6],
        "results": [{"model": "mamba2", "params": 47_000_000, "prefill_ratio": 16.2,
                     "decode_ratio": 1.96, "greedy_agree": 2, "state_bytes": 4958208,
                     "kv_bytes_per_token": 0,
                     "mlxgraph": {"prefill_tps": 193.3, "decode_tps": 19.0, "tokens": [1, 2]},
                     "mlx_lm": {"prefill_tps": 11.9, "decode_tps": 9.7, "tokens": [1, 2]}}],
    },
    "batch": {
        "size": "small", "new_tokens": 24, "prompt_tokens": 64, "load_average": [0.5, 0.6],
        "mlxgraph": {"rows": [{"batch": 1, "identical_rows": 1,
                               "batched": {"tok_s": 29.0, "step_ms": 34.0},
                               "sequential": {"tok_s": 29.0}}]},
        "mlx-lm": {"rows": [{"batch": 1, "batched": {"tok_s": 30.0}}]},
    },
}


@pytest.mark.parametrize("name", sorted(figures.FIGURES))
def test_each_figure_has_a_script_and_a_printer(name):
    argv, print_name, _ = figures.FIGURES[name]
    assert (BENCH / argv[0]).is_file()
    assert callable(figures.printer(print_name))
    source = (BENCH / argv[0]).read_text()
    assert '"--json"' in source, f"{argv[0]} has no --json"


@pytest.mark.parametrize("name", sorted(DOCS))
def test_split_printers_print_their_documents(name, capsys):
    figures.printer(figures.FIGURES[name][1])(DOCS[name])
    out = capsys.readouterr().out
    assert out.count("\n") >= 2, out


def test_unknown_figure_is_refused():
    done = subprocess.run([sys.executable, str(BENCH / "figures.py"), "--only", "nope"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "unknown benchmark 'nope'" in done.stderr


def test_only_replaces_its_own_sections(tmp_path):
    """`--only batch` keeps the other tables of the file as they were, in FIGURES order."""
    out = tmp_path / "figures.md"
    kept = "## quantized: q\n\n```text\nold quantized table\n```\n"
    out.write_text(figures.HEADER + "## generate: g\n\nold\n\n" + kept)
    sections = figures.existing_sections(out)
    assert sections["quantized"] == kept and set(sections) == {"generate", "quantized"}
    sections["generate"] = "## generate: g\n\nnew\n"
    text = figures.HEADER + "\n".join(sections[n] for n in figures.FIGURES if n in sections)
    assert text.index("new") < text.index("old quantized table")
