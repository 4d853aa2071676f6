"""`export --tokenizer DIR`: another folder's tokenizer embedded; a graph without one is
said at export (issue 32, item 6)."""

import json

import pytest

import mlxgraph
from mlxgraph.exporter import export
from mlxgraph.exporter.builtins import build_model, make_config
from mlxgraph.exporter.errors import ExportError
from mlxgraph.exporter.tokenizer_source import largest_id
from mlxgraph.tools.cli import main

SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 2}


@pytest.fixture(scope="module")
def bare_folders(tmp_path_factory):
    """{vocab size: a model folder without tokenizer files}."""
    out = {}
    for vocab in (300, 200):
        folder = tmp_path_factory.mktemp(f"bare{vocab}")
        build_model(make_config("llama", vocab_size=vocab, **SHAPE), seed=1).save_pretrained(folder)
        assert not (folder / "tokenizer.json").exists()
        out[vocab] = folder
    return out


def test_a_folder_without_a_tokenizer_exports_with_a_warning(bare_folders, tmp_path, capsys):
    out = tmp_path / "bare.mlxg"
    assert main(["export", str(bare_folders[300]), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "tokenizer  none" in captured.out
    warning = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warning) == 1 and "no tokenizer.json" in warning[0]
    assert "--tokenizer DIR" in warning[0]
    with pytest.raises(mlxgraph.TokenizerError, match="carries no tokenizer"):
        _ = mlxgraph.load(out).tokenizer


def test_export_tokenizer_embeds_the_folders_files(bare_folders, hf_folder, tmp_path, capsys):
    out = tmp_path / "with.mlxg"
    code = main(["export", str(bare_folders[300]), "-o", str(out), "--tokenizer",
                 str(hf_folder), "--json"])
    captured = capsys.readouterr()
    assert code == 0 and "warning" not in captured.err
    assert json.loads(captured.out)["tokenizer"] == "embedded"
    program = mlxgraph.load(out)
    text = "once upon a time"
    from tokenizers import Tokenizer

    expected = Tokenizer.from_file(str(hf_folder / "tokenizer.json")).encode(text).ids
    # the embedded tokenizer is the folder's own (add_bos_token from its config aside)
    assert program.tokenizer.encode(text)[-len(expected):] == expected


def test_a_tokenizer_past_the_vocabulary_is_refused(bare_folders, hf_folder, tmp_path):
    with pytest.raises(ExportError, match=r"ids up to 29\d, past the model's vocabulary of 200"):
        export(bare_folders[200], tmp_path / "x.mlxg", tokenizer=hf_folder)
    assert not (tmp_path / "x.mlxg").exists()


def test_a_folder_without_tokenizer_json_is_refused(bare_folders, tmp_path, capsys):
    code = main(["export", str(bare_folders[300]), "-o", str(tmp_path / "x.mlxg"),
                 "--tokenizer", str(bare_folders[200])])
    err = capsys.readouterr().err.strip().splitlines()
    # refused before the model loads: the error alone, no progress line
    assert code == 2 and len(err) == 1 and "no tokenizer.json" in err[0], err


def test_a_byte_built_in_takes_no_tokenizer(hf_folder, tmp_path):
    with pytest.raises(ExportError, match="tokens are bytes"):
        export("tiny-llama", tmp_path / "x.mlxg", tokenizer=hf_folder)


@pytest.mark.parametrize("doc, top", [
    ({"model": {"vocab": {"a": 0, "b": 7}}, "added_tokens": [{"id": 9}]}, 9),
    ({"model": {"vocab": [["a", 0.0], ["b", -1.0]]}}, 1),
])
def test_largest_id(doc, top):
    assert largest_id(json.dumps(doc)) == top


def test_largest_id_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="no vocabulary"):
        largest_id(json.dumps({"model": {"type": "BPE"}}))
