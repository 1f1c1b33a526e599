"""`PersonaTrackingCallback`: history of the evaluations on all distributions, figures and the final table.

Evaluations run in the validation loop of the policy modules (cadence = `trainer.val_check_interval`; with
`num_sanity_val_steps: -1` the sanity pass is a full evaluation of the starting model, recorded as step 0). After each
evaluation this callback records `pl_module.last_eval`, draws persona shares over steps per distribution (TensorBoard
figure `val/persona_shares` and `persona_shares.png`), and at the end of fit writes `<name>_table.json` / `.md`:
distribution x {accuracy, refusal, dominant persona and its share}, before and after. With `theory_overlay`, the
Proposition 2.1 softmax flow, started from the measured initial shares and per-persona rewards on the training
distributions, is fitted (one time scale) to the measured shares and overlaid (`rl/theory_overlay`).
"""
from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np
from lightning.pytorch import Callback, LightningModule, Trainer

from lightning_modules.policy.mixture_metrics import persona_rewards


def evaluation_step(pl_module: LightningModule) -> int:
    """The step an evaluation is recorded at: the RL step of an RL module, else the global step."""
    return int(pl_module.rl_step) if hasattr(pl_module, "rl_step") else int(pl_module.global_step)


def tracking_dir(explicit: Optional[str], trainer: Trainer) -> str:
    """Where a tracking callback writes: `explicit`, else the logger's log_dir, else trainer.default_root_dir
    (created)."""
    d = explicit or getattr(trainer.logger, "log_dir", None) or trainer.default_root_dir
    os.makedirs(d, exist_ok=True)
    return d


