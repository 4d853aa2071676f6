"""`mlxgraph export`, the built-in tiny models, and export errors as users meet them."""

import json

import mlx.core as mx
import numpy as np
import pytest
import torch
from conftest import tiny_hf_model
from torch import nn

import mlxgraph
from mlxgraph.exporter import AdapterError, UnsupportedOpsError, export
from mlxgraph.exporter.builtins import (
    BUILTINS,
    BYTE_BOS,
    BYTE_EOS,
    build_model,
    builtin_model,
    make_config,
)
from mlxgraph.schema.reader import open_graph
from mlxgraph.tools.cli import main


def _greedy_hf(model, prompt, n):
    from transformers import DynamicCache

    cache, out, x, pos = DynamicCache(config=model.config), [], torch.tensor([prompt]), 0
    with torch.no_grad():
        for _ in range(n):
            logits = model(
                x,
                cache=cache,
                use_cache=True,
                position_ids=torch.arange(pos, pos + x.shape[1])[None],
            ).logits
            pos += x.shape[1]
            out.append(int(logits[0, -1].argmax()))
            x = torch.tensor([[out[-1]]])
    return out


def _shortest_period(seq, longest=8):
    for p in range(1, longest + 1):
        if all(seq[i] == seq[i + p] for i in range(len(seq) - p)):
            return p
    return None


@pytest.mark.parametrize("name", list(BUILTINS))
def test_builtin_greedy_decoding_does_not_fall_into_a_short_loop(name):
    out = _greedy_hf(builtin_model(name), [BYTE_BOS, *b"Once upon a time"], 64)
    assert len(set(out)) >= 24, out
    assert _shortest_period(out[-32:]) is None, out


