"""ember.config: sources, defaults, aliases, overrides, merging, and one clear error per bad input."""

from __future__ import annotations

import copy
import enum
import pickle
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import ember.config as config_module
from ember.config import Config, load_config, merge_configs, parse_overrides
from ember.errors import ConfigError, ContextError

DEFAULTS: dict[str, Any] = {
    "amp": None,
    "master_weights": False,
    "grad_scaler": {},
    "gradient_accumulation": 1,
    "clip_grad_norm": None,
    "clip_grad_value": None,
    "gradient_handler": [],
    "parallel": {
        "data": None,
        "tensor": {"size": 1, "mode": None, "depth": None, "plan": None},
        "pipeline": {"size": 1, "microbatches": None, "schedule": "gpipe", "split_points": None},
        "context": {"size": 1, "seq_dim": 1, "load_balance": True},
        "expert": None,
    },
    "zero": None,
    "compile": False,
    "seed": None,
    "deterministic": False,
    "ddp": {},
    "nonfinite_loss": "error",
    "activation_checkpointing": None,
}


def zero_grads(parameters: list[torch.nn.Parameter]) -> None:
    """A module-level (so picklable) gradient handler."""
    for p in parameters:
        p.grad = None


class AmpType(enum.Enum):
    """Stands in for Colossal-AI's ``AMP_TYPE``."""

    TORCH = "torch"
    NAIVE = "naive"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# --- sources -----------------------------------------------------------------------------------


def test_python_file_keeps_module_level_names_except_private_and_modules(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "config.py",
        """
        import math
        import os.path
        from math import pi

        BATCH_SIZE = 32
        NUM_EPOCHS = 2 * 3
        _helper = "hidden"
        fp16 = dict(mode="torch")
        parallel = dict(tensor=dict(size=2, mode="1d"))
        model = dict(depth=int(math.sqrt(16)), widths=[dict(n=1), dict(n=2)])

        def clip_handler(parameters):
            pass

        gradient_handler = [clip_handler]
        """,
    )
    cfg = load_config(path)
    assert cfg.BATCH_SIZE == 32 and cfg.NUM_EPOCHS == 6 and cfg.pi == pytest.approx(3.14159, 1e-5)
    assert cfg.parallel.tensor.size == 2 and cfg.parallel.tensor.mode == "1d"
    assert cfg.model.depth == 4 and cfg.model.widths[1].n == 2
    assert cfg.amp == "fp16" and "fp16" not in cfg
    assert cfg.gradient_handler == [cfg.clip_handler]
    assert not {"math", "os", "_helper", "__file__", "__builtins__"} & set(cfg)


def test_python_file_can_import_a_helper_beside_it_and_sys_path_is_restored(tmp_path: Path) -> None:
    write(tmp_path, "ember_cfg_helpers.py", "LR = 0.25\n")
    path = write(tmp_path, "config.py", "from ember_cfg_helpers import LR\nlr = LR * 2\n")
    before = list(sys.path)
    try:
        assert load_config(path).lr == 0.5
    finally:
        sys.modules.pop("ember_cfg_helpers", None)
    assert sys.path == before


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
def test_yaml_file_round_trips_with_attribute_access(tmp_path: Path, suffix: str) -> None:
    path = write(
        tmp_path,
        "config" + suffix,
        """
        amp: BF16
        gradient_accumulation: 4
        lr: 1e-3
        parallel:
          pipeline: {size: 2, schedule: 1F1B, split_points: [layer2]}
        optim: {name: sgd, betas: [0.9, 0.99]}
        """,
    )
    cfg = load_config(path)
    assert (cfg.amp, cfg.gradient_accumulation, cfg.lr) == ("bf16", 4, 0.001)
    assert cfg.parallel.pipeline.to_dict() == {
        "size": 2,
        "microbatches": None,
        "schedule": "1f1b",
        "split_points": ["layer2"],
    }
    assert cfg.optim.name == "sgd" and cfg.optim.betas == [0.9, 0.99]


def test_json_file_round_trips(tmp_path: Path) -> None:
    path = write(tmp_path, "c.json", '{"seed": 7, "zero": {"stage": 2}, "EPOCHS": 3}')
    cfg = load_config(path)
    assert cfg.seed == 7 and cfg.EPOCHS == 3
    assert cfg.zero.to_dict() == {"stage": 2, "mixed_precision": None, "cpu_offload": False}


