"""The text options, declared once and typed: SessionOptions and SamplingOptions refuse bad
values naming the field (the command line naming the flag); generate, chat and serve take
their options from one table with one default each (serve's two of its own are declared in
the row); and the docs list exactly the options each command takes.
"""

import argparse
import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from tool_helpers import run_cli

from mlxgraph.generation.defaults import DEFAULT_MAX_TOKENS, DEFAULT_PREFILL_CHUNK
from mlxgraph.generation.options import OptionError, SamplingOptions, SessionOptions
from mlxgraph.tools import chat_cmd, generate_cmd, serve_cmd
from mlxgraph.tools.option_table import OPTIONS
from mlxgraph.tools.text_options import sampling_options, session_options

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"generate": generate_cmd, "chat": chat_cmd, "serve": serve_cmd}


def parser(command) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    COMMANDS[command].add_arguments(p)
    return p


@pytest.mark.parametrize("settings, message", [
    ({"capacity": 0}, "capacity must be an integer in [1, 2147483647], got 0"),
    ({"capacity": True}, "capacity must be an integer in [1, 2147483647], got True"),
    ({"prefill_chunk": 2.5}, "prefill_chunk must be an integer in [1, 2147483647], got 2.5"),
    ({"kv_dtype": "float64"}, "kv_dtype must be one of float32, float16, bfloat16 (or unset)"),
    ({"kv_bits": 3}, "kv_bits must be one of 4, 8 (or unset), got 3"),
    ({"kv_group_size": 48}, "kv_group_size must be one of 32, 64, 128, got 48"),
    ({"window": 0}, "window must be an integer in [1, 2147483647], got 0"),
])
def test_session_options_refuse_bad_values(settings, message):
    with pytest.raises(OptionError, match=re.escape(message)) as e:
        SessionOptions(**settings)
    assert e.value.option == next(iter(settings))


