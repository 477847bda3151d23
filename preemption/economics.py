"""Spot economics: is a checkpointed job cheaper on spot? Pure functions, no Django.

Inputs (hours and prices):
  P_on on-demand price per hour, d spot discount (0.7: spot costs 30 % of P_on),
  M mean time between interruptions, C checkpoint write cost, R restart cost,
  W useful compute, T checkpoint interval.

Per hour of wall clock, a job loses C/T to writing checkpoints and, once per
interruption (1/M per hour), the work since the last checkpoint (T/2 on
average) plus the restart R. So

  H = W / (1 - C/T - (T/2 + R)/M)                 wall-clock hours
  cost_spot = H * P_on * (1 - d)    cost_on_demand = W * P_on
  cost_ratio = (H/W)(1 - d)         effective_discount = 1 - (H/W)(1 - d)
  T_opt = sqrt(2 C M)                             (Young, 1974)

When the denominator is zero or negative the job makes no net progress.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Inputs:
    on_demand_price: float
    discount: float
    mtbi_hours: float
    checkpoint_hours: float
    restart_hours: float
    work_hours: float
    interval_hours: float | None = None  # None: the optimum, T_opt


@dataclass(frozen=True)
class Result:
    inputs: dict[str, float | bool | None]
    wall_clock_hours: float | None
    cost_spot: float | None
    cost_on_demand: float
    cost_ratio: float | None
    effective_discount: float | None
    optimal_interval_hours: float
    progress_rate: float
    no_net_progress: bool
    message: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def optimal_interval(*, checkpoint_hours: float, mtbi_hours: float) -> float:
    """Young's first-order optimum T_opt = sqrt(2 C M)."""
    return math.sqrt(2.0 * checkpoint_hours * mtbi_hours)


def progress_rate(*, checkpoint_hours: float, restart_hours: float, mtbi_hours: float, interval_hours: float) -> float:
    """Useful hours per wall-clock hour: 1 - C/T - (T/2 + R)/M.

    With C = 0 the optimum is T -> 0 and C/T is taken as its limit, 0.
    """
    if mtbi_hours <= 0:
        raise ValueError("mtbi_hours must be positive")
    if interval_hours <= 0:
        if checkpoint_hours > 0 or interval_hours < 0:
            raise ValueError("interval_hours must be positive when checkpoints cost time")
        checkpoint_share = 0.0
    else:
        checkpoint_share = checkpoint_hours / interval_hours
    return 1.0 - checkpoint_share - (interval_hours / 2.0 + restart_hours) / mtbi_hours


def wall_clock_hours(
    *, work_hours: float, checkpoint_hours: float, restart_hours: float, mtbi_hours: float, interval_hours: float
) -> float | None:
    """H = W / (1 - C/T - (T/2 + R)/M), or None when the job makes no net progress."""
    rate = progress_rate(
        checkpoint_hours=checkpoint_hours, restart_hours=restart_hours, mtbi_hours=mtbi_hours, interval_hours=interval_hours
    )
    return work_hours / rate if rate > 0 else None


def compute(inputs: Inputs) -> Result:
    _check(inputs)
    P, d, M, C, R, W = (
        inputs.on_demand_price, inputs.discount, inputs.mtbi_hours,
        inputs.checkpoint_hours, inputs.restart_hours, inputs.work_hours,
    )
    t_opt = optimal_interval(checkpoint_hours=C, mtbi_hours=M)
    T = t_opt if inputs.interval_hours is None else inputs.interval_hours
    rate = progress_rate(checkpoint_hours=C, restart_hours=R, mtbi_hours=M, interval_hours=T)
    used = {
        "on_demand_price": P, "discount": d, "mtbi_hours": M, "checkpoint_hours": C,
        "restart_hours": R, "work_hours": W, "interval_hours": T,
        "interval_is_optimal": inputs.interval_hours is None,
    }
    cost_on_demand = W * P
    if rate <= 0:
        return Result(
            inputs=used, wall_clock_hours=None, cost_spot=None, cost_on_demand=cost_on_demand,
            cost_ratio=None, effective_discount=None, optimal_interval_hours=t_opt, progress_rate=rate,
            no_net_progress=True, message=no_progress_message(C=C, R=R, M=M, T=T, t_opt=t_opt),
        )
    H = W / rate
    ratio = (H / W) * (1 - d)
    effective = 1 - ratio
    return Result(
        inputs=used, wall_clock_hours=H, cost_spot=H * P * (1 - d), cost_on_demand=cost_on_demand,
        cost_ratio=ratio, effective_discount=effective, optimal_interval_hours=t_opt, progress_rate=rate,
        no_net_progress=False,
        message=(
            f"{W:g} h of work take {H:.4g} h on spot; spot costs {ratio:.1%} of on-demand, "
            f"an effective discount of {effective:.1%} against the {d:.0%} list discount."
        ),
    )


def no_progress_message(*, C: float, R: float, M: float, T: float, t_opt: float) -> str:
    checkpoints = C / T if T > 0 else 0.0
    lost, restart = T / 2 / M, R / M
    text = (
        "This job makes no net progress on spot: it never finishes. Per hour, checkpoints take "
        f"{checkpoints:.0%}, work lost since the last checkpoint {lost:.0%} and restarts {restart:.0%} "
        "of the time, which adds up to all of it or more. "
        f"R is the term to fix: a restart of {R:g} h against {M:g} h between interruptions costs "
        f"{restart:.0%} whatever the checkpoint interval; make restarts faster, or choose a pool "
        "that is interrupted less often."
    )
    best = 1 - (C / t_opt if t_opt > 0 else 0.0) - (t_opt / 2 + R) / M
    if T != t_opt and best > 0:
        text += f" At the optimal interval of {t_opt:.3g} h the job would progress."
    return text


def discount_curve(inputs: Inputs, *, points: int = 48) -> list[tuple[float, float | None]]:
    """(T, effective discount) from T_opt/8 to 4 T_opt on a log scale: how flat the optimum is.

    None where the job makes no net progress at that T.
    """
    _check(inputs)
    t_opt = optimal_interval(checkpoint_hours=inputs.checkpoint_hours, mtbi_hours=inputs.mtbi_hours)
    centre = t_opt if t_opt > 0 else (inputs.interval_hours or 0.0)
    if centre <= 0:
        return []
    lo, hi = math.log(centre / 8), math.log(centre * 4)
    curve = []
    for i in range(points):
        T = math.exp(lo + (hi - lo) * i / (points - 1))
        rate = progress_rate(
            checkpoint_hours=inputs.checkpoint_hours, restart_hours=inputs.restart_hours,
            mtbi_hours=inputs.mtbi_hours, interval_hours=T,
        )
        curve.append((T, 1 - (1 - inputs.discount) / rate if rate > 0 else None))
    return curve


def _check(inputs: Inputs) -> None:
    if min(inputs.on_demand_price, inputs.checkpoint_hours, inputs.restart_hours) < 0:
        raise ValueError("prices and costs cannot be negative")
    if not 0 <= inputs.discount <= 1:
        raise ValueError("discount is between 0 and 1")
    if inputs.mtbi_hours <= 0 or inputs.work_hours <= 0:
        raise ValueError("mtbi_hours and work_hours must be positive")
    if inputs.interval_hours is not None and inputs.interval_hours <= 0:
        raise ValueError("interval_hours must be positive")
