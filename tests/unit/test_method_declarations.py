"""A method's options are declared once, as its options dataclass (strategies.base.options): its
conf/method/<name>.yaml starts from it and declares no option again; its client role's arguments
(protocol.roles, what the message carries) must agree with it; methods and roles register by
subclassing."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest
import yaml
from omegaconf import OmegaConf

from pflower.protocol.roles import ROLE_ARGS, has_default
from pflower.server_app.config import OPTIONS_GROUP, ConfigError, compose_config, conf_dir, method_defaults
from pflower.strategies import STRATEGIES, MethodOptions, OptionError, PersonalizedStrategy
from pflower.strategies.base.options import option


def second_declarations(text: str) -> list[str]:
    """The keys of a conf/method file that declare again what its options dataclass declares:
    any key but ``defaults``, ``name`` and a value that is the run's (``total_rounds: ${rounds}``)."""
    raw = OmegaConf.create(yaml.safe_load(text) or {})
    return [k for k in raw if k not in ("defaults", "name") and not OmegaConf.is_interpolation(raw, k)]


@pytest.mark.parametrize("method", sorted(STRATEGIES))
def test_a_method_file_starts_from_its_options_dataclass_and_declares_no_option_again(method):
    text = (conf_dir() / "method" / f"{method}.yaml").read_text()
    assert f"/{OPTIONS_GROUP}/{method}@_here_" in text
    assert second_declarations(text) == []


@pytest.mark.parametrize("method", sorted(STRATEGIES))
def test_method_equals_name_composes_to_the_dataclass_defaults(method):
    composed = OmegaConf.to_container(compose_config([f"method={method}", "rounds=7"]).method)
    declared = STRATEGIES[method].options_type.defaults()
    run_values = {k for k, v in method_defaults(method).items() if isinstance(v, str) and "${" in v}
    assert composed.pop("name") == method and set(composed) == set(declared)
    assert {k: v for k, v in composed.items() if k not in run_values} == {
        k: v for k, v in declared.items() if k not in run_values
    }
    assert all(composed[k] == 7 for k in run_values)  # total_rounds: ${rounds}


def test_a_second_declaration_is_caught_and_an_override_still_finds_its_key():
    """The check itself: KAPC's file saying ``lam: 0.5`` again is named; ``method.lam=`` works
    although the file names no option."""
    text = (conf_dir() / "method" / "kapc.yaml").read_text()
    assert second_declarations(text + "lam: 0.5\ntotal_rounds: ${rounds}\n") == ["lam"]
    assert compose_config(["method=kapc", "method.lam=0.5"]).method.lam == 0.5


def field_types(hint) -> set:
    return (
        set(typing.get_args(hint)) - {type(None)}
        if typing.get_origin(hint) in (typing.Union, types.UnionType)
        else {hint}
    )


def role_disagreements(method: str, sent: dict[str, object], role_args: type) -> list[str]:
    """Where what the strategy sends its role (``sent``, one round's role arguments at the default
    options) disagrees with the method's options: a field both declare must have a type the role
    accepts and carry the option's value (an option with default null is resolved by the strategy:
    KAPC's omega_min = L - 2 is sent as a number). ``traits.derived_role_args`` of the strategy names
    the fields it computes from several options instead (Felo's feature_samples: 0 unless
    feature_upload=samples)."""
    cls = STRATEGIES[method]
    hints, arg_hints = typing.get_type_hints(cls.options_type), typing.get_type_hints(role_args)
    problems = []
    for name, default in cls.options_type.defaults().items():
        if name not in arg_hints:
            continue
        if not field_types(hints[name]) <= field_types(arg_hints[name]):
            problems.append(f"{name}: options type {hints[name]} does not fit role args type {arg_hints[name]}")
        if default is not None and name not in cls.traits.derived_role_args and sent.get(name) != default:
            problems.append(f"{name}: options {default!r}, sent {sent.get(name)!r}")
    return problems


def sent_role_args(method: str, **options) -> dict[str, object]:
    from pflower.models import build_model
    from pflower.strategies import client_spec

    model = build_model("lenet5", (1, 28, 28), 10, seed=0)
    spec = {**client_spec(lr=0.01), "model": {"name": "lenet5"}}
    del spec["data"]  # the data spec is the runner's (FedMD reads its transfer set from it when given)
    run = {"total_rounds": 200} if "total_rounds" in STRATEGIES[method].options_type.names() else {}  # the paper's K
    strategy = STRATEGIES[method](model, spec, num_clients=4, fraction_train=0.5, **run, **options)
    args = strategy.role_config(0, 1)
    return args.to_dict() if hasattr(args, "to_dict") else dict(args)


