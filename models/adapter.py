"""Any ``torch.nn.Module`` as a pflower model: its layer groups found from its structure.

pflower's methods speak in layer groups ("personalize fc2", "send conv1..fc1"), so a model is
an ordered list of named groups (:class:`~pflower.models.layered.LayeredNet`). :func:`adapt`
makes one of a user's module without changing what it computes: the module keeps its own
``forward``, and the groups are views of its submodules:

- by default every top-level child that holds parameters or buffers is a group, named after it,
  in registration order (children without state, such as a shared ``MaxPool2d``, stay outside);
- ``groups={"body": ["conv1", "conv2"], "head": ["fc"]}`` names them where that is wrong (a
  member is a submodule path, ``features.0`` included).

What a method needs from a model is found through forward hooks: each group's output (FedCMD's
and FedCPMD's layer statistics), the input of the last group (the feature vector Felo, Velo,
FedHe and MOON use, with the last group as the classifier). With an example input shape the
adapter checks once that the groups run in their order and that the module's output is the last
group's output, and names what to change where not.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .layered import LayeredNet


class ModelAdaptError(ValueError):
    """A module pflower cannot split into layer groups; the message names the module and the fix."""

    user_error = True  # one `pflower:` line in Flower's log, not a traceback (pflower.logs)


#: modules that turn logits into probabilities: pflower's clients train with cross-entropy on the
#: model's output, so it must be the logits (a softmax after the last layer is a different loss)
OUTPUT_TRANSFORMS = (nn.Softmax, nn.LogSoftmax, nn.Softmin, nn.Sigmoid)


def reseeded(module: nn.Module, seed: int) -> nn.Module:
    """A copy of ``module`` with every layer re-initialized from ``seed`` (each submodule's own
    ``reset_parameters``, in module order): the server's initial weights of a user's model, the
    same in every run with that seed. The caller's module and torch's global generator are left
    as they were; a layer without ``reset_parameters`` keeps the values it has."""
    copied = copy.deepcopy(module)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for sub in copied.modules():
            reset = getattr(sub, "reset_parameters", None)
            if callable(reset):
                reset()
    return copied


def check_logits(net: nn.Module) -> None:
    """Refuse a user's module whose top-level children, after its last layer group, include a
    softmax-like module: its output would not be the logits pflower's cross-entropy expects."""
    if not isinstance(net, AdaptedNet):
        return
    last_member = net.group_members[net.group_names[-1]][-1].split(".")[0]
    children = list(net.wrapped.named_children())
    names = [name for name, _ in children]
    if last_member not in names:
        return
    for name, child in children[names.index(last_member) + 1 :]:
        if isinstance(child, OUTPUT_TRANSFORMS):
            raise ModelAdaptError(
                f"{type(net.wrapped).__name__}.{name} ({type(child).__name__}) comes after the last layer group "
                f"{net.group_names[-1]!r}: pflower's clients train with cross-entropy on the model's output, which "
                f"must be the logits; remove {type(child).__name__} from the model (cross-entropy on logits equals "
                "NLLLoss on log-probabilities)"
            )


def default_groups(module: nn.Module) -> OrderedDict[str, list[str]]:
    """Every top-level child with parameters or buffers as its own group, in registration order."""
    own = [n for n, _ in module.named_parameters(recurse=False)] + [n for n, _ in module.named_buffers(recurse=False)]
    if own:
        raise ModelAdaptError(
            f"{type(module).__name__} holds {own} itself, not in a child module, so no layer group owns "
            "them: move them into a child module, or name the groups with groups={...}"
        )
    groups = OrderedDict(
        (name, [name])
        for name, child in module.named_children()
        if any(True for _ in child.parameters()) or any(True for _ in child.buffers())
    )
    if not groups:
        raise ModelAdaptError(f"{type(module).__name__} has no child module with parameters to make layer groups of")
    return groups


