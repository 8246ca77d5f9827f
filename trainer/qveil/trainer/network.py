"""The Q-network: an MLP on the UNIT state x in [0, 1], Lipschitz in x by construction.

Theorem 5 (and output mode's RKHS bound) needs every Q(., a) to be L-Lipschitz in the state
the noise lives on, the unit state x (beta is defined on [0, 1]). So the network's input is x,
not the raw state, and its layers are bounded by construction:

    Q(x) = W_n relu(... relu(W_1 x + b_1) ...) + b_n,     ReLU is 1-Lipschitz,

each hidden-layer weight is used as W = V c / max(c, ||V||_2) (exact spectral norm, by SVD)
and each row of the output layer as w_a = v_a c / max(c, ||v_a||_2), with c = L^(1/n). Then
|dQ_a/dx| <= ||w_a|| prod_i ||W_i||_2 <= c^n = L for every x and a, whatever the raw
parameters V are. A raw-state Lipschitz bound is L / (hi - lo).

The exported arrays (``W0, b0, W1, b1, ...``, shape (out, in), y = h @ W.T + b) are the
*effective* weights; :func:`qveil.bundle.lipschitz_bound` recomputes the bound from them and
the bundle writer checks it numerically as well.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["LipschitzMLP"]


class LipschitzMLP(nn.Module):
    """1 -> hidden... -> m MLP with ReLU, each action's output L-Lipschitz in x."""

    def __init__(
        self,
        *,
        n_actions: int,
        hidden: tuple[int, ...],
        lipschitz: float,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        widths = [1, *hidden, n_actions]
        self.n_actions = int(n_actions)
        self.lipschitz = float(lipschitz)
        self.n_layers = len(widths) - 1
        self.layer_bound = self.lipschitz ** (1.0 / self.n_layers)
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(widths[:-1], widths[1:], strict=True):
            bound = 1.0 / fan_in**0.5  # torch.nn.Linear's default initialisation
            w = torch.empty(fan_out, fan_in, dtype=torch.float64)
            b = torch.empty(fan_out, dtype=torch.float64)
            nn.init.uniform_(w, -bound, bound, generator=generator)
            nn.init.uniform_(b, -bound, bound, generator=generator)
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(b))

    def effective_weights(self) -> list[torch.Tensor]:
        """The weights actually used: each layer rescaled so that its norm is <= L^(1/n)."""
        c = self.layer_bound
        out = []
        last = self.n_layers - 1
        for i, v in enumerate(self.weights):
            if i == last:
                norms = torch.linalg.vector_norm(v, dim=1, keepdim=True)
            else:
                norms = torch.linalg.matrix_norm(v, ord=2)
            out.append(v * (c / torch.clamp(norms, min=c)))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: unit states, shape (n,) or (n, 1) -> Q values, shape (n, m)."""
        h = x.reshape(-1, 1).to(torch.float64)
        ws = self.effective_weights()
        for i, (w, b) in enumerate(zip(ws, self.biases, strict=True)):
            h = h @ w.T + b
            if i < self.n_layers - 1:
                h = torch.relu(h)
        return h

    def export(self) -> dict[str, np.ndarray]:
        """Effective weights as numpy arrays ``W0, b0, W1, b1, ...`` (the bundle format)."""
        with torch.no_grad():
            ws = self.effective_weights()
            out: dict[str, np.ndarray] = {}
            for i, (w, b) in enumerate(zip(ws, self.biases, strict=True)):
                out[f"W{i}"] = w.detach().cpu().numpy().astype(np.float64).copy()
                out[f"b{i}"] = b.detach().cpu().numpy().astype(np.float64).copy()
        return out