@pytest.mark.parametrize("method", sorted(STRATEGIES))
def test_the_options_and_the_role_arguments_agree(method):
    role_args = ROLE_ARGS[STRATEGIES[method].traits.role]
    assert role_disagreements(method, sent_role_args(method), role_args) == []


def role_second_declarations(role_args: dict[str, type]) -> list[str]:
    """Role-argument fields that declare an option's default again: a field with a default of its
    own, named like an option that every method using the role has (where some method has no such
    option the default is the role's neutral value: ``SGDArgs.finetune_epochs`` 0 for FedPer)."""
    found = []
    for role, args in role_args.items():
        users = [c for c in STRATEGIES.values() if c.traits.role == role]
        for f in dataclasses.fields(args):
            if users and has_default(f) and all(f.name in c.options_type.names() for c in users):
                found.append(f"{args.__name__}.{f.name}")
    return found


def test_a_role_argument_that_carries_an_option_declares_no_default_of_its_own():
    assert role_second_declarations(ROLE_ARGS) == []
    MOON = ROLE_ARGS["moon"]

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class DefaultedMOON(MOON):  # the check itself: tau's default written again is named
        tau: float = 0.5

    assert role_second_declarations({"moon": DefaultedMOON}) == ["DefaultedMOON.tau"]


def test_a_message_without_an_option_is_refused_naming_it():
    from pflower.protocol.roles import RoleArgsError, role_args

    with pytest.raises(RoleArgsError, match=r"role 'moon' got no \['tau'\]"):
        role_args("moon", {"mu": 1.0})
    assert role_args("sgd", {}).finetune_epochs == 0  # a neutral default stays


def test_a_role_argument_that_drifts_from_its_option_is_caught():
    """The check itself: KAPC sending lam 0.5 while its option says 1.0 is named, and so is an
    option whose type the role would refuse."""
    sent = {**sent_role_args("kapc"), "lam": 0.5}
    assert role_disagreements("kapc", sent, ROLE_ARGS["kapc"]) == ["lam: options 1.0, sent 0.5"]

    @dataclasses.dataclass(frozen=True)
    class NarrowKAPCArgs(ROLE_ARGS["kapc"]):
        lam: int = 1

    assert "lam: options type <class 'float'> does not fit role args type <class 'int'>" in role_disagreements(
        "kapc", sent_role_args("kapc"), NarrowKAPCArgs
    )


@pytest.mark.parametrize(
    "override, message",
    [
        ("method.beta=-1", "method 'kapc': option beta must be >= 0, got -1; set method.beta=<value>"),
        ("method.cube_lr=fast", "option cube_lr must be one of ['centered', 'theory'], or a number > 0, got 'fast'"),
        ("method.cube_steps=1.5", "option cube_steps must be int, got 1.5"),
        ("method.mu=2", "option mu must be >= 0 and <= 1, got 2"),
    ],
)
def test_a_bad_option_fails_config_validation_naming_it(override, message):
    with pytest.raises(ConfigError) as err:
        compose_config(["method=kapc", override])
    assert message in str(err.value)


def test_options_coerce_numbers_and_keep_the_declared_types():
    from pflower.strategies.kapc import KAPCOptions

    o = KAPCOptions(lam=1, cube_lr=0.01, omega_min=None)
    assert isinstance(o.lam, float) and o.cube_lr == 0.01 and o.omega_min is None and o.bls is False
    assert KAPCOptions(cube_lr=2).cube_lr == 2.0  # a number where "float | str" is declared
    with pytest.raises(OptionError, match="option bls must be bool"):
        KAPCOptions(bls="yes")
    with pytest.raises(OptionError, match=r"has no option\(s\) \['lamda'\]"):
        KAPCOptions.build("kapc", {"lamda": 1.0})


def test_the_method_list_read_from_the_source_equals_the_registry():
    """`pflower methods` lists the methods without importing them (no torch): what it reads from
    strategies/*.py must be what the registry holds, role and options included."""
    from pflower.reports.methods_cli import declared_methods

    declared = declared_methods()
    assert set(declared) == set(STRATEGIES)
    for name, cls in STRATEGIES.items():
        assert (declared[name].role, list(declared[name].options)) == (cls.traits.role, cls.options_type.names()), name