def _resolve(module: nn.Module, groups: Mapping[str, Sequence[str] | str]) -> OrderedDict[str, nn.Module]:
    """Group name -> the module that holds it (the member, or a ModuleDict of several members)."""
    out: OrderedDict[str, nn.Module] = OrderedDict()
    for group, members in groups.items():
        if not isinstance(group, str) or not group or "." in group:
            raise ModelAdaptError(f"layer group name {group!r}: use a non-empty name without '.'")
        names = [members] if isinstance(members, str) else list(members)
        if not names:
            raise ModelAdaptError(f"layer group {group!r} names no module")
        found = {}
        for name in names:
            try:
                found[name] = module.get_submodule(name)
            except AttributeError:
                children = [n for n, _ in module.named_children()]
                raise ModelAdaptError(
                    f"layer group {group!r}: {type(module).__name__} has no submodule {name!r} "
                    f"(its children: {children})"
                ) from None
        out[group] = (
            found[names[0]] if len(names) == 1 else nn.ModuleDict({n.replace(".", "_"): m for n, m in found.items()})
        )
    return out


def _check_coverage(module: nn.Module, resolved: Mapping[str, nn.Module]) -> None:
    """Every parameter and buffer in exactly one group (a tensor no group holds would never train
    or travel; one in two groups would be sent twice)."""
    owner: dict[int, str] = {}
    for group, sub in resolved.items():
        for tensor in [*sub.parameters(), *sub.buffers()]:
            if id(tensor) in owner and owner[id(tensor)] != group:
                raise ModelAdaptError(f"layer groups {owner[id(tensor)]!r} and {group!r} share tensors: name each once")
            owner[id(tensor)] = group
    missing = [name for name, t in [*module.named_parameters(), *module.named_buffers()] if id(t) not in owner]
    if missing:
        raise ModelAdaptError(f"no layer group holds {missing[:5]}: add their modules to a group (groups={{...}})")


