"""What the adapter cannot express, found before tracing: one line naming where and what.

The adapter turns attention that goes through transformers' ``AttentionInterface`` into
``mlxgraph::update_and_attend``, and short convolutions (LFM2) into
``mlxgraph::causal_conv``. Everything else that carries state across steps (state-space
mixers, linear or gated-delta attention) or changes attention in a way the ops do not
implement would trace into a graph that runs and is wrong, or
fail deep inside torch.export with a page of symbolic guards. :func:`check_model` walks
the model's modules and config first and stops at the first such part with one line,
for example ``model.layers.0.mixer (MambaMixer): state-space layers are not supported``.

The lists below are the one place that says what is refused; tests/test_model_support.py
builds a model for every entry.
"""

import re
import sys
from dataclasses import dataclass

from mlxgraph.exporter.errors import UnsupportedModelError


class AdapterError(UnsupportedModelError):
    """The model uses an attention feature or layer kind the graph cannot express."""


@dataclass(frozen=True)
class ModuleRule:
    """Modules the graph cannot run: matched by class name and, optionally, an attribute."""

    class_pattern: str  # re.search on the class name ("" for any class)
    feature: str  # what is missing, as the message says it
    attribute: str = ""  # also require an attribute (parameter, submodule) of this name
    # A parent class (re.search) under which the module is supported after all.
    parent_exempt: str = ""
    # A hook of the module's (or, for parent_exempt rules, its parent's) modeling file that
    # the adapter routes to an op (exporter/state_adapter.py): then it is supported.
    # (Empty with exempt_classes: the classes alone are exempt, their forward replaced.)
    exempt_hook: tuple = ()
    # The classes (re.search) exempt_hook applies to: the families checked against
    # transformers (another file's copy of a hook may differ).
    exempt_classes: str = ""

    def matches(self, module, parent=None) -> bool:
        """Whether ``module`` (a child of ``parent``) is one this rule refuses."""
        if not re.search(self.class_pattern, type(module).__name__):
            return False
        if self.parent_exempt and parent is not None and (
                re.search(self.parent_exempt, type(parent).__name__)
                or (has_hook(parent, self.exempt_hook)
                    and re.search(self.exempt_classes, type(parent).__name__))):
            return False
        if (not self.parent_exempt and self.exempt_classes
                and (not self.exempt_hook or has_hook(module, self.exempt_hook))
                and re.search(self.exempt_classes, type(module).__name__)):
            return False
        return not self.attribute or hasattr(module, self.attribute)


def has_hook(module, hooks: tuple) -> bool:
    """Whether ``module``'s modeling file defines one of ``hooks`` (functions the adapter
    routes to an op)."""
    owner = sys.modules.get(type(module).__module__)
    return any(hasattr(owner, hook) for hook in hooks)


# Modules whose Conv1d goes through causal_conv1d_forward and is supported (state_adapter.py).
STATE_CONV_PARENTS = r"ShortConv$"
SCAN_HOOK = "mamba2_scan_forward"
DELTA_HOOK = "torch_chunk_gated_delta_rule"
MAMBA_HOOK = "mamba_scan_forward"  # Mamba-1's selective scan
# The layers routed through those hooks that are checked against transformers
# (tests/test_state_space.py); other files' copies of a hook stay refused until checked.
SCAN_CLASSES = (r"^(Mamba2Mixer|BambaMixer|FalconH1Mixer|GraniteMoeHybridMambaLayer|"
                r"NemotronHMamba2Mixer|MambaMixer|FalconMambaMixer|JambaMambaMixer)$")
DELTA_CLASSES = r"^Qwen3NextGatedDeltaNet$"
# Multi-head latent attention classes whose forward exporter/latent_attention.py replaces
# with the absorbed form (tests/test_latent_attention.py checks each against transformers).
LATENT_CLASSES = (r"^(DeepseekV2Attention|DeepseekV3Attention|Glm4MoeLiteAttention|"
                  r"MiniCPM3Attention|LongcatFlashMLA)$")

# Checked in order on every module, parents before children.
UNSUPPORTED_MODULES = (
    # Mamba-2's scan (and its hybrids': Bamba, Falcon-H1, Granite 4, Nemotron-H) goes through
    # mamba2_scan_forward, which the adapter routes to mlxgraph::ssd_scan.
    ModuleRule(r"Mamba|Mixer$|SSM", "state-space layers are not supported", attribute="A_log",
               exempt_hook=(SCAN_HOOK, MAMBA_HOOK), exempt_classes=SCAN_CLASSES),
    # MLA is exported in its absorbed form (exporter/latent_attention.py) for the classes
    # checked against transformers; any other module with a compressed K/V projection,
    # whatever the class is called (LongcatFlashMLA), stays refused.
    ModuleRule(
        "",
        "multi-head latent attention (MLA) is not supported",
        attribute="kv_a_proj_with_mqa",
        exempt_classes=LATENT_CLASSES,
    ),
    # Qwen3-Next's (and Qwen3.5's) gated delta rule goes through torch_chunk_gated_delta_rule,
    # which the adapter routes to mlxgraph::gated_delta (a per-head decay only: others refused
    # while tracing).
    ModuleRule(
        r"GatedDeltaNet|LinearAttention|Lightning",
        "linear / gated-delta attention layers are not supported",
        exempt_hook=(DELTA_HOOK,),
        exempt_classes=DELTA_CLASSES,
    ),
    # Llama 4 rotates q/k as complex numbers (torch.polar, view_as_complex): no complex
    # dtype in the graph yet. (Its chunked attention itself is supported.)
    ModuleRule(
        r"^Llama4TextRotaryEmbedding$",
        "complex-number RoPE (torch.polar / view_as_complex) is not supported",
    ),
    # A short convolution (LFM2) calls transformers' causal_conv1d_forward, which the
    # adapter routes to mlxgraph::causal_conv (exporter/state_adapter.py): its Conv1d keeps
    # a recurrent state the graph holds. Any other Conv1d over the sequence is refused.
    ModuleRule(r"^Conv1d$", "convolutions over the sequence (a recurrent state) are not supported",
               parent_exempt=STATE_CONV_PARENTS, exempt_hook=(SCAN_HOOK, DELTA_HOOK, MAMBA_HOOK),
               exempt_classes=f"{SCAN_CLASSES}|{DELTA_CLASSES}"),
)