@pytest.mark.parametrize("settings, message", [
    ({"temperature": -1}, "temperature must be a finite number >= 0, got -1"),
    ({"temperature": float("nan")}, "temperature must be a finite number >= 0, got nan"),
    ({"temperature": "0.5"}, "temperature must be a finite number >= 0, got '0.5'"),
    ({"top_k": -1}, "top_k must be an integer in [0, 2**64), got -1"),
    ({"top_p": 0.0}, "top_p must be a number in (0, 1], got 0.0"),
    ({"top_p": 1.5}, "top_p must be a number in (0, 1], got 1.5"),
    ({"min_p": 1.0}, "min_p must be a number in [0, 1), got 1.0"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a finite number > 0, got 0"),
    ({"seed": 2**64}, "seed must be an integer in [0, 2**64), got 18446744073709551616"),
])
def test_sampling_options_refuse_bad_values(settings, message):
    with pytest.raises(OptionError, match=re.escape(message)) as e:
        SamplingOptions(**settings)
    assert e.value.option == next(iter(settings)) and isinstance(e.value, ValueError)


def test_options_are_frozen_normalised_and_take_mlx_lm_names():
    o = SamplingOptions(temperature=1, top_k=np.int64(3), seed=np.uint64(7))
    assert (o.temperature, o.top_k, o.seed) == (1.0, 3, 7)
    assert type(o.temperature) is float and type(o.top_k) is int and type(o.seed) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.top_k = 5
    with pytest.raises(OptionError, match="top_p"):
        dataclasses.replace(o, top_p=2.0)  # a copy is checked too
    assert SamplingOptions.of(temp=0.5).temperature == 0.5
    with pytest.raises(OptionError, match="not both"):
        SamplingOptions.of(temperature=0.7, temp=0.5)
    assert SessionOptions().prefill_chunk == DEFAULT_PREFILL_CHUNK


@pytest.mark.parametrize("settings", [{"top_k": 40}, {"top_p": 0.9}, {"min_p": 0.1},
                                      {"seed": 1}, {"seed": 0}])
def test_greedy_refuses_what_only_sampling_uses(settings):
    """With temperature 0 the choice is an argmax: a filter or a seed would be silently
    ignored, so it is refused naming the field and saying to give a temperature."""
    name = next(iter(settings))
    for make in (lambda: SamplingOptions(**settings), lambda: SamplingOptions.of(**settings)):
        with pytest.raises(OptionError, match=re.escape(f"{name} has no effect with temperature "
                                                        "0 (greedy choice)")) as e:
            make()
        assert e.value.option == name and "--temp" in str(e.value)
    assert SamplingOptions.of(temp=0.7, **settings).temperature == 0.7  # sampled: fine
    # the library's entry point refuses it the same way, before anything runs
    from mlxgraph.generation.text import stream_generate

    with pytest.raises(OptionError, match=name):
        next(stream_generate(None, "x", **settings))


def test_greedy_takes_the_penalties_and_the_bias():
    """They change the logits before the argmax (tests/test_sampling.py checks the values)."""
    o = SamplingOptions(repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=1.0,
                        logit_bias={3: 5.0})
    assert o.temperature == 0.0 and o.logit_bias == {3: 5.0}


def test_generate_without_temp_refuses_sampling_flags(capsys):
    """docs/generate.md's old example: --min-p and --seed without --temp ran greedy."""
    code, out, err = run_cli(capsys, "generate", "g.mlxg", "--prompt", "Hello", "--min-p", "0.1",
                             "--repetition-penalty", "1.2", "--seed", "1")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("mlxgraph: generate: --min-p has no effect with temperature 0"), err
    assert "--temp" in err
    code, _, err = run_cli(capsys, "chat", "g.mlxg", "--seed", "3")
    assert code == 2 and err.startswith("mlxgraph: chat: --seed has no effect"), err


def test_the_one_sampler_is_checked_by_the_options():
    from mlxgraph.generation.sampling import Sampler, make_sampler

    with pytest.raises(OptionError, match="top_p"):
        Sampler(top_p=0.0)
    assert make_sampler(SamplingOptions(temperature=0.5, seed=5)).seed == 5
    drawn = make_sampler(SamplingOptions(temperature=0.5))  # no seed: one is drawn
    assert isinstance(drawn.seed, int) and 0 <= drawn.seed < 2**31
    assert make_sampler().greedy


def test_one_default_per_option_and_serve_s_own_declared_in_the_row():
    own = {(o.flags[0], c) for o in OPTIONS for c in o.defaults}
    # serve's sampling flags are defaults of requests: unset, each request gets OpenAI's.
    sampling = {(f, "serve") for f in ("--temperature", "--top-k", "--top-p", "--min-p")}
    assert own == {("--max-tokens", "serve"), ("--prefill-chunk", "serve")} | sampling
    for command in COMMANDS:
        p = parser(command)
        for o in OPTIONS:
            if command in o.commands:
                assert p.get_default(o.flags[0].lstrip("-").replace("-", "_")) == \
                    o.default_for(command), (command, o.flags)
    generate, serve = parser("generate"), parser("serve")
    assert generate.get_default("prefill_chunk") == DEFAULT_PREFILL_CHUNK == 512
    assert serve.get_default("prefill_chunk") == 256
    assert generate.get_default("max_tokens") == DEFAULT_MAX_TOKENS
    assert serve.get_default("max_tokens") == 1024
    assert {serve.get_default(f) for f in ("temperature", "top_k", "top_p", "min_p")} == {None}


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_every_command_takes_the_session_options(command):
    prompt = ["--prompt-ids", "1"] if command == "generate" else []
    args = parser(command).parse_args(["g.mlxg", *prompt, "--kv-bits", "8", "--kv-group-size",
                                       "32", "--window", "4", "--capacity", "64"])
    chunk = parser(command).get_default("prefill_chunk")
    assert session_options(args) == SessionOptions(capacity=64, prefill_chunk=chunk, kv_bits=8,
                                                   kv_group_size=32, window=4)


@pytest.mark.parametrize("argv, flag", [
    (["chat", "g.mlxg", "--kv-bits", "3"], "--kv-bits"),
    (["serve", "g.mlxg", "--kv-bits", "16"], "--kv-bits"),
    (["chat", "g.mlxg", "--window", "0"], "--window"),
    (["serve", "g.mlxg", "--kv-group-size", "48"], "--kv-group-size"),
])
def test_bad_session_flags_are_usage_errors(capsys, argv, flag):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"mlxgraph: {argv[0]}: argument {flag}"), err


def test_a_value_the_options_refuse_names_the_flag(capsys):
    code, _, err = run_cli(capsys, "chat", "g.mlxg", "--min-p", "1.5")
    assert code == 2 and err.strip() == "mlxgraph: chat: --min-p must be a number in [0, 1), " \
        "got 1.5"
    args = parser("generate").parse_args(["g.mlxg", "--prompt-ids", "1"])
    assert sampling_options(args) == SamplingOptions()


def _flags(text: str) -> set:
    """The flags in the first cell of a markdown table's rows."""
    rows = [line.split("|")[1] for line in text.splitlines() if line.startswith("| `--")]
    return {f for cell in rows for f in re.findall(r"--[a-z][a-z0-9-]*", cell)}


def _section(path: str, heading: str) -> str:
    text = (ROOT / path).read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def test_the_docs_list_exactly_each_command_s_options():
    documented = {
        "generate": _flags(_section("docs/generate.md", "## `mlxgraph generate`")),
        "chat": _flags(_section("docs/generate.md", "## `mlxgraph chat`")),
        "serve": _flags((ROOT / "docs/serve.md").read_text()),
    }
    for command, flags in documented.items():
        taken = {f for a in parser(command)._actions for f in a.option_strings} - {"-h", "--help"}
        assert flags == taken, (command, sorted(flags ^ taken))
