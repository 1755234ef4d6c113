"""A method's options are declared twice, in its conf/method/<name>.yaml (what users see and
override) and as its strategy's keyword defaults (what code that builds it directly gets): the two
must agree, key for key and default for default."""

from __future__ import annotations

import inspect

import pytest
from omegaconf import OmegaConf

from server_app.config import compose_config
from strategies import STRATEGIES, PersonalizedStrategy, method_options


def interpolated(method: str) -> set[str]:
    """Keys whose yaml value is an interpolation (``total_rounds: ${rounds}``), in the method's file
    or a file it extends (``defaults: [kapc]``): their value is the run's, not a default."""
    from server_app.config import conf_dir

    raw = OmegaConf.load(conf_dir() / "method" / f"{method}.yaml")
    keys = {k for k in raw if k != "defaults" and OmegaConf.is_interpolation(raw, k)}
    for parent in raw.get("defaults", []) or []:
        if isinstance(parent, str) and parent != "_self_":
            keys |= interpolated(parent)
    return keys


def init_defaults(cls: type) -> dict[str, object]:
    """Keyword-only defaults of the strategy's __init__ chain (a subclass's own first)."""
    out: dict[str, object] = {}
    for klass in cls.__mro__:
        if klass is PersonalizedStrategy:
            break
        if "__init__" in vars(klass):
            for name, p in inspect.signature(klass.__init__).parameters.items():
                if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in out:
                    out[name] = p.default
    return out


@pytest.mark.parametrize("method", sorted(STRATEGIES))
def test_the_yaml_and_the_strategy_declare_the_same_options_and_defaults(method):
    cls = STRATEGIES[method]
    yaml_options = {k: v for k, v in OmegaConf.to_container(compose_config([f"method={method}"]).method, resolve=False).items()
                    if k != "name"}
    options = set(method_options(method))
    assert set(yaml_options) <= options, f"{method}: yaml keys the strategy does not take: {sorted(set(yaml_options) - options)}"
    # an option the yaml leaves out must come from a parent method (FedHe takes Felo's feature options
    # but sends no features): a method's own options are all in its yaml
    own = {k for k, p in inspect.signature(cls.__init__).parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY} if "__init__" in vars(cls) else set()
    missing = sorted((own & options) - set(yaml_options))
    assert not missing, f"{method}: options missing from conf/method/{method}.yaml: {missing}"
    defaults = init_defaults(cls)
    differ = {
        k: (v, defaults[k]) for k, v in yaml_options.items()
        if defaults.get(k) is not None and k not in interpolated(method) and defaults[k] is not inspect.Parameter.empty
        and v != defaults[k]
    }
    assert not differ, f"{method}: yaml default != strategy default (yaml, code): {differ}"