def test_cli_exports_a_builtin_that_generates_like_hf(tmp_path, capsys):
    path = tmp_path / "tiny.mlxg"
    assert main(["export", "tiny-llama", "-o", str(path), "--max-seq-len", "32", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (
        stats["format_version"]
        and stats["nodes"] > 0
        and stats["file_bytes"] == path.stat().st_size
    )
    assert stats["ops"]["UpdateAndAttend"] == 4
    meta = open_graph(path).metadata
    assert (meta.tokenizer, meta.bos_token_id, meta.eos_token_ids, meta.max_context) == (
        "byte",
        BYTE_BOS,
        (BYTE_EOS,),
        32,
    )
    prompt = [BYTE_BOS, *b"Hi there"]
    want = _greedy_hf(builtin_model("tiny-llama"), prompt, 12)
    session = mlxgraph.load(path).session()
    logits = session.step(mx.array(np.array([prompt], np.int32)), range(len(prompt)))
    got = [int(np.array(logits)[0, -1].argmax())]
    for _ in range(11):
        logits = session.step(mx.array(np.array([[got[-1]]], np.int32)), [session.length])
        got.append(int(np.array(logits)[0, -1].argmax()))
    assert got == want


def test_cli_summary_and_reduced_precision(tmp_path, capsys, tiny_hf_folder):
    path = tmp_path / "bf16.mlxg"
    assert (
        main(
            [
                "export",
                str(tiny_hf_folder("qwen2")),
                "-o",
                str(path),
                "--dtype",
                "bfloat16",
                "--max-seq-len",
                "16",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert out.startswith(f"wrote {path} (") and "nodes      " in out and "max T      16" in out
    for step in ("loading", "torch.export", "decompositions", "lowering", "writing"):
        assert step in err
    graph = open_graph(path)
    weights = [
        graph.tensors[c.tensor] for c in graph.constants if len(graph.tensors[c.tensor].shape) == 2
    ]
    assert {t.dtype for t in weights} == {"bfloat16"}   # (RoPE's inv_freq stays float32, as in HF)
    tokens = torch.randint(4, 256, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = tiny_hf_model("qwen2")(tokens).logits[0].numpy()
    got = mlxgraph.load(path).session().step(mx.array(tokens.numpy().astype(np.int32)), range(9))
    assert got.dtype == mx.bfloat16
    got = np.array(got.astype(mx.float32))[0]
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()   # bf16: ~3 significant digits


@pytest.mark.parametrize("argv, code, needle", [
    (["export", "no-such-model", "-o", "{tmp}/x.mlxg"], 2, "unknown model 'no-such-model'"),
    (["export", "tiny-llama", "-o", "{tmp}/missing/x.mlxg"], 2, "does not exist"),
    (["export", "tiny-llama", "-o", "{tmp}/x.mlxg", "--max-seq-len", "1"], 2, "at least 2"),
    (["export", "tiny-llama", "-o", "{tmp}/x.mlxg", "--max-seq-len", "4097"], 2,
     "--max-seq-len 4097 exceeds the model's max_position_embeddings 4096"),
    (["export", "tiny-llama", "-o", "{tmp}"], 2, "is a folder"),
])
def test_cli_errors_are_one_clear_message(tmp_path, capsys, argv, code, needle):
    assert main([a.format(tmp=tmp_path) for a in argv]) == code
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


class CumsumAct(nn.Module):
    """An activation with an op the exporter has no lowering for."""

    def forward(self, x):
        return torch.cumsum(x, dim=-1)


def test_model_with_an_op_without_lowering_names_the_op_and_its_source(tmp_path):
    model = tiny_hf_model("llama")
    for layer in model.model.layers:
        layer.mlp.act_fn = CumsumAct()
    with pytest.raises(UnsupportedOpsError) as info:
        export(model, tmp_path / "bad.mlxg", max_seq_len=16)
    message = str(info.value)   # one line: the first, where it comes from, how many more
    assert message.startswith("llama: unsupported op aten.cumsum.default (no lowering) at File ")
    assert "test_exporter_cli.py" in message and "in forward" in message
    assert message.endswith("(module model.layers.0.mlp.act_fn); 1 more problem(s)")
    assert [p.location.rsplit("(module ", 1)[1] for p in info.value.problems] == [
        "model.layers.0.mlp.act_fn)", "model.layers.1.mlp.act_fn)"]
    assert not (tmp_path / "bad.mlxg").exists()


def test_checkpoint_lacking_a_weight_is_refused(tmp_path, capsys, tiny_hf_folder):
    from safetensors.torch import load_file, save_file

    source = tiny_hf_folder("llama")
    folder = tmp_path / "partial"
    folder.mkdir()
    (folder / "config.json").write_text((source / "config.json").read_text())
    weights = load_file(source / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    assert main(["export", str(folder), "-o", str(tmp_path / "x.mlxg")]) == 2
    err = capsys.readouterr().err
    assert f"{folder}: the checkpoint lacks 1 weight(s): model.layers.1.mlp.up_proj.weight" in err
    assert not (tmp_path / "x.mlxg").exists()


def test_model_whose_attention_cannot_be_replaced_is_refused(tmp_path):
    # GPT-NeoX-Japanese computes attention itself instead of through transformers'
    # AttentionInterface, and no replacement routes it (exporter/own_attention.py routes
    # GPT-Neo's, XGLM's, BLOOM's and MPT's; Falcon used the interface from transformers 5.25 on).
    model = build_model(make_config("gpt_neox_japanese", num_hidden_layers=1, hidden_size=64,
                                    num_attention_heads=4, vocab_size=256))
    with pytest.raises(AdapterError, match=r"^gpt_neox_japanese: GPTNeoXJapaneseForCausalLM: its "
                       r"attention is not computed through transformers' AttentionInterface "
                       r"\(the implementation cannot be switched\)"):
        export(model, tmp_path / "gnj.mlxg", max_seq_len=16)
    assert model.config._attn_implementation != "mlxgraph"   # left as it was


def test_layer_norm_decoder_in_float16(tmp_path):
    """Phi-2's family: LayerNorm, partial rotary, tanh GELU and biases, exported in float16."""
    config = make_config(
        "phi",
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
        partial_rotary_factor=0.5,
    )
    tokens = torch.randint(4, 256, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = build_model(config).float()(tokens).logits[0].numpy()
    stats = export(build_model(config), tmp_path / "phi.mlxg", dtype="float16", max_seq_len=16)
    assert (
        stats["ops"]["UpdateAndAttend"] == 2 and stats["ops"]["LayerNorm"] == 3
    )  # 1 a layer + final
    got = (
        mlxgraph.load(tmp_path / "phi.mlxg")
        .session()
        .step(mx.array(tokens.numpy().astype(np.int32)), range(9))
    )
    assert got.dtype == mx.float16
    got = np.array(got.astype(mx.float32))[0]
    assert (
        np.abs(got - want).max() < 0.01 * np.abs(want).max()
    )  # float16: HF's own is ~2e-3 off float32
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_the_export_command_freezes_its_objects_before_the_process_exits(tmp_path,
                                                                          monkeypatch):
    """Run as the program (argv None), export leaves its objects to the exit instead of a
    last garbage collection over the trace's (tools/cli.py); called with argv (a caller's
    process that goes on), it does not."""
    import mlxgraph.tools.cli as cli

    frozen = []
    monkeypatch.setattr(cli.gc, "freeze", lambda: frozen.append(True))
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # (no re-run of the process)
    argv = ["export", "tiny-llama", "-o", str(tmp_path / "a.mlxg"), "--max-seq-len", "16"]
    assert main(argv) == 0 and not frozen
    monkeypatch.setattr(cli.sys, "argv", ["mlxgraph", *argv])
    assert main() == 0 and frozen == [True]