# Layer types (config.layer_types) the adapter runs; "sparse"/"dense"/"moe" name MLPs and
# "mlp" a layer that is an MLP alone (Nemotron-H's '-': no attention, no state, so no
# cache), "conv" LFM2's short-convolution layers, "mamba" / "linear_attention" state-space layers
# (recurrent state, exporter/state_adapter.py; their modules are checked by the rules above).
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")
MLP_LAYER_TYPES = ("sparse", "dense", "moe", "mlp")
STATE_LAYER_TYPES = ("conv", "mamba", "linear_attention", "hybrid")


@dataclass(frozen=True)
class SettingRule:
    """A config setting that changes attention in a way the adapter does not implement."""

    name: str  # the config attribute, as the message names it
    refuses: object  # fn(config) -> str | None: why, or None when the setting is fine


def _layer_types(config):
    bad = [
        t
        for t in getattr(config, "layer_types", None) or ()
        if t not in ATTENTION_LAYER_TYPES + MLP_LAYER_TYPES + STATE_LAYER_TYPES
    ]
    return (
        f"layer type {bad[0]!r} is not supported (only "
        f"{', '.join(ATTENTION_LAYER_TYPES + STATE_LAYER_TYPES)})"
        if bad
        else None
    )


def _chunk_without_layer_types(config):
    chunked = "chunked_attention" in (getattr(config, "layer_types", None) or ())
    size = getattr(config, "attention_chunk_size", None)
    if size and not chunked:
        return (
            "attention_chunk_size is set but no layer is 'chunked_attention': "
            "which layers chunk is unknown"
        )
    if chunked and not (isinstance(size, int) and size > 0):
        return f"'chunked_attention' layers need a positive attention_chunk_size, got {size!r}"
    return None


def _temperature_tuning(config):
    nope = [
        i
        for i, use_rope in enumerate(getattr(config, "no_rope_layers", None) or ())
        if not use_rope
    ]
    if getattr(config, "attn_temperature_tuning", False) and nope:
        return (
            f"attention temperature tuning (layer {nope[0]} and other NoPE layers) reads "
            "positions from the KV cache, which the exported graph does not have"
        )
    return None


def _rope_by_length(config):
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type")) if isinstance(params, dict) else None
    if rope_type in ("dynamic", "longrope"):
        return (
            f"rope_type {rope_type!r} rescales RoPE by the sequence length seen, "
            "which a traced graph fixes"
        )
    return None


def _flag(attribute: str, feature: str):
    return lambda config: feature if getattr(config, attribute, False) else None


UNSUPPORTED_SETTINGS = (
    SettingRule("layer_types", _layer_types),
    SettingRule("attention_chunk_size", _chunk_without_layer_types),
    SettingRule("attn_temperature_tuning", _temperature_tuning),
    SettingRule("rope_parameters", _rope_by_length),
    SettingRule(
        "scale_attn_by_inverse_layer_idx",
        _flag(
            "scale_attn_by_inverse_layer_idx",
            "scaling attention by 1 / (layer + 1) is not supported",
        ),
    ),
    SettingRule(
        "use_bidirectional_attention",
        _flag("use_bidirectional_attention", "bidirectional attention is not supported"),
    ),
    # Falcon's ALiBi (its only user of a top-level `alibi`): transformers rounds each bias
    # slope * position to bfloat16, not linear in the position, so the op's float32
    # slope * distance (BLOOM's and MPT's, exporter/alibi_attention.py) is not exact for it.
    SettingRule("alibi", _flag("alibi", "ALiBi position biases rounded to bfloat16 (Falcon's) "
                                        "are not supported")),
)


def text_config(config):
    """The decoder's own config (a multimodal config's text part, else the config itself)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def check_model(model) -> None:
    """Refuse, before tracing, a model with a part the adapter cannot express.

    Raises:
        AdapterError: one line: ``<module path> (<class>): <feature>`` for a module, or
            ``config.<setting>: <why>`` for a config setting.
    """
    modules = dict(model.named_modules())
    for path, module in modules.items():
        parent = modules.get(path.rpartition(".")[0])
        for rule in UNSUPPORTED_MODULES:
            if path and rule.matches(module, parent):
                raise AdapterError(f"{path} ({type(module).__name__}): {rule.feature}")
    config = text_config(model.config)
    for rule in UNSUPPORTED_SETTINGS:
        why = rule.refuses(config)
        if why:
            raise AdapterError(f"config.{rule.name}: {why}")


def chunked_layers(config) -> dict:
    """{layer index: chunk size} of the layers whose type is 'chunked_attention'."""
    config = text_config(config)
    chunk = int(getattr(config, "attention_chunk_size", None) or 0)
    types = getattr(config, "layer_types", None) or ()
    return {i: chunk for i, t in enumerate(types) if t == "chunked_attention" and chunk > 0}


__all__ = [
    "AdapterError",
    "ModuleRule",
    "SettingRule",
    "UNSUPPORTED_MODULES",
    "UNSUPPORTED_SETTINGS",
    "ATTENTION_LAYER_TYPES",
    "check_model",
    "chunked_layers",
    "text_config",
]