def test_dict_source_round_trips_and_keeps_unknown_keys() -> None:
    source = {"clip_grad_norm": 1, "lr": 0.1, "model": {"hidden": [64, 64]}, "compile": True}
    cfg = load_config(source)
    assert isinstance(cfg, Config) and isinstance(cfg.model, Config)
    assert cfg.clip_grad_norm == 1.0 and cfg.lr == 0.1 and cfg.model.hidden == [64, 64]
    assert cfg.compile is True
    assert load_config(cfg) == cfg


@pytest.mark.parametrize("empty", [None, {}, "empty.yaml", "empty.py"])
def test_empty_sources_give_exactly_the_defaults(tmp_path: Path, empty: Any) -> None:
    if isinstance(empty, str):
        empty = write(tmp_path, empty, "")
    assert load_config(empty).to_dict() == DEFAULTS


def test_normalizing_twice_changes_nothing() -> None:
    raw = {"fp16": {"init_scale": 1024}, "parallel": {"tensor": 2}, "zero": 1, "X": 1}
    once = load_config(raw)
    assert load_config(once) == once
    assert merge_configs(once, once) == once


# --- normalization -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, None),
        (False, None),
        ("bf16", "bf16"),
        ("BFloat16", "bf16"),
        ("fp16", "fp16"),
        ("float16", "fp16"),
        ("Half", "fp16"),
        ("fp32", None),
        ("None", None),
        (torch.bfloat16, "bf16"),
        (torch.float16, "fp16"),
    ],
)
def test_amp_accepts_aliases_and_normalizes(given: Any, expected: str | None) -> None:
    assert load_config({"amp": given}).amp == expected


@pytest.mark.parametrize("mode", ["torch", "TORCH", AmpType.TORCH, None])
def test_fp16_alias_becomes_amp_fp16_with_scaler_kwargs(mode: Any) -> None:
    fp16 = {"init_scale": 256, "growth_interval": 10} | ({} if mode is None else {"mode": mode})
    cfg = load_config({"fp16": fp16})
    assert cfg.amp == "fp16" and "fp16" not in cfg
    assert cfg.grad_scaler == {"init_scale": 256.0, "growth_interval": 10}


def test_fp16_agrees_with_amp_fp16_and_an_equal_grad_scaler_value() -> None:
    cfg = load_config({"fp16": {"init_scale": 8}, "amp": "FP16", "grad_scaler": {"init_scale": 8}})
    assert cfg.amp == "fp16" and cfg.grad_scaler == {"init_scale": 8.0}


@pytest.mark.parametrize(
    ("given", "path", "expected"),
    [
        ({"parallel": {"tensor": 4}}, ("parallel", "tensor"), {"size": 4, "mode": None, "depth": None, "plan": None}),
        ({"parallel": {"pipeline": 2}}, ("parallel", "pipeline", "size"), 2),
        ({"zero": 3}, ("zero", "stage"), 3),
        ({"zero": False}, ("zero",), None),
        ({"compile": {}}, ("compile",), True),
        ({"compile": {"mode": "Max-Autotune"}}, ("compile",), {"mode": "max-autotune"}),
        ({"compile": {"backend": "eager", "fullgraph": True}}, ("compile",), {"fullgraph": True, "backend": "eager"}),
        ({"compile": {"backend": zero_grads}}, ("compile", "backend"), zero_grads),  # a callable backend is kept
        ({"gradient_handler": zero_grads}, ("gradient_handler",), [zero_grads]),
        ({"gradient_handler": (zero_grads,)}, ("gradient_handler",), [zero_grads]),
        ({"find_unused_parameters": True}, ("ddp",), {"find_unused_parameters": True}),
        ({"ddp": {"bucket_cap_mb": 25}}, ("ddp", "bucket_cap_mb"), 25.0),
        ({"grad_scaler": {"enabled": False}}, ("grad_scaler",), {"enabled": False}),
    ],
)
def test_shorthands_expand_to_the_normalized_form(given: dict[str, Any], path: tuple[str, ...], expected: Any) -> None:
    value: Any = load_config(given)
    for part in path:
        value = value[part]
    assert value == expected


