from .cli import main

raise SystemExit(main(prog="python -m hatch_precompile"))
