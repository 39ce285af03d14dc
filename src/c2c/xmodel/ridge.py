"""Ridge regression in closed form, from sufficient statistics, for many (input, output) layer pairs.

Rows are tokens; ``x`` is a group of source layers' K (or V) side by side, ``(N, G * d_in)``;
``y`` a target layer's, ``(N, d_out)``. :class:`Moments` accumulates, over any number of
batches, what every fit and every score needs: ``n``, ``Σx`` and ``XᵀX`` blocks of the source
layers, ``Σy``, ``Σ|y|²`` per target layer, and ``XᵀY`` blocks per candidate pair. No token is
kept, so the memory is fixed however many tokens are seen, and scoring a fit on held-out
moments costs a few small matrix products.

A fit centres ``x`` and ``y`` on their means and solves ``(X̃ᵀX̃ + λI) W = X̃ᵀỸ`` with
``λ = alpha · tr(X̃ᵀX̃) / d_in`` (``alpha`` is scale-free); the bias is ``ȳ - x̄W``. The solve is
separable per output column, so one matrix is one ridge per target head, all with one ``λ``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class Linear:
    """``y ≈ x @ weight + bias``: ``weight (d_in, d_out)``, ``bias (d_out,)``, float64."""

    weight: torch.Tensor
    bias: torch.Tensor


class Moments:
    """Sufficient statistics of token rows for ridge fits of target layers on groups of source layers.

    A *candidate* for target layer ``t`` is a tuple of source layers whose rows, side by side,
    are the fit's input ``(N, len(group) * d_in)``. Moments are kept per source layer (``Σx``),
    per pair of source layers that share a group (``XᵃᵀXᵇ``), and per (source, target) pair
    (``XˢᵀYᵗ``), so overlapping groups share their blocks.

    Args:
        n_source: number of source layers.
        d_in, d_out: the width of one source / target layer (``kv_heads * head_dim``).
        candidates: for each target layer, its candidate groups of source layers.
    """

    def __init__(self, *, n_source: int, d_in: int, d_out: int, candidates: list[list[tuple[int, ...]]]):
        self.candidates = [[tuple(g) for g in c] for c in candidates]
        self.n = 0
        f64 = torch.float64
        self.sx = torch.zeros(n_source, d_in, dtype=f64)                                   # (Ls, d_in)
        pairs = {(a, b) for c in self.candidates for g in c for a in g for b in g if a <= b}
        self.sxx = {p: torch.zeros(d_in, d_in, dtype=f64) for p in sorted(pairs)}          # (d_in, d_in) each
        self.sy = torch.zeros(len(candidates), d_out, dtype=f64)                           # (Lt, d_out)
        self.syy = torch.zeros(len(candidates), d_out, dtype=f64)                          # (Lt, d_out) Σy² per dim
        self.sxy = {(s, t): torch.zeros(d_in, d_out, dtype=f64)                            # (d_in, d_out) each
                    for t, c in enumerate(self.candidates) for s in sorted({s for g in c for s in g})}

    def add(self, xs: list[torch.Tensor], ys: list[torch.Tensor]) -> None:
        """One batch of the same ``N`` tokens: ``xs[s]`` ``(N, d_in)`` per source layer, ``ys[t]`` ``(N, d_out)``."""
        self.n += ys[0].shape[0]
        for s in sorted({a for a, _ in self.sxx}):
            self.sx[s] += xs[s].float().sum(0).double()
        for (a, b), m in self.sxx.items():
            m += (xs[a].float().T @ xs[b].float()).double()  # NOTE: fp32 within a batch, fp64 across batches
        for t, y in enumerate(ys):
            y = y.float()
            self.sy[t] += y.sum(0).double()
            self.syy[t] += y.double().pow(2).sum(0)
        for (s, t), m in self.sxy.items():
            m += (xs[s].float().T @ ys[t].float()).double()

    def __iadd__(self, other: "Moments") -> "Moments":
        if other.candidates != self.candidates:
            raise ValueError("moments over different candidate layers cannot be added")
        self.n += other.n
        self.sx += other.sx
        self.sy += other.sy
        self.syy += other.syy
        for mine, theirs in ((self.sxx, other.sxx), (self.sxy, other.sxy)):
            for key, m in mine.items():
                m += theirs[key]
        return self

    def _blocks(self, t: int, j: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``Σx (D,)``, ``XᵀX (D, D)``, ``XᵀY (D, d_out)`` of candidate ``j`` of target ``t`` (``D = len(group) * d_in``)."""
        g = self.candidates[t][j]
        sx = torch.cat([self.sx[s] for s in g])
        sxx = torch.cat([torch.cat([self.sxx[(a, b)] if a <= b else self.sxx[(b, a)].T for b in g], 1) for a in g], 0)
        sxy = torch.cat([self.sxy[(s, t)] for s in g], 0)
        return sx, sxx, sxy

    # ------------------------------------------------------------------ fits
    def solve(self, t: int, j: int, alphas: list[float]) -> list[Linear]:
        """Ridge fits of target layer ``t`` on its ``j``-th candidate group, one per ``alpha``."""
        n = self.n
        sx, sxx, sxy = self._blocks(t, j)
        mx, my = sx / n, self.sy[t] / n                                          # (D,), (d_out,)
        g = sxx - n * torch.outer(mx, mx)                                        # (D, D) centred
        c = sxy - n * torch.outer(mx, my)                                        # (D, d_out) centred
        g = (g + g.T) / 2
        evals, q = torch.linalg.eigh(g)                                          # (D,), (D, D)
        qc = q.T @ c                                                             # (D, d_out)
        scale = max(float(g.diagonal().sum()) / g.shape[0], 1e-30)
        out = []
        for a in alphas:
            w = q @ (qc / (evals.clamp(min=0) + a * scale)[:, None])            # (D, d_out)
            out.append(Linear(weight=w, bias=my - mx @ w))
        return out

    def r2(self, t: int, j: int, fit: Linear) -> float:
        """R² of ``fit`` (target layer ``t`` from its ``j``-th candidate) on these moments' tokens.

        ``1 - Σ|y - ŷ|² / Σ|y - ȳ|²`` over every output dimension together (variance-weighted).
        """
        sx, sxx, sxy = self._blocks(t, j)
        w, b, n = fit.weight, fit.bias, self.n
        syy = self.syy[t].sum()
        sse = (syy - 2 * (w * sxy).sum() - 2 * b @ self.sy[t]
               + (w * (sxx @ w)).sum() + 2 * (sx @ w) @ b + n * b @ b)
        sst = syy - self.sy[t] @ self.sy[t] / n
        return float(1 - sse / sst) if sst > 0 else 0.0

    def match_variance(self, t: int, j: int, fit: Linear) -> Linear:
        """``fit`` with each output dimension's spread scaled to the target's, on these moments' tokens.

        A ridge prediction regresses to the mean: its variance is about R² times the target's.
        For keys that flattens attention (the logits ``q·k`` shrink), so a query can no longer
        single out the one token it needs. Scaling each output's deviation from the mean by
        ``sqrt(var(y_d) / var(ŷ_d))`` restores the spread (at the price of a higher squared
        error: R² becomes about ``2·sqrt(R²) - 1``). The result is still one linear map.
        """
        n = self.n
        sx, sxx, _ = self._blocks(t, j)
        mx, my = sx / n, self.sy[t] / n
        cov_x = (sxx - n * torch.outer(mx, mx)) / n                              # (D, D)
        var_pred = (fit.weight * (cov_x @ fit.weight)).sum(0)                    # (d_out,)
        var_y = self.syy[t] / n - my * my                                        # (d_out,)
        scale = torch.where(var_pred > 0, (var_y.clamp(min=0) / var_pred.clamp(min=1e-30)).sqrt(),
                            torch.ones_like(var_pred))                          # (d_out,)
        w = fit.weight * scale[None, :]
        return Linear(weight=w, bias=my - mx @ w)


class Residuals:
    """Held-out R² of fixed fits, accumulated from the rows themselves (per target layer)."""

    def __init__(self, n_target: int):
        self.n = 0
        self.sse = [0.0] * n_target
        self.sy: list[torch.Tensor | None] = [None] * n_target
        self.syy = [0.0] * n_target

    def add(self, t: int, y: torch.Tensor, pred: torch.Tensor) -> None:
        """``y`` and ``pred`` ``(N, d_out)`` of target layer ``t`` (call once per layer per batch)."""
        y64 = y.double()
        self.sse[t] += float((y64 - pred.double()).pow(2).sum())
        self.sy[t] = y64.sum(0) if self.sy[t] is None else self.sy[t] + y64.sum(0)
        self.syy[t] += float(y64.pow(2).sum())
        if t == 0:
            self.n += y.shape[0]

    def r2(self, t: int) -> float:
        if self.sy[t] is None or not self.n:
            return float("nan")
        sst = self.syy[t] - float(self.sy[t] @ self.sy[t]) / self.n
        return 1 - self.sse[t] / sst if sst > 0 else 0.0