class AdaptedNet(LayeredNet):
    """A user's module seen as a :class:`LayeredNet`: ``forward`` is the module's own, the groups
    share its submodules (``groups.<group>.<key>`` state-dict keys, as every pflower model)."""

    def __init__(self, module: nn.Module, groups: Mapping[str, Sequence[str] | str] | None = None) -> None:
        spec = default_groups(module) if groups is None else groups
        resolved = _resolve(module, spec)
        _check_coverage(module, resolved)
        super().__init__(resolved)
        # the wrapped module is kept out of the module tree (its tensors are registered once,
        # through the groups); deepcopy copies it with the groups and keeps them shared
        self.__dict__["wrapped"] = module
        self.group_members = {g: ([m] if isinstance(m, str) else list(m)) for g, m in spec.items()}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The wrapped module's own forward: the groups only name its tensors."""
        return self.wrapped(x)

    def train(self, mode: bool = True) -> AdaptedNet:
        """Set the mode on the groups and on the wrapped module, whose forward may read its own flag."""
        super().train(mode)
        self.wrapped.train(mode)  # its own flag too: a forward that reads self.training
        return self

    def _members(self, group: str) -> list[nn.Module]:
        sub = self.groups[group]
        return list(sub.values()) if isinstance(sub, nn.ModuleDict) else [sub]

    def _trace(self, x: torch.Tensor) -> tuple[torch.Tensor, list[str], dict[str, torch.Tensor]]:
        """Run the module once; (output, groups in the order first called, each group's last output)."""
        order: list[str] = []
        outputs: dict[str, torch.Tensor] = {}
        handles = []
        for group in self.group_names:
            for member in self._members(group):

                def hook(_m: nn.Module, _i: Any, out: Any, group: str = group) -> None:
                    if group not in order:
                        order.append(group)
                    outputs[group] = out

                handles.append(member.register_forward_hook(hook))
        try:
            y = self.wrapped(x)
        finally:
            for h in handles:
                h.remove()
        return y, order, outputs

    def forward_groups(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Each group's output in group order (a group run twice: its last output); the last is the logits."""
        y, _, outputs = self._trace(x)
        missing = [g for g in self.group_names if g not in outputs]
        if missing:
            raise ModelAdaptError(f"layer group(s) {missing} did not run in this forward pass")
        result = [outputs[g] for g in self.group_names]
        if result[-1] is not y:
            raise ModelAdaptError(
                f"the module's output is not the output of its last layer group {self.group_names[-1]!r}: "
                "make the classifier the last group (groups={...})"
            )
        return result

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The input of the last group (the classifier): the representation the feature methods use."""
        head = self._members(self.group_names[-1])
        if len(head) != 1:
            raise ModelAdaptError(
                f"the last layer group {self.group_names[-1]!r} has {len(head)} modules: a method that needs the "
                "features (the classifier's input) needs a classifier group of one module"
            )
        seen: list[torch.Tensor] = []

        def grab(_m: nn.Module, args: tuple[Any, ...]) -> None:
            seen.append(args[0])

        handle = head[0].register_forward_pre_hook(grab)
        try:
            self.wrapped(x)
        finally:
            handle.remove()
        return seen[-1]

    def check(self, in_shape: Sequence[int]) -> None:
        """One forward pass of zeros (eval mode, no gradient): the groups run in their order and the
        output is the last group's. Raises :class:`ModelAdaptError` naming the fix."""
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                y, order, outputs = self._trace(torch.zeros(2, *in_shape))
        except ModelAdaptError:
            raise
        except Exception as err:  # noqa: BLE001 - the user's forward on this input shape
            raise ModelAdaptError(
                f"{type(self.wrapped).__name__} does not run on inputs of shape {list(in_shape)}: "
                f"{type(err).__name__}: {err}"
            ) from err
        finally:
            self.train(was_training)
        never = [g for g in self.group_names if g not in order]
        if never:
            raise ModelAdaptError(f"layer group(s) {never} never run in {type(self.wrapped).__name__}'s forward")
        if order != self.group_names:
            raise ModelAdaptError(
                f"the layer groups run in the order {order}, not {self.group_names} (registration order): "
                f"name them in forward order, groups={{{', '.join(repr(g) + ': [...]' for g in order)}}}"
            )
        if outputs[self.group_names[-1]] is not y:
            raise ModelAdaptError(
                f"{type(self.wrapped).__name__}'s output is not the output of its last layer group "
                f"{self.group_names[-1]!r}: the last group must be the classifier (groups={{...}})"
            )


def own_names(net: nn.Module) -> dict[str, str]:
    """pflower's state-dict key -> the same tensor's key in the module the user wrote (an adapted
    module: ``groups.fc3.weight`` -> ``fc3.weight``); every key maps to itself for a pflower model.
    What a Flower user's own code (``Net().load_state_dict``, ``ArrayRecord(net.state_dict())``)
    reads and writes, found by tensor identity, so any grouping maps back."""
    state = net.state_dict(keep_vars=True)
    wrapped = net.__dict__.get("wrapped")
    if wrapped is None:
        return {key: key for key in state}
    theirs: dict[int, str] = {}
    for key, tensor in wrapped.state_dict(keep_vars=True).items():
        theirs.setdefault(id(tensor), key)  # a tied tensor: its first name
    return {key: theirs.get(id(tensor), key) for key, tensor in state.items()}


def adapt(
    module: nn.Module,
    groups: Mapping[str, Sequence[str] | str] | None = None,
    in_shape: Sequence[int] | None = None,
) -> LayeredNet:
    """``module`` as a pflower model (a LayeredNet is returned as it is).

    ``groups``: group name -> submodule names, in forward order (default: the top-level children
    with parameters). ``in_shape`` (C, H, W): check the groups' order and the classifier with one
    forward pass of zeros."""
    if isinstance(module, LayeredNet):
        if groups is not None:
            raise ModelAdaptError("the model is a LayeredNet already: its groups are its own (leave groups unset)")
        return module
    if not isinstance(module, nn.Module):
        raise ModelAdaptError(f"a model must be a torch.nn.Module, got {type(module).__name__}")
    net = AdaptedNet(module, groups)
    if in_shape is not None:
        net.check(in_shape)
    return net