@pytest.mark.parametrize(
    ("key", "ours"),
    [
        ("gradient_accumulaton", "gradient_accumulation"),  # one letter dropped
        ("gradient_acumulaton", "gradient_accumulation"),  # two
        ("clip_grad_nrom", "clip_grad_norm"),  # two letters swapped
        ("determinstic", "deterministic"),
        ("Seed", "seed"),
        ("seeds", "seed"),
        ("apm", "amp"),
        ("clip_grad", "clip_grad_norm"),  # other libraries' names
        ("grad_clip", "clip_grad_norm"),
        ("max_grad_norm", "clip_grad_norm"),
        ("gradient_clip_val", "clip_grad_norm"),
        ("gradient_clip_value", "clip_grad_value"),
        ("gradient_accumulation_steps", "gradient_accumulation"),
        ("accumulate_grad_batches", "gradient_accumulation"),
        ("mixed_precision", "amp"),
        ("zero_optimization", "zero"),
    ],
)
def test_a_typo_or_another_librarys_name_of_an_ember_key_is_an_error_with_did_you_mean(key: str, ours: str) -> None:
    with pytest.raises(ConfigError, match=f"config key '{key}' .*did you mean '{ours}'"):
        load_config({key: 1})


@pytest.mark.parametrize("key", ["lr", "batch_size", "model", "epochs", "optimizer", "log_dir", "hidden", "seed_all"])
def test_lower_case_user_keys_far_from_ember_keys_are_kept(key: str) -> None:
    assert load_config({key: 7})[key] == 7


def test_user_keys_in_all_caps_are_never_flagged_even_when_close_to_ember_keys() -> None:
    cfg = load_config({"GRADIENT_ACCUMULATON": 3, "SEEDS": [1, 2], "MAX_GRAD_NORM": 2, "lr": 0.1, "model": "cnn"})
    assert (cfg.GRADIENT_ACCUMULATON, cfg.SEEDS, cfg.lr, cfg.model) == (3, [1, 2], 0.1, "cnn")
    assert cfg.gradient_accumulation == 1


# --- overrides ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("amp=bf16", {"amp": "bf16"}),
        ("gradient_accumulation=4", {"gradient_accumulation": 4}),
        ("clip_grad_norm=0.5", {"clip_grad_norm": 0.5}),
        ("lr=1e-3", {"lr": 0.001}),
        ("compile=true", {"compile": True}),
        ("deterministic=False", {"deterministic": False}),
        ("seed=null", {"seed": None}),
        ("seed=None", {"seed": None}),
        ("x=[1,2]", {"x": [1, 2]}),
        ("x={a: 1}", {"x": {"a": 1}}),
        ("parallel.data=2", {"parallel": {"data": 2}}),
        ("parallel.tensor.mode=1d", {"parallel": {"tensor": {"mode": "1d"}}}),
        ("name=run=1", {"name": "run=1"}),
        (" tag = hello world ", {"tag": "hello world"}),
    ],
)
def test_parse_overrides_reads_each_value_type(item: str, expected: dict[str, Any]) -> None:
    assert parse_overrides([item]) == expected


def test_later_overrides_win_over_earlier_ones() -> None:
    items = ["a=1", "a.b=2", "a.c=3", "s.t=1", "s=4"]
    assert parse_overrides(items) == {"a": {"b": 2, "c": 3}, "s": 4}


@pytest.mark.parametrize(
    "overrides",
    [
        ["gradient_accumulation=4", "parallel.tensor.mode=2d", "amp=bf16"],
        {"gradient_accumulation": 4, "parallel.tensor.mode": "2d", "amp": "bf16"},
        {"gradient_accumulation": 4, "parallel": {"tensor.mode": "2d"}, "amp": "bf16"},
    ],
)
def test_overrides_deep_merge_over_the_source(overrides: Any) -> None:
    source = {"fp16": {"mode": "torch"}, "parallel": {"tensor": 2}, "model": {"depth": 3}}
    cfg = load_config(source, overrides)
    assert cfg.gradient_accumulation == 4 and cfg.amp == "bf16"
    assert cfg.parallel.tensor.size == 2 and cfg.parallel.tensor.mode == "2d"
    assert cfg.model.depth == 3


# --- merging -----------------------------------------------------------------------------------


