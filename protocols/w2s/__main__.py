"""`python -m protocols.w2s`: the command line of protocols/w2s/protocol.py (one `error:` line on failure)."""
from protocols.engine.refusals import run_main
from protocols.w2s.protocol import main

run_main(main)
