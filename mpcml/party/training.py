"""How a batch of a train job moves the model: the exact fused gradient, or CrypTen's loss.

A model that ends in Sigmoid trained with BCE, one that ends in Softmax (or in logits) trained
with cross-entropy, and any model trained with MSE are trained from the gradient with respect
to their logits z, computed exactly: (p - y) / rows with p = sigmoid(z) or softmax(z), and
2 (z - y) / elements for MSE. CrypTen's BCE backward pays, every batch, for the reciprocals of
p and 1 - p and its forward for two logs, none of which the gradient needs. The loss a round
reports is the same quantity as before (the mean over the round's batches, each at the weights
of its step), evaluated once at the end of the round from the logits kept during it, in the
logits form (softplus(z) - y z; logsumexp(z) - z_y; (z - y)^2), and only when some recipient
asked for metrics. Any other combination, or a job with `crypten_loss`, trains through
CrypTen's loss module and autograd as stock CrypTen does.

A model ending in Softmax trained with cross-entropy is trained as softmax regression, either
way: the cross-entropy of the Softmax's input logits, which is what its Softmax computes
probabilities from (and how a CrypTen user trains such a model).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import crypten
import torch

from mpcml.approx.implementations import apply
from mpcml.approx.plan import Choice
from mpcml.graph.build import head
from mpcml.graph.ops import SIGMOIDS, SOFTMAXES
from mpcml.proto.v1 import graph_pb2 as gpb
from mpcml.proto.v1 import job_pb2 as jpb
from mpcml.runtime import profile

BCE, CROSS_ENTROPY, MSE = jpb.LOSS_BCE, jpb.LOSS_CROSS_ENTROPY, jpb.LOSS_MSE


class Trainer(Protocol):
    """One train job's batches."""

    def step(self, x: Any, y: Any) -> None:
        """Train on one batch: forward, gradient, optimiser step."""
        ...

    def round_loss(self) -> Any | None:
        """The mean loss of the round's batches (a CrypTensor), None when nobody asked.

        The round is forgotten: the next call is about the next round.
        """
        ...


class AutogradTrainer:
    """CrypTen's own path: its loss module, autograd from the loss, the optimiser.

    `forward` is what the loss is taken of: the model, or the logits of a model ending in
    Softmax trained with cross-entropy (which is how a CrypTen user trains it).
    """

    def __init__(self, net: Any, optimizer: Any, loss: int, forward: Any = None) -> None:
        self.net, self.optimizer = net, optimizer
        self.forward = forward if forward is not None else net
        losses: dict[int, Any] = {
            BCE: crypten.nn.BCELoss,
            CROSS_ENTROPY: crypten.nn.CrossEntropyLoss,
            MSE: crypten.nn.MSELoss,
        }
        self.loss_fn = losses[loss]()
        self._losses: list[Any] = []

    def step(self, x: Any, y: Any) -> None:
        """Forward, CrypTen's loss, autograd from it, the optimiser's step."""
        out = self.forward(x)
        with profile.measure("(loss)", "loss"):
            loss = self.loss_fn(out, y)
        with profile.measure("(backward)", "backward"):
            self.net.zero_grad()
            loss.backward()
        with profile.measure("(optimizer)", "optimizer"):
            self.optimizer.step()
        self._losses.append(loss.detach())

    def round_loss(self) -> Any | None:
        """The mean of the losses the batches computed anyway."""
        losses, self._losses = self._losses, []
        with profile.measure("(round loss)", "loss"):
            return self._mean(losses)

    @staticmethod
    def _mean(losses: list[Any]) -> Any:
        total = losses[0]
        for loss in losses[1:]:
            total = total + loss
        return total / len(losses)


@dataclass
class _Kept:
    z: Any
    y: Any


