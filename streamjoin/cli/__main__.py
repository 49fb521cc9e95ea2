"""`python -m streamjoin.cli`: the CLI as the launcher and the tests start it, without the
console script on PATH."""

from streamjoin.cli import app

app()