class PersonaTrackingCallback(Callback):
    """Track persona shares, accuracy and refusal on every distribution over RL steps.

    Args:
        output_dir: where tables and figures go (default: the logger's log_dir, else trainer.default_root_dir).
        name: file name prefix of the table.
        theory_overlay: fit the Proposition 2.1 softmax flow to the measured persona shares and overlay it.
        figure_every_eval: redraw the TensorBoard figure after every evaluation (else only at the end).
    """

    def __init__(self, output_dir: Optional[str] = None, name: str = "mixture", theory_overlay: bool = True,
                 figure_every_eval: bool = False):
        super().__init__()
        self.output_dir = output_dir
        self.name = name
        self.theory_overlay = theory_overlay
        self.figure_every_eval = figure_every_eval
        self.history: list[dict] = []
        self.theory: Optional[dict] = None

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        ev = getattr(pl_module, "last_eval", None)
        if ev is None:
            return
        step = 0 if ev["sanity"] else evaluation_step(pl_module)
        entry = {"step": step, "metrics": dict(ev["metrics"]), "counts": ev["counts"]}
        if self.history and self.history[-1]["step"] == step:
            self.history[-1] = entry
        else:
            self.history.append(entry)
        pl_module.last_eval = None
        if ev["sanity"] and trainer.logger is not None and trainer.is_global_zero:
            trainer.logger.log_metrics(ev["metrics"], step=0)  # Lightning drops what is logged in the sanity pass
        if self.figure_every_eval:
            self._log_figure(trainer, pl_module, "val/persona_shares", self.shares_figure(pl_module))

    # ------------------------------------------------------------------------------------------------ outputs
    def _dir(self, trainer: Trainer) -> str:
        return tracking_dir(self.output_dir, trainer)

    def _log_figure(self, trainer: Trainer, pl_module: LightningModule, tag: str, fig) -> None:
        if fig is None or not trainer.is_global_zero:
            return
        exp = getattr(trainer.logger, "experiment", None)
        if exp is not None and hasattr(exp, "add_figure"):
            exp.add_figure(tag, fig, global_step=evaluation_step(pl_module), close=False)
        fig.savefig(os.path.join(self._dir(trainer), tag.split("/")[-1] + ".png"), dpi=110)
        import matplotlib.pyplot as plt

        plt.close(fig)

    def shares_figure(self, pl_module: LightningModule, top: int = 4):
        if not self.history:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fam = pl_module.family
        steps = [h["step"] for h in self.history]
        D = len(fam.distributions)
        fig, axes = plt.subplots(1, D, figsize=(3.2 * D, 3.0), sharey=True, squeeze=False)
        for i, dist in enumerate(fam.distributions):
            ax = axes[0, i]
            shares = np.array([[h["metrics"][f"val/persona_share/{p}/{dist}"] for p in fam.personas] for h in self.history])
            for k in np.argsort(-shares.max(0))[:top]:
                ax.plot(steps, shares[:, k], marker=".", label=fam.personas[k])
            ax.plot(steps, [h["metrics"][f"val/acc/{dist}"] for h in self.history], "k--", label="accuracy")
            trained = dist in getattr(pl_module, "train_dist_indices_names", [])
            ax.set_title(f"{dist}{' (trained)' if trained else ''}")
            ax.set_xlabel("RL step")
            ax.legend(fontsize=6)
        axes[0, 0].set_ylabel("share of completions")
        fig.tight_layout()
        return fig

    def final_table(self, pl_module: LightningModule) -> dict:
        fam = pl_module.family
        trained = set(getattr(pl_module, "train_dist_indices_names", []))
        first, last = self.history[0], self.history[-1]
        rows = []
        for dist in fam.distributions:
            row = {"distribution": dist, "trained": dist in trained}
            for tag, h in (("before", first), ("after", last)):
                m = h["metrics"]
                shares = {p: m[f"val/persona_share/{p}/{dist}"] for p in fam.personas}
                top = max(shares, key=shares.get)
                row.update({f"acc_{tag}": m[f"val/acc/{dist}"], f"refusal_{tag}": m[f"val/refusal/{dist}"],
                            f"malformed_{tag}": m[f"val/malformed/{dist}"], f"dominant_{tag}": top,
                            f"dominant_share_{tag}": shares[top]})
            rows.append(row)
        return {"steps": [first["step"], last["step"]], "n_per_distribution": int(last["counts"]["n"].max()),
                "rows": rows, "theory": self.theory}

    @staticmethod
    def markdown(table: dict) -> str:
        lines = [f"Steps {table['steps'][0]} -> {table['steps'][1]}, n = {table['n_per_distribution']} per distribution.", "",
                 "| distribution | trained | acc before | acc after | refusal before | refusal after | dominant before | dominant after |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in table["rows"]:
            lines.append(
                f"| {r['distribution']} | {'yes' if r['trained'] else 'no'} | {r['acc_before']:.2f} | {r['acc_after']:.2f} | "
                f"{r['refusal_before']:.2f} | {r['refusal_after']:.2f} | {r['dominant_before']} ({r['dominant_share_before']:.2f}) | "
                f"{r['dominant_after']} ({r['dominant_share_after']:.2f}) |"
            )
        if table.get("theory"):
            t = table["theory"]
            lines += ["", f"Theory (Prop. 2.1 softmax flow from measured R_i and w_i(0), fitted c = {t['scale']:.3g} flow-time "
                      f"per step): RMSE of persona shares {t['rmse']:.3f}; predicted winner {t['predicted_winner']}, "
                      f"measured winner {t['measured_winner']}."]
        return "\n".join(lines) + "\n"

    @staticmethod
    def history_markdown(table: dict) -> str:
        """One row per evaluation: accuracy and refusal per distribution, the share of the persona that dominates
        each distribution at the end, and the largest malformed rate."""
        dists = [r["distribution"] for r in table["rows"]]
        winner = {r["distribution"]: r["dominant_after"] for r in table["rows"]}
        cols = ([(f"acc {d}", f"val/acc/{d}") for d in dists] + [(f"refusal {d}", f"val/refusal/{d}") for d in dists]
                + [(f"{winner[d]} share {d}", f"val/persona_share/{winner[d]}/{d}") for d in dists])
        lines = ["| step | " + " | ".join(c for c, _ in cols) + " | malformed (max) |",
                 "|---" * (len(cols) + 2) + "|"]
        for h in table["history"]:
            m = h["metrics"]
            malformed = max(m[f"val/malformed/{d}"] for d in dists)
            lines.append(f"| {h['step']} | " + " | ".join(f"{m[k]:.2f}" for _, k in cols) + f" | {malformed:.2f} |")
        return "\n".join(lines) + "\n"

    def fit_theory(self, pl_module: LightningModule):
        from analysis.mixture_flows import fit_time_scale, overlay_figure

        idx = list(getattr(pl_module, "train_dist_indices", []))
        if len(self.history) < 2 or not idx:
            return None
        fam = pl_module.family
        R, w0 = persona_rewards(self.history[0]["counts"], idx)
        w0 = (w0.numpy() + 1e-4)
        w0 = w0 / w0.sum()
        measured = []
        for h in self.history:
            c = h["counts"]["persona_counts"][idx].sum(0)[:-1].numpy()
            measured.append(c / max(c.sum(), 1.0))
        steps = [h["step"] for h in self.history]
        fit = fit_time_scale(R.numpy(), w0, steps, np.array(measured))
        self.theory = {"scale": fit["scale"], "rmse": fit["rmse"], "R": dict(zip(fam.personas, R.tolist())),
                       "w0": dict(zip(fam.personas, w0.tolist())),
                       "predicted_winner": fam.personas[int(np.argmax(fit["predicted"][-1]))],
                       "measured_winner": fam.personas[int(np.argmax(measured[-1]))]}
        return overlay_figure(steps, np.array(measured), R.numpy(), w0, fit["scale"], fam.personas)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.history or not trainer.is_global_zero:
            return
        if self.theory_overlay:
            self._log_figure(trainer, pl_module, "rl/theory_overlay", self.fit_theory(pl_module))
        self._log_figure(trainer, pl_module, "val/persona_shares", self.shares_figure(pl_module))
        table = self.final_table(pl_module)
        table["history"] = [{"step": h["step"], "metrics": h["metrics"]} for h in self.history]
        d = self._dir(trainer)
        with open(os.path.join(d, f"{self.name}_table.json"), "w") as f:
            json.dump(table, f, indent=1)
        with open(os.path.join(d, f"{self.name}_table.md"), "w") as f:
            f.write(self.markdown(table) + "\n" + self.history_markdown(table))