class FusedTrainer:
    """The exact gradient with respect to the logits; the loss once per round.

    p is computed as the plan says for the model's final Sigmoid or Softmax (`activation`); one
    the plan leaves to CrypTen is computed by the registry's `rowmax` softmax or `range`
    sigmoid, CrypTen's arithmetic in fewer rounds, as accurate.
    """

    def __init__(
        self,
        logits: Any,
        net: Any,
        optimizer: Any,
        loss: int,
        want_loss: bool,
        activation: Choice | None = None,
    ) -> None:
        self.logits, self.net, self.optimizer, self.loss = logits, net, optimizer, loss
        self.want_loss = want_loss
        self.activation = activation
        self._kept: list[_Kept] = []

    def _p(self, z: Any, function: str) -> Any:
        choice = self.activation
        if choice is not None and not choice.is_crypten:
            return apply(function, choice.implementation, z, choice.knobs, 1)
        if function == "softmax":
            # CrypTen's softmax finds the row's argmax to take its maximum: 93 rounds at 2
            # parties where `rowmax`, as accurate, takes 25 (docs/approximations.md).
            return apply("softmax", "rowmax", z, {}, 1)
        # CrypTen's sigmoid with its sum's reciprocal seeded for [1, 2]: fewer rounds.
        return apply("sigmoid", "range", z, {}, 1)

    def _gradient(self, z: Any, y: Any) -> Any:
        if self.loss == BCE:
            return (self._p(z, "sigmoid") - y).div(z.size(0))
        if self.loss == CROSS_ENTROPY:
            return (self._p(z, "softmax") - y).div(z.size(0))
        return (z - y).mul(2.0 / z.nelement())

    def step(self, x: Any, y: Any) -> None:
        """Logits, their exact gradient, backward from them, the optimiser's step."""
        z = self.logits(x)
        with crypten.no_grad(), profile.measure("(loss gradient)", "gradient"):
            gradient = self._gradient(z, y)
        with profile.measure("(backward)", "backward"):
            self.net.zero_grad()
            z.backward(gradient)
        with profile.measure("(optimizer)", "optimizer"):
            self.optimizer.step()
        if self.want_loss:
            self._kept.append(_Kept(z.detach(), y))

    def _terms(self, z: Any, y: Any) -> Any:
        """Each row's (or element's) loss, in the logits form."""
        if self.loss == BCE:
            sign = z.sign()
            magnitude = z * sign
            softplus = (z + magnitude).div(2) + (-magnitude).exp().add(1).log()
            return softplus - y * z
        if self.loss == CROSS_ENTROPY:
            return -(y * z.log_softmax(1)).sum(1)
        return (z - y).square()

    def round_loss(self) -> Any | None:
        """The round's loss from the logits kept, or None when nobody asked for it."""
        kept, self._kept = self._kept, []
        if not self.want_loss or not kept:
            return None
        with crypten.no_grad(), profile.measure("(round loss)", "loss"):
            z = crypten.cat([k.z for k in kept]) if len(kept) > 1 else kept[0].z
            y = crypten.cat([k.y for k in kept]) if len(kept) > 1 else kept[0].y
            terms = self._terms(z, y)
            # Each batch's mean, then their mean: one public weight per term.
            shapes = [self._term_shape(k.z) for k in kept]
            weights = torch.cat(
                [
                    torch.full(shape, 1.0 / (len(kept) * math.prod(shape)), device=z.device)
                    for shape in shapes
                ]
            )
            return (terms * weights).sum()

    def _term_shape(self, z: Any) -> tuple[int, ...]:
        shape = tuple(int(d) for d in z.size())
        return shape[:1] if self.loss == CROSS_ENTROPY else shape