def test_merge_extra_wins_and_partial_sections_keep_the_rest() -> None:
    base = load_config({"amp": "bf16", "parallel": {"tensor": {"size": 2, "mode": "1d"}}, "zero": 2, "k": [1]})
    extra = {"gradient_accumulation": 4, "parallel": {"tensor": {"mode": "2d"}}, "k": [2]}
    cfg = merge_configs(base, extra)
    assert cfg.amp == "bf16" and cfg.gradient_accumulation == 4
    assert cfg.parallel.tensor.to_dict() == {"size": 2, "mode": "2d", "depth": None, "plan": None}
    assert cfg.zero.stage == 2
    assert cfg.k == [2]  # lists are replaced, not concatenated


def test_merge_fp16_in_extra_overrides_amp_in_base() -> None:
    cfg = merge_configs({"amp": "bf16"}, {"fp16": {"mode": "torch", "init_scale": 4}})
    assert cfg.amp == "fp16" and cfg.grad_scaler == {"init_scale": 4.0}


@pytest.mark.parametrize("call", ["load_config", "merge_configs"])
def test_load_and_merge_never_mutate_their_inputs(call: str) -> None:
    base = Config(parallel={"tensor": 2}, fp16={"mode": "torch"}, user={"xs": [{"a": 1}]})
    extra = {"parallel": {"tensor": {"mode": "1d"}}, "user": {"xs": [{"a": 2}]}}
    base_before, extra_before = copy.deepcopy(base), copy.deepcopy(extra)
    if call == "load_config":
        out = load_config(base, ["parallel.pipeline=2", "user.y=1"])
    else:
        out = merge_configs(base, extra)
    out.parallel.tensor.size = 8
    out.user.xs.append("new")
    out.user.xs[0].a = 99
    assert base == base_before and extra == extra_before


# --- the Config object -------------------------------------------------------------------------


def test_config_attribute_get_set_delete_and_nested_conversion() -> None:
    cfg = Config({"a": {"b": 1}, "items_": [{"c": 2}, 3, ({"d": 4},)]})
    cfg.e = {"f": {"g": 5}}
    cfg.h = 6
    del cfg.h
    assert cfg.a.b == 1 and cfg.items_[0].c == 2 and cfg.items_[2][0].d == 4 and cfg.e.f.g == 5
    assert isinstance(cfg.e.f, Config) and "h" not in cfg
    assert isinstance(cfg.copy(), Config) and isinstance(cfg.setdefault("z", {}), Config)
    assert "a" in dir(cfg)


def test_missing_attribute_is_attribute_error_with_a_suggestion() -> None:
    cfg = load_config({"BATCH_SIZE": 8})
    with pytest.raises(AttributeError, match=r"'BATCH_SIZ'.*did you mean 'BATCH_SIZE'"):
        _ = cfg.BATCH_SIZ
    with pytest.raises(AttributeError, match="'zzz' \\(its keys: microbatches, schedule, size"):
        _ = cfg.parallel.pipeline.zzz
    assert getattr(cfg, "nope", "default") == "default"


def test_setting_a_method_name_as_attribute_is_refused() -> None:
    cfg = Config()
    with pytest.raises(AttributeError, match="cfg\\['items'\\]"):
        cfg.items = 3  # type: ignore[method-assign]
    cfg["items"] = 3
    assert cfg["items"] == 3


def test_to_dict_returns_plain_containers_and_keeps_callables() -> None:
    cfg = load_config({"gradient_handler": [zero_grads], "user": {"xs": [{"a": 1}]}})
    plain = cfg.to_dict()
    assert type(plain) is dict and type(plain["user"]) is dict
    assert type(plain["user"]["xs"][0]) is dict and type(plain["parallel"]["tensor"]) is dict
    assert plain["gradient_handler"][0] is zero_grads
    plain["user"]["xs"].append(2)
    assert cfg.user.xs == [{"a": 1}]


@pytest.mark.parametrize(
    "roundtrip",
    [
        pytest.param(lambda c: pickle.loads(pickle.dumps(c)), id="pickle"),
        pytest.param(lambda c: pickle.loads(pickle.dumps(c, protocol=0)), id="pickle-protocol-0"),
        pytest.param(copy.deepcopy, id="deepcopy"),
    ],
)
def test_config_survives_pickle_and_deepcopy(roundtrip: Callable[[Config], Config]) -> None:
    cfg = load_config({"gradient_handler": zero_grads, "user": {"xs": [{"a": 1}]}, "amp": "bf16"})
    back = roundtrip(cfg)
    assert back == cfg and back is not cfg and isinstance(back, Config)
    assert isinstance(back.parallel.tensor, Config) and isinstance(back.user.xs[0], Config)
    assert back.gradient_handler == [zero_grads] and back.user.xs[0].a == 1


