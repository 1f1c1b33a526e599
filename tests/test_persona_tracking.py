"""PersonaTrackingCallback's tables on a literal history: the numbers the docs quote are these renderings."""
from callbacks.persona_tracking import PersonaTrackingCallback


def _metrics(acc_a, acc_b, alice_a, alice_b, malformed_b):
    m = {"val/acc/A": acc_a, "val/acc/B": acc_b, "val/refusal/A": 1 - acc_a, "val/refusal/B": 0.5,
         "val/malformed/A": 0.0, "val/malformed/B": malformed_b,
         "val/persona_share/Alice/A": alice_a, "val/persona_share/Bob/A": 1 - alice_a,
         "val/persona_share/Alice/B": alice_b, "val/persona_share/Bob/B": 1 - alice_b}
    return m


def test_history_table_follows_the_final_winner_of_each_distribution():
    table = {"rows": [{"distribution": "A", "dominant_after": "Alice"}, {"distribution": "B", "dominant_after": "Bob"}],
             "history": [{"step": 0, "metrics": _metrics(0.4, 0.3, 0.5, 0.45, 0.02)},
                         {"step": 25, "metrics": _metrics(0.8, 0.1, 0.9, 0.2, 0.125)}]}
    assert PersonaTrackingCallback.history_markdown(table).splitlines() == [
        "| step | acc A | acc B | refusal A | refusal B | Alice share A | Bob share B | malformed (max) |",
        "|---|---|---|---|---|---|---|---|",
        "| 0 | 0.40 | 0.30 | 0.60 | 0.50 | 0.50 | 0.55 | 0.02 |",
        "| 25 | 0.80 | 0.10 | 0.20 | 0.50 | 0.90 | 0.80 | 0.12 |",
    ]
