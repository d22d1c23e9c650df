"""The divergence guard of lossy schedules (`--schedule-guard on|off`): exact exchanges for a while when training
goes wrong.

A lossy schedule (anything but `exact`) trains on halo rows or gradients that
are not this epoch's. Where it does not hold (a graph whose boundary dominates
a weak signal), training does not crash: the loss climbs and stays up, or the
model flips to predicting the wrong class, and the run ends quietly worse. The
guard watches the two symptoms after every epoch, on figures every rank holds
alike (the global training loss and the validation accuracy):

- the mean training loss of the last `patience` epochs is above the lowest
  such mean so far by more than `rise` times the first epoch's loss (a mean
  over epochs, so one noisy epoch or stale:R's saw-tooth does not fire it;
  measured on the scale of an untrained model's loss, so the relative noise
  of a loss near zero late in training does not either);
- the validation accuracy stays `collapse` below the rate of the validation
  set's majority class for `collapse_patience` evaluations in a row, once
  `warmup` epochs have passed (early epochs often predict one class while the
  model finds its footing, and one evaluation may dip on a weak-signal graph).

The thresholds (GuardRule) come from replaying the rule over every run of the
schedule battery (benchmarks/results/schedules-battery.md): healthy runs let
their 5-epoch mean loss rise up to 0.36 x the first loss above its best
(twitch FR at P=8 under stale:4, which ended above exact) and dipped 0.10 below
the majority rate for up to 6 evaluations in a row (pipeline:0 and stale:4 on
twitch FR at P=8, which recovered); the rule fires above 0.5 x and after 10.

When either fires, the following epochs exchange exactly (the schedule's own
state is dropped, so it starts afresh afterwards, as it does at epoch 0), the
job logs one line, and the metrics count those epochs in `guard_epochs`. The
first window is `window` epochs; each later firing doubles it, so a schedule
that keeps diverging ends up exact for most of the run. It is off for `exact`,
which has nothing to fall back to.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

GUARD_CHOICES = ("on", "off")


@dataclass
class GuardRule:
    """The thresholds: no healthy run of the schedule battery fires them (benchmarks/results/schedules-battery.md)."""

    rise: float = 0.50  # of the first epoch's loss (healthy battery runs rose to 0.36 of it: twitch P=8, stale:4)
    patience: int = 5
    collapse: float = 0.10
    collapse_patience: int = 10  # evaluations in a row (healthy battery runs dipped for at most 6)
    warmup: int = 10
    window: int = 10


@dataclass
class DivergenceGuard:
    """Decides, epoch by epoch, whether training exchanges exactly; the same decision on every rank.

    majority_rate: the level the watched validation figure collapses below: for node classification the share
    of the validation set's most common class, for link prediction an AUC of 0.5 (None: no collapse rule).
    metric, level_name: how the logged line names that figure and that level.
    """

    majority_rate: float | None = None
    metric: str = "validation accuracy"
    level_name: str = "the majority class's rate"
    rule: GuardRule = field(default_factory=GuardRule)
    exact_until: int = -1        # epochs below this train with exact exchanges
    recent: list = field(default_factory=list)  # the last `patience` training losses
    best_mean: float = math.inf  # the lowest mean of `patience` consecutive losses so far
    first_loss: float | None = None  # the scale of the loss: what the untrained model scored
    collapsed_in_a_row: int = 0  # evaluations below the majority rate (less the margin) in a row
    guard_epochs: int = 0        # epochs trained exactly because the guard fired
    firings: int = 0

    def exact_now(self, epoch: int) -> bool:
        return epoch < self.exact_until

    def observe(self, epoch: int, loss: float, val_acc: float | None) -> str | None:
        """Note epoch's figures (val_acc None when the epoch was not evaluated); returns the line to log when
        the guard fires, else None."""
        guarded = self.exact_now(epoch)
        if self.first_loss is None:
            self.first_loss = loss
        if guarded:
            self.guard_epochs += 1
        self.recent = (self.recent + [loss])[-self.rule.patience:]
        mean = sum(self.recent) / len(self.recent) if len(self.recent) == self.rule.patience else None
        reason = None if guarded else self._reason(epoch, mean, val_acc)
        if mean is not None:
            self.best_mean = min(self.best_mean, mean)
        if reason is None:
            return None
        window = self.rule.window << self.firings
        self.firings += 1
        self.exact_until = epoch + 1 + window
        return (f"schedule guard: {reason}: exact exchanges for epochs {epoch + 1}-{self.exact_until - 1}, then the "
                f"schedule starts afresh (--schedule-guard off disables this)")

    def _reason(self, epoch: int, mean: float | None, val_acc: float | None) -> str | None:
        rule = self.rule
        if mean is not None and mean > self.best_mean + rule.rise * self.first_loss:
            return (f"the training loss of epochs {epoch - rule.patience + 1}-{epoch} averaged {mean:.4f}, "
                    f"{mean - self.best_mean:.4f} above its best {rule.patience}-epoch average {self.best_mean:.4f} "
                    f"(more than {rule.rise:g} x the first epoch's loss)")
        if val_acc is not None and self.majority_rate is not None:
            below = epoch >= rule.warmup and val_acc < self.majority_rate - rule.collapse
            self.collapsed_in_a_row = self.collapsed_in_a_row + 1 if below else 0
            if self.collapsed_in_a_row >= rule.collapse_patience:
                self.collapsed_in_a_row = 0
                return (f"{self.metric} stayed over {rule.collapse:g} below {self.level_name} "
                        f"{self.majority_rate:.4f} for {rule.collapse_patience} evaluations ({val_acc:.4f} at epoch "
                        f"{epoch})")
        return None

    def state_dict(self) -> dict:
        return {"exact_until": self.exact_until, "recent": list(self.recent), "best_mean": self.best_mean,
                "first_loss": self.first_loss, "collapsed_in_a_row": self.collapsed_in_a_row,
                "guard_epochs": self.guard_epochs, "firings": self.firings}

    def load_state_dict(self, saved: dict) -> None:
        for key, value in saved.items():
            setattr(self, key, list(value) if key == "recent" else value)
