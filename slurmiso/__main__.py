"""`python -m slurmiso` is the same as the `slurmiso` command."""

from slurmiso.cli.main import main

raise SystemExit(main())
