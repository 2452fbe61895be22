"""`python -m deepinfer.engine ...` runs the `deepinfer` CLI."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
