"""Part A's protocol: weak teacher -> soft labels -> students -> ID/OOD tests -> published tables
(`python -m protocols.w2s`, docs/w2s.md). protocol.py is the command; the stage plan, fits and reports beside it."""
