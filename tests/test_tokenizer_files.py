"""The tokenizer a graph carries: embedded files, a folder a file names (never read),
--tokenizer DIR, and hostile tokenizer files refused in one line."""

import json

import pytest
from synthetic_graphs import llama
from tool_helpers import generate_cli as _cli
from tool_helpers import synthetic_graph as _graph

from mlxgraph.interpreter.text.tokenizer import load_tokenizer


def test_cli_prompt_with_embedded_tokenizer(tmp_path, hf_folder):
    from mlxgraph.schema.tokenizer_files import read_tokenizer_folder

    graph = _graph(
        tmp_path / "hf.mlxg",
        tokenizer="embedded",
        vocab=300,
        files=read_tokenizer_folder(hf_folder),
    )
    proc = _cli(graph, "--prompt", "once upon a time", "--max-tokens", 4, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    tok = load_tokenizer(None, folder=hf_folder)
    assert doc["prompt_ids"] == tok.encode("once upon a time")
    assert doc["text"] == tok.decode(doc["token_ids"])


def test_cli_never_reads_a_folder_the_graph_names(tmp_path, hf_folder):
    # An older export recorded its folder: a file must not make generate read a path it names.
    graph = _graph(tmp_path / "old.mlxg", tokenizer=hf_folder, vocab=300)
    proc = _cli(graph, "--prompt", "once upon a time", "--max-tokens", 2)
    assert (
        proc.returncode == 2
        and "--tokenizer DIR" in proc.stderr
        and str(hf_folder) not in proc.stderr
    )
    proc = _cli(
        graph, "--prompt", "once upon a time", "--max-tokens", 2, "--json", "--tokenizer", hf_folder
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["prompt_ids"] == load_tokenizer(None, folder=hf_folder).encode(
        "once upon a time"
    )


@pytest.mark.parametrize(
    "files, message",
    [
        ({"tokenizer.json": "{not json"}, "tokenizer.json is not valid JSON"),
        (
            {
                "tokenizer.json": None,
                "tokenizer_config.json": json.dumps(
                    {"chat_template": "{{ ''.__class__.__mro__[1].__subclasses__() }}"}
                ),
            },
            "chat template (tokenizer_config.json) failed",
        ),
        (
            {
                "tokenizer.json": None,
                "tokenizer_config.json": json.dumps(
                    {"chat_template": "{{ raise_exception('roles must alternate') }}"}
                ),
            },
            "roles must alternate",
        ),
    ],
)
def test_hostile_tokenizer_files_are_refused_in_one_line(tmp_path, hf_folder, files, message):
    files = {k: v if v is not None else (hf_folder / k).read_text() for k, v in files.items()}
    graph = _graph(tmp_path / "hostile.mlxg", tokenizer="embedded", vocab=300, files=files)
    proc = _cli(graph, "--prompt", "hello", "--max-tokens", 2)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr


def test_tokenizer_files_travel_in_the_metadata(tmp_path, hf_folder):
    from mlxgraph.schema.reader import open_graph
    from mlxgraph.schema.tokenizer_files import read_tokenizer_folder

    files = read_tokenizer_folder(hf_folder)
    graph = _graph(tmp_path / "t.mlxg", tokenizer="embedded", vocab=300, files=files)
    meta = open_graph(graph).metadata
    assert meta.tokenizer_files == files and not any(
        k.startswith("tokenizer_file:") for k in meta.extra
    )
    spec = llama(vocab=300, hidden=64, intermediate=128, seed=0, tied=False, max_context=256)
    spec.metadata.extra = {"tokenizer_file:x": "y"}
    with pytest.raises(ValueError, match="reserved"):
        spec.write(tmp_path / "clash.mlxg")