def test_module_attribute_reads_launched_config_and_says_so_before_launch() -> None:
    with pytest.raises(ContextError, match=r"ember\.config\.BATCH_SIZE was read before launch"):
        _ = config_module.BATCH_SIZE
    with pytest.raises(AttributeError):  # private and dunder names stay introspection-safe
        _ = config_module._not_there
    assert not hasattr(config_module, "__wrapped__")


# --- bad input: one ConfigError naming the culprit ----------------------------------------------


@pytest.mark.parametrize(
    ("source", "overrides", "needles"),
    [
        ({"gradient_accumulaton": 4}, None, ["'gradient_accumulaton'", "'gradient_accumulation'"]),
        ({"Amp": "bf16"}, None, ["'Amp'", "did you mean 'amp'"]),
        ({"parallel": {"tensr": 2}}, None, ["'parallel.tensr'", "'parallel.tensor'"]),
        ({"parallel": {"pipeline": {"scheduel": "1f1b"}}}, None, ["'parallel.pipeline.scheduel'"]),
        ({"ddp": {"foo": True}}, None, ["'ddp.foo'", "find_unused_parameters"]),
        ({"gradient_accumulation": 0}, None, ["'gradient_accumulation'", "0 (int)", "an int from 1 to 2147483647"]),
        ({"gradient_accumulation": "4"}, None, ["'gradient_accumulation'", "'4' (str)"]),
        ({"gradient_accumulation": True}, None, ["'gradient_accumulation'", "True (bool)"]),
        ({"clip_grad_norm": -1.0}, None, ["'clip_grad_norm'", "positive max norm"]),
        ({"clip_grad_norm": 0}, None, ["'clip_grad_norm'", "None to disable"]),
        ({"clip_grad_value": -0.5}, None, ["'clip_grad_value'", "a number > 0"]),
        ({"gradient_handler": [zero_grads, 3]}, None, ["'gradient_handler[1]'", "(int)"]),
        ({"gradient_handler": [{"type": "X"}]}, None, ["'gradient_handler[0]'", "registry"]),
        ({"gradient_handler": "clip"}, None, ["'gradient_handler'", "(str)"]),
        ({"amp": "fp8"}, None, ["'amp'", "'fp8'", "'bf16'"]),
        ({"amp": True}, None, ["'amp'", "True (bool)"]),
        ({"fp16": {"mode": "apex"}}, None, ["'fp16.mode'", "mode='torch'", "amp='bf16'"]),
        ({"fp16": True}, None, ["'fp16'", "True (bool)", "fp16=dict(mode='torch')", "fp16=dict(mode='naive')"]),
        ({"fp16": {"mode": "torch"}, "amp": "bf16"}, None, ["'fp16'", "'amp'", "'bf16'"]),
        (
            {"fp16": {"init_scale": 2}, "grad_scaler": {"init_scale": 4}},
            None,
            ["'fp16.init_scale'", "'grad_scaler.init_scale'"],
        ),
        ({"fp16": {"scale": 2}}, None, ["'fp16.scale'", "init_scale"]),
        ({"grad_scaler": {"backoff_factor": 1.5}}, None, ["'grad_scaler.backoff_factor'", "1.5"]),
        ({"grad_scaler": {"growth_factor": 1}}, None, ["'grad_scaler.growth_factor'", "> 1"]),
        ({"zero": 4}, None, ["'zero.stage'", "4 (int)", "from 1 to 3"]),
        ({"zero": {"cpu_offload": True}}, None, ["'zero.stage'", "required"]),
        ({"zero": {"stage": 2, "mixed_precision": "int8"}}, None, ["'zero.mixed_precision'"]),
        ({"parallel": {"pipeline": {"schedule": "foo"}}}, None, ["'parallel.pipeline.schedule'", "'foo'"]),
        ({"parallel": {"pipeline": {"split_points": "layer1"}}}, None, ["'parallel.pipeline.split_points'"]),
        ({"parallel": {"data": 0}}, None, ["'parallel.data'", "0 (int)"]),
        ({"parallel": {"tensor": {"size": 2.0}}}, None, ["'parallel.tensor.size'", "2.0 (float)"]),
        ({"parallel": 2}, None, ["'parallel'", "a dict with keys data, tensor, pipeline"]),
        ({"compile": "yes"}, None, ["'compile'", "'yes' (str)"]),
        ({"compile": {"mode": "fast"}}, None, ["'compile.mode'", "'fast'"]),
        ({"compile": {"fulgraph": True}}, None, ["'compile.fulgraph'", "'compile.fullgraph'"]),
        ({"compile": {"backend": 3}}, None, ["'compile.backend'", "3 (int)", "a name or a callable"]),
        ({"seed": -1}, None, ["'seed'", "-1 (int)"]),
        ({"deterministic": "yes"}, None, ["'deterministic'", "True or False"]),
        ({"nonfinite_loss": "raise"}, None, ["'nonfinite_loss'", "'error', 'warn', 'ignore'"]),
        ({"find_unused_parameters": 1}, None, ["'find_unused_parameters'", "1 (int)"]),
        (
            {"find_unused_parameters": True, "ddp": {"find_unused_parameters": False}},
            None,
            ["'ddp.find_unused_parameters'"],
        ),
        (None, ["amp"], ["'amp'", "key.sub=value"]),
        (None, ["=3"], ["'=3'", "empty key"]),
        (None, ["a..b=1"], ["'a..b=1'", "empty key"]),
        (None, ["x=[1,2"], ["'x=[1,2'", "not valid YAML"]),
        (None, "amp=bf16", ["overrides must be a list", "'amp=bf16' (str)"]),
        (None, ["gradient_accumulaton=2"], ["'gradient_accumulaton'"]),
        (None, ["gradient_accumulation=0"], ["'gradient_accumulation'", "0 (int)"]),
        (None, {"parallel..data": 2}, ["'parallel..data'"]),
        (42, None, ["a config must be", "42 (int)"]),
    ],
)
def test_bad_value_raises_one_config_error_naming_the_key(source: Any, overrides: Any, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(source, overrides)
    message = str(excinfo.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


BROKEN_FILES: dict[str, tuple[str, str, list[str]]] = {
    "syntax-error": ("config.py", "x = 1\ny = (\n", ["syntax error", "line 2"]),
    "raises": ("config.py", "a = 1\n\nb = 1 / 0\n", ["ZeroDivisionError", "line 3", "division"]),
    "name-error": ("config.py", "lr = learning_rate\n", ["NameError", "line 1", "learning_rate"]),
    "bad-yaml": ("config.yaml", "amp: bf16\nparallel: [1, 2\n", ["not valid YAML", "line"]),
    "bad-yaml-mapping": ("config.yml", "a: 1\n  b: 2\n", ["not valid YAML", "line 2"]),
    "yaml-list-top-level": ("config.yaml", "- 1\n- 2\n", ["mapping", "list"]),
    "yaml-scalar-top-level": ("config.yaml", "bf16\n", ["mapping", "str"]),
    "bad-json": ("config.json", '{"amp": "bf16",}', ["not valid JSON", "line 1"]),
    "unsupported-suffix": ("config.toml", "amp = 'bf16'\n", ["unsupported suffix", ".py, .yaml"]),
    "bad-value-in-file": ("config.py", "gradient_accumulation = 0\n", ["gradient_accumulation"]),
}


@pytest.mark.parametrize("case", list(BROKEN_FILES))
def test_broken_file_raises_one_config_error_naming_the_file(tmp_path: Path, case: str) -> None:
    name, text, needles = BROKEN_FILES[case]
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    message = str(excinfo.value)
    if case != "bad-value-in-file":
        assert str(path) in message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    # the ember error is what the user sees first: no chained parser or user traceback
    assert excinfo.value.__cause__ is None
    assert excinfo.value.__context__ is None or excinfo.value.__suppress_context__


@pytest.mark.parametrize("source", ["missing.py", Path("missing.yaml")])
def test_missing_file_raises_config_error_naming_it(tmp_path: Path, source: str | Path) -> None:
    path = tmp_path / source
    with pytest.raises(ConfigError, match="does not exist") as excinfo:
        load_config(str(path) if isinstance(source, str) else path)
    assert str(path) in str(excinfo.value)


# -- inputs that could hang or overflow ------------------------------------------------------------


def _bomb(levels: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bomb9.yaml", _bomb(9), "reaches .* values more than once through shared parts"),
        ("bomb10.yaml", _bomb(10), "an alias bomb"),
        ("self.yaml", "a: &a [1, *a]\n", r"key 'a\[1\]' contains itself"),
        ("deep.yaml", "x: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply to read"),
        ("deep.json", '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply to read"),
        ("nested.yaml", "x: " + "[" * 150 + "]" * 150 + "\n", r"key 'x\[0\]\[0\].*' is nested more than 100 levels"),
        ("long.yaml", "BIG: " + "7" * 5000 + "\n", "key 'BIG' is an int of about 5000 digits"),
        ("long.json", '{"lr": 1, "BIG": ' + "7" * 5000 + "}", "key 'BIG' is an int of about 5000 digits"),
        ("seed.yaml", f"seed: {2**64}\n", r"config key .seed. got 18446744073709551616 \(int\); allowed: an int from"),
        ("accum.yaml", f"gradient_accumulation: {10**30}\n", "config key 'gradient_accumulation' got 1000"),
        ("clip.yaml", f"clip_grad_norm: {10**400}\n", "config key 'clip_grad_norm' got 1000"),
        ("exits.py", "import sys\nsys.exit(3)\n", "raised SystemExit at line 2: 3"),
        ("interrupts.py", "raise KeyboardInterrupt\n", "raised KeyboardInterrupt at line 1"),
    ],
)
def test_inputs_that_would_hang_or_overflow_are_one_config_error_naming_the_key(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=message):
        load_config(path)
    assert time.perf_counter() - started < 10.0  # the 10-level bomb used not to finish


def test_a_python_config_that_refers_to_itself_or_shares_too_much_is_refused() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(ConfigError, match=r"key 'layers\[1\]' contains itself"):
        load_config({"layers": loop})
    shared: Any = [0] * 10
    for _ in range(6):
        shared = [shared] * 10
    with pytest.raises(ConfigError, match="through shared parts"):
        load_config({"table": shared})
    assert load_config({"blocks": [{"width": 4}] * 12}).blocks[11].width == 4  # some sharing is fine


def test_an_override_with_an_alias_loop_is_refused() -> None:
    with pytest.raises(ConfigError, match="override 'x': key '\\[1\\]' contains itself"):
        parse_overrides(["x=&a [1, *a]"])


def test_the_top_level_find_unused_parameters_warns_naming_its_ddp_key() -> None:
    with pytest.warns(DeprecationWarning, match=r"'find_unused_parameters' is deprecated.*ddp=dict\(find_unused") as w:
        config = load_config({"find_unused_parameters": True})
    assert config.ddp.find_unused_parameters is True and "find_unused_parameters" not in config
    assert [r.filename for r in w] == [__file__]  # shown at the line that loaded the config


def test_fp16_is_a_permanent_alias_and_folds_without_a_warning() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = load_config({"fp16": {"mode": "torch", "init_scale": 1024.0}})
    assert config.amp == "fp16" and config.grad_scaler.init_scale == 1024.0 and "fp16" not in config
    aliases = (Path(__file__).parents[1] / "docs" / "config.md").read_text().split("## Aliases", 1)[1]
    assert '`fp16=dict(mode="torch"' in aliases and "**permanent**" in aliases


def test_the_config_package_imports_nothing_from_the_layers_above_it() -> None:
    # ember.config.NAME reads the config the launch handed down (set_launched), not the context.
    import ast

    above = ("ember.context", "ember.launcher", "ember.initialize", "ember.trainer", "ember.engine")
    found = []
    for path in sorted(Path(config_module.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + (
                    [f"{node.module}.{a.name}" for a in node.names] if node.module == "ember" else []
                )
            found += [f"{path.name}: {n}" for n in names if n.startswith(above)]
    assert not found


def test_ember_config_names_read_the_launched_config_until_the_context_is_reset() -> None:
    import ember

    ember.launch(config={"BATCH_SIZE": 8}, verbose=False)
    assert config_module.BATCH_SIZE == 8
    ember.context.reset()
    with pytest.raises(ContextError, match="before launch"):
        _ = config_module.BATCH_SIZE