class BatchedSGD(crypten.optim.SGD):  # type: ignore[misc]
    """CrypTen's SGD with momentum and weight decay, every parameter updated in one tensor.

    A product with a public float (the momentum, the learning rate, the weight decay) ends in a
    truncation, which at 3 or more parties is a round of its own: CrypTen's step pays one per
    product per parameter (an MLP's four parameters with momentum, 8 rounds a batch), this one
    a single round a step. CrypTen's update (d = grad + weight_decay p, buf = momentum buf + d,
    p = p - lr buf) is written out as sums of products of the gradient, the parameters and the
    previous buffer with public floats (the step is lr grad + lr weight_decay p + lr momentum
    buf), all taken as one product with a vector of those floats. The momentum buffers stay
    per parameter in `state`, as CrypTen keeps them, for checkpoints.
    """

    def step(self, closure: Any = None) -> None:
        """One update of every parameter that has a gradient."""
        if closure is not None:
            raise ValueError("BatchedSGD takes no closure")
        with crypten.no_grad():
            for group in self.param_groups:
                params = [p for p in group["params"] if p.grad is not None]
                if params:
                    self._update(group, params)

    def _update(self, group: Mapping[str, Any], params: list[Any]) -> None:
        lr, decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
        grad = _flat([p.grad for p in params])
        # The terms of the buffer besides the gradient, each with its public factor.
        terms = [(_flat(params), decay)] if decay else []
        states = [self.state[id(p)] for p in params]
        kept = [s.get("momentum_buffer") for s in states]
        if momentum and any(b is not None for b in kept):
            # A parameter without a buffer yet starts from zero, as CrypTen's buf = d.
            zeros = _split(grad.mul(0), params)
            previous = [z if b is None else b for b, z in zip(kept, zeros, strict=True)]
            terms.append((_flat(previous), momentum))
        inputs = [grad] + [t for t, _ in terms]
        factors = [lr] + [lr * f for _, f in terms]
        if momentum:
            inputs += [t for t, _ in terms]
            factors += [f for _, f in terms]
        n = grad.nelement()
        scale = torch.cat([torch.full((n,), float(f), device=grad.device) for f in factors])
        products = _flat(inputs).mul(scale)
        parts = [products[i * n : (i + 1) * n] for i in range(len(factors))]
        steps = 1 + len(terms)
        update = parts[0]
        for part in parts[1:steps]:
            update = update.add(part)
        if momentum:
            buf = grad.clone()
            for part in parts[steps:]:
                buf = buf.add(part)
            for state, piece in zip(states, _split(buf, params), strict=True):
                state["momentum_buffer"] = piece
        for p, piece in zip(params, _split(update, params), strict=True):
            p.sub_(piece)


def _flat(tensors: list[Any]) -> Any:
    return crypten.cat([t.flatten() for t in tensors]) if len(tensors) > 1 else tensors[0].flatten()


def _split(flat: Any, like: list[Any]) -> list[Any]:
    pieces, offset = [], 0
    for t in like:
        n = t.nelement()
        pieces.append(flat[offset : offset + n].reshape(t.size()))
        offset += n
    return pieces


def trainer(
    spec: jpb.JobSpec,
    net: Any,
    optimizer: Any,
    want_loss: bool,
    choices: Mapping[str, Choice] | None = None,
) -> AutogradTrainer | FusedTrainer:
    """The trainer for `spec`: fused where the model and the loss allow it."""
    loss = spec.hyper.loss
    logits = _logits(spec.graph, net, loss)
    if spec.hyper.crypten_loss or logits is None:
        softmax_regression = loss == CROSS_ENTROPY and logits is not None and logits is not net
        return AutogradTrainer(net, optimizer, loss, logits if softmax_regression else None)
    last = spec.graph.nodes[-1].name
    activation = (choices or {}).get(last) if logits is not net else None
    return FusedTrainer(logits, net, optimizer, loss, want_loss, activation)


def _logits(graph: gpb.Graph, net: Any, loss: int) -> Any | None:
    """The module computing the logits the fused gradient starts from, or None."""
    last = graph.nodes[-1]
    ends_in = last.op if graph.output == last.name else ""
    softmax = ends_in in SOFTMAXES
    dim = last.attrs["dim"].i if softmax else 0
    if loss == BCE and ends_in in SIGMOIDS:
        return head(graph, net)
    if loss == CROSS_ENTROPY and softmax and dim in (1, -1):
        return head(graph, net)
    if loss == CROSS_ENTROPY and not softmax:
        return net
    if loss == MSE:
        return net
    return None
