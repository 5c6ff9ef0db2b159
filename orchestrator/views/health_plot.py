"""The loss curve around training-health findings, as a PNG (`runctl health`; matplotlib, imported
only here, with the Agg backend: a login node has no display; it is in the `dev` extra, and without
it there is no plot, as for `runctl report`).

Top panel: every step read, the current history as a line, the steps a rollback abandoned as grey
crosses, each finding's onset as a red line and each rollback's target as a green one. Below, one
panel per finding (the last MAX_PANELS): `around` steps either side of it, with the trend the rule
compared with, the band of its margin around the trend, and the threshold.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.contract import health_events as hev
from orchestrator.views.health_report import HealthView

MAX_PANELS = 4


def _points(records) -> tuple[list[int], list[float]]:
    kept = [(r.step, r.loss) for r in records if r.loss is not None]
    return [s for s, _ in kept], [loss for _, loss in kept]


def _scale(ax, losses: list[float]) -> None:
    """A log axis when a spike dwarfs the curve (x8 spikes flatten the rest on a linear one)."""
    positive = [v for v in losses if v > 0]
    if positive and max(positive) > 5 * min(positive):
        ax.set_yscale("log")


def _trend_band(ax, finding) -> None:
    """The trend the rule judged against, from the newer half of its window (a spike's trend is
    local; the whole window for divergence) to the step the rule was met; for a spike, the band of
    its margin around the trend and the threshold (trend + margin)."""
    judged = finding.judged
    first, last = judged.window_steps
    xs = [first if finding.kind == "divergence" else (first + last) // 2, max(finding.step, last)]
    trend = [judged.trend + judged.slope * (x - judged.trend_step) for x in xs]
    ax.plot(xs, trend, color="tab:gray", linewidth=1, label=f"trend ({judged.slope:+.3g}/step)")
    if finding.kind == "loss_spike":
        low, high = [t - judged.margin for t in trend], [t + judged.margin for t in trend]
        ax.fill_between(
            xs,
            low,
            high,
            color="tab:gray",
            alpha=0.2,
            label=f"trend +- margin {judged.margin:.3g} (noise spread {judged.spread:.3g})",
        )
        ax.plot(xs, high, color="tab:red", linestyle="--", linewidth=1, label="threshold")


def plot_health(view: HealthView, output: Path, around: int = 50, title: str = "") -> Path | None:
    """The PNG written, or None without matplotlib."""
    try:
        import matplotlib  # noqa: PLC0415 - only `runctl health` pays for it

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return None

    in_history = {id(r) for r in view.history}
    abandoned = [r for r in view.records if id(r) not in in_history]
    targets = [e.to_step for e in view.events if isinstance(e, hev.RollbackPlanned)]
    findings = view.findings[-MAX_PANELS:]
    figure, axes = plt.subplots(1 + len(findings), 1, figsize=(10, 3.2 * (1 + len(findings))), squeeze=False)
    top = axes[0][0]
    steps, losses = _points(view.history)
    top.plot(steps, losses, color="tab:blue", linewidth=1, label="loss (current history)")
    if abandoned:
        a_steps, a_losses = _points(abandoned)
        top.scatter(a_steps, a_losses, color="grey", marker="x", s=12, label="abandoned by a rollback")
    for finding in view.findings:
        top.axvline(finding.onset_step, color="tab:red", linestyle="--", linewidth=1)
    for step in targets:
        top.axvline(step, color="tab:green", linestyle=":", linewidth=1.5)
    _scale(top, [r.loss for r in view.records if r.loss is not None])
    top.set_title(title or f"status {view.status}: red = onset of a finding, green = rollback target")
    top.set_xlabel("step")
    top.set_ylabel("loss")
    top.legend(loc="best", fontsize=8)
    for row, finding in enumerate(findings, start=1):
        ax = axes[row][0]
        low, high = finding.onset_step - around, finding.step + around
        near = [r for r in view.history if low <= r.step <= high]
        near_abandoned = [r for r in abandoned if low <= r.step <= high]
        s, v = _points(near)
        ax.plot(s, v, color="tab:blue", marker=".", linewidth=1)
        if near_abandoned:
            s, v = _points(near_abandoned)
            ax.scatter(s, v, color="grey", marker="x", s=14)
        if finding.kind in ("loss_spike", "divergence") and finding.judged is not None:  # in the loss's units
            _trend_band(ax, finding)
            ax.legend(loc="best", fontsize=8)
        ax.axvspan(finding.onset_step, finding.step, color="tab:red", alpha=0.15)
        _scale(ax, [r.loss for r in near + near_abandoned if r.loss is not None])
        ax.set_title(finding.message[:140], fontsize=8)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
    figure.tight_layout()
    output = Path(output)
    figure.savefig(output, dpi=80)
    plt.close(figure)
    return output
