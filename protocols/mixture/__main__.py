"""`python -m protocols.mixture`: the command line of protocols/mixture/protocol.py (one `error:` line on failure)."""
from protocols.engine.refusals import run_main
from protocols.mixture.protocol import main

run_main(main, exit_code=lambda code: code)