def test_methods_and_roles_register_by_subclassing():
    """Every strategy module's method is registered with no list to edit, every strategy's role
    exists on the client side with the same arguments class, and a name cannot be taken twice."""
    from pflower.client_app.roles import ROLES
    from pflower.reports.methods_cli import declared_methods

    assert set(STRATEGIES) == set(declared_methods()) and {"fedavg", "kapc_bls", "velo", "fedhe"} <= set(STRATEGIES)
    assert all(cls.name == name for name, cls in STRATEGIES.items())
    assert {cls.traits.role for cls in STRATEGIES.values()} <= set(ROLES)
    assert set(ROLES) == set(ROLE_ARGS) and all(ROLES[n].args_type is ROLE_ARGS[n] for n in ROLES)
    with pytest.raises(TypeError, match="method name 'fedavg' is taken"):
        type("Impostor", (PersonalizedStrategy,), {"name": "fedavg", "__module__": "pflower.strategies.impostor"})


def test_pflower_methods_prints_a_method_s_options_from_its_dataclass(capsys):
    from pflower.cli import main

    assert main(["methods", "fedprox"]) == 0
    out = capsys.readouterr().out
    assert "fedprox: client role proximal" in out
    assert "mu      float  1.0      >= 0" in out and "proximal weight" in out
    assert main(["methods", "nosuch"]) == 2


def test_a_method_without_options_uses_the_base_dataclass():
    assert STRATEGIES["fedper"].options_type is MethodOptions and MethodOptions.build("fedper", {}).to_dict() == {}

    @dataclasses.dataclass(frozen=True)
    class Demo(MethodOptions):
        n: int = option(3, "a count", low=1)

    assert Demo.describe() == [{"option": "n", "type": "int", "default": "3", "allowed": ">= 1", "doc": "a count"}]


@pytest.mark.parametrize("method", sorted(STRATEGIES))
def test_each_method_page_shows_the_options_table_of_its_dataclass(method):
    """docs/methods/ carries a copy of each options dataclass; `pflower methods --write-docs`
    refreshes it. A changed option without the refreshed page fails here."""
    from pflower.reports.methods_cli import BLOCK, options_markdown, page_of

    page = (conf_dir().parent / "docs" / page_of(method)).read_text()
    assert BLOCK.format(name=method, table=options_markdown(method)) in page, (
        f"docs/{page_of(method)} lacks the current options of {method}: run `pflower methods --write-docs`"
    )


def test_write_docs_fills_a_page_once_and_keeps_the_rest(tmp_path):
    from pflower.reports.methods_cli import options_markdown, write_docs

    (tmp_path / "methods").mkdir()
    pages = ("fedcmd", "fedcpmd", "fedtsdp", "felo_velo", "kapc", "cfl", "heterofl", "fedgkt", "fedmd", "baselines")
    for page in pages:
        (tmp_path / "methods" / f"{page}.md").write_text(f"# {page}\n\nprose\n")
    assert len(write_docs(tmp_path)) == len(pages)
    text = (tmp_path / "methods" / "kapc.md").read_text()
    assert text.startswith("# kapc\n\nprose\n") and options_markdown("kapc_bls") in text
    assert write_docs(tmp_path) == []  # a second run changes nothing


def test_every_method_class_is_public_in_the_strategies_package():
    """`from pflower.strategies import FedCMD` works for every registered method (docs/api.md)."""
    import pflower.strategies as package

    for name, cls in STRATEGIES.items():
        assert getattr(package, cls.__name__, None) is cls and cls.__name__ in package.__all__, name


@pytest.mark.heavy  # over 1 s: left out of the quick tier
def test_configuration_page_lists_every_registered_method():
    """docs/configuration.md's list of methods is generated from the registry (issue 58: heterofl,
    fedgkt and fedmd were missing from a hand-kept row)."""
    from pflower.reports.methods_cli import METHODS_BLOCK, methods_markdown

    page = (conf_dir().parent / "docs" / "configuration.md").read_text()
    assert METHODS_BLOCK.format(table=methods_markdown()) in page, "run `pflower methods --write-docs`"
    assert all(f"| `{name}` |" in methods_markdown() for name in STRATEGIES)
