"""A method's options are declared once (protocol.options): the options its client reads in its
role's arguments (client_app/roles/), which its options dataclass extends with the server's; its
conf/method/<name>.yaml starts from them and declares no option again; the message carries that
declaration's values; methods and roles register by subclassing."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml
from omegaconf import OmegaConf

from pflower.protocol.options import option
from pflower.protocol.role_args import RoleArgs
from pflower.server_app.config import OPTIONS_GROUP, ConfigError, compose_config, conf_dir, method_defaults
from pflower.strategies import STRATEGIES, MethodOptions, OptionError, PersonalizedStrategy


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


def declaring_class(cls: type, name: str) -> type | None:
    """The class of ``cls``'s MRO whose own body declares field ``name``."""
    return next((c for c in cls.__mro__ if name in c.__dict__.get("__annotations__", {})), None)


def repeated_declarations(method: str, options: type, role_args: type) -> list[str]:
    """Where an option of ``method`` is declared twice: a field named in the bodies of two classes of
    its options' or its role arguments' MRO, or an option its client reads (a field of its role's
    arguments) declared apart from them (the options dataclass must extend the role's arguments)."""
    found = []
    for name in {f.name for f in dataclasses.fields(options)} | {f.name for f in dataclasses.fields(role_args)}:
        owners = {c for c in (*options.__mro__, *role_args.__mro__) if name in c.__dict__.get("__annotations__", {})}
        if len(owners) > 1:
            found.append(f"{method}: {name} in {sorted(c.__name__ for c in owners)}")
    return sorted(found)


def role_of(method: str) -> type:
    from pflower.client_app.roles import ROLES

    return ROLES[STRATEGIES[method].traits.role].args_type


@pytest.mark.parametrize("method", sorted(STRATEGIES))
def test_every_option_is_declared_once_and_the_client_reads_that_declaration(method):
    options, args = STRATEGIES[method].options_type, role_of(method)
    assert repeated_declarations(method, options, args) == []
    shared = set(options.names()) & set(args.names())
    assert all(declaring_class(options, n) is declaring_class(args, n) for n in shared), shared


def test_an_option_declared_again_is_caught():
    """The check itself: a MOON options class that declares tau again (another default) is named."""
    MOONArgs = role_of("moon")

    @dataclasses.dataclass(frozen=True)
    class RedeclaredMOON(MOONArgs):
        tau: float = option(0.2, "again")

    assert repeated_declarations("moon", RedeclaredMOON, MOONArgs) == ["moon: tau in ['MOONArgs', 'RedeclaredMOON']"]

    @dataclasses.dataclass(frozen=True)
    class ApartMOON(MethodOptions):  # the same name beside, not from, the role's arguments
        mu: float = option(1.0, "apart")

    assert repeated_declarations("moon", ApartMOON, MOONArgs) == ["moon: mu in ['ApartMOON', 'MOONArgs']"]


def built_role_args(method: str, **options):
    from pflower.models import build_model
    from pflower.strategies import client_spec
    from pflower.strategies.base.task_messages import role_args

    model = build_model("lenet5", (1, 28, 28), 10, seed=0)
    spec = {**client_spec(lr=0.01), "model": {"name": "lenet5"}}
    del spec["data"]  # the data spec is the runner's (FedMD reads its transfer set from it when given)
    run = {"total_rounds": 200} if "total_rounds" in STRATEGIES[method].options_type.names() else {}  # the paper's K
    strategy = STRATEGIES[method](model, spec, num_clients=4, fraction_train=0.5, **run, **options)
    return strategy, role_args(strategy, 0, 1)


@pytest.mark.parametrize("method", sorted(STRATEGIES))
def test_the_message_carries_the_options_its_client_reads(method):
    """Round 1's role arguments hold the method's value of every option its role declares (a
    resolved null aside: FedCMD's candidates, KAPC's omega_min) and travel whole."""
    strategy, args = built_role_args(method)
    options = strategy.options.to_dict()
    resolved = set(strategy.role_config(0, 1))
    assert {n: getattr(args, n) for n in args.names() if n in options and n not in resolved} == {
        n: options[n] for n in args.names() if n in options and n not in resolved
    }
    assert type(args).from_wire(args.wire(), strategy.traits.role) == args


def test_a_message_without_an_argument_or_with_an_unknown_one_is_refused_naming_it():
    from pflower.protocol.role_args import RoleArgsError

    MOONArgs = role_of("moon")
    with pytest.raises(RoleArgsError, match=r"role 'moon' got no \['tau'\]"):
        MOONArgs.from_wire({"mu": 1.0}, "moon")
    with pytest.raises(RoleArgsError, match=r"role 'moon' got unknown argument\(s\) \['nu'\]"):
        MOONArgs.from_wire({"mu": 1.0, "tau": 0.5, "nu": 1}, "moon")
    with pytest.raises(RoleArgsError, match=r"role 'moon': option tau must be > 0, got 0"):
        MOONArgs.from_wire({"mu": 1.0, "tau": 0}, "moon")


def test_a_sent_value_is_no_option():
    """FedCMD's phase is checked like an option but neither listed, composed nor accepted."""
    from pflower.strategies.fedcmd import FedCMDOptions

    assert "phase" not in FedCMDOptions.names() and "phase" not in FedCMDOptions.defaults()
    with pytest.raises(OptionError, match=r"has no option\(s\) \['phase'\]"):
        FedCMDOptions.build("fedcmd", {"phase": 1})
    with pytest.raises(OptionError, match="option phase must be one of"):
        role_of("fedcmd")(phase=3)


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
    assert all(issubclass(ROLES[n].args_type, RoleArgs) for n in ROLES)
    with pytest.raises(TypeError, match="method name 'fedavg' is taken"):
        type("Impostor", (PersonalizedStrategy,), {"name": "fedavg", "__module__": "pflower.strategies.impostor"})


def test_pflower_methods_prints_a_method_s_options_from_its_dataclass(capsys):
    from pflower.cli import main

    assert main(["methods", "fedprox"]) == 0
    out = capsys.readouterr().out
    assert "fedprox: client role proximal" in out
    assert re.search(r"\nmu +float +1\.0 +>= 0 +proximal weight", out), out
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
